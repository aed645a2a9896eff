"""The transaction coordinator's apis in-process (issue 22): KafkaChannel -> RequestHandler -> KafkaApis ->
TransactionApis, with the group coordinator beside it and real SQLite stores in tmp_path.

What the end-to-end story (tests/e2e/test_transactions.py) does not pin down request by request:
the fenced error by request version (KIP-588), TxnOffsetCommit offsets staying out of OffsetFetch
until the commit and a read_committed OffsetFetch answered UNSTABLE_OFFSET_COMMIT meanwhile (KIP-447),
the coordinator's state read back by a new service, FindCoordinator naming this broker.
"""

from __future__ import annotations

import datetime

import pytest
import trio
import trio.testing
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.coordinator import coordinator as gc
from pipeline.requests.txn_apis import TransactionApis
from tests.coordinator.test_service_trio import GroupClient, coordinator, nested, patient_clock, req  # noqa: F401 (a fixture)
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import eventually

pytestmark = pytest.mark.trio

UNSTABLE_OFFSET_COMMIT, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH = 88, 90, 47
INVALID_TXN_STATE = 48


async def _stable(c, group: str, require_stable: bool) -> dict[tuple[str, int], tuple[int, int]]:
    r = await c.call("offset_fetch", 8, require_stable=require_stable, groups=(
        nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id=group, topics=(
            nested("offset_fetch", 8, "OffsetFetchRequestTopics", name="t", partition_indexes=(0,)),)),))
    return {(t.name, int(p.partition_index)): (int(p.committed_offset), int(p.error_code))
            for t in r.groups[0].topics for p in t.partitions}


async def _txn_offset_commit(c: GroupClient, pid: int, offset: int, generation: int = -1, member_id: str = "",
                             instance_id: str | None = None, version: int = 3) -> int:
    """TxnOffsetCommit of "app" (epoch 0) for group "g": ``offset`` of "t"-0, with that group metadata;
    the partition's error code."""
    r = await c.call("txn_offset_commit", version, transactional_id="app", group_id="g", producer_id=pid,
                     producer_epoch=0, generation_id=generation, member_id=member_id, group_instance_id=instance_id,
                     topics=(nested("txn_offset_commit", version, "TxnOffsetCommitRequestTopic", name="t",
                                    partitions=(nested("txn_offset_commit", version, "TxnOffsetCommitRequestPartition",
                                                       partition_index=0, committed_offset=offset,
                                                       committed_leader_epoch=-1, committed_metadata=None),)),))
    [code] = [int(p.error_code) for t in r.topics for p in t.partitions]
    return code


async def test_a_transaction_commits_its_offsets_only_at_its_end(patient_clock, tmp_path):  # noqa: F811
    async with coordinator(tmp_path) as (b, groups, connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        c = await connect()
        found = await c.call("find_coordinator", 4, key_type=1, coordinator_keys=("app",))
        assert [(int(x.error_code), x.node_id) for x in found.coordinators] == [(gc.NONE, 0)]
        timeout = datetime.timedelta(seconds=60)
        init = await c.call("init_producer_id", 5, transactional_id="app", transaction_timeout=timeout,
                            producer_id=-1, producer_epoch=-1)
        assert int(init.error_code) == 0 and int(init.producer_epoch) == 0
        pid = int(init.producer_id)
        added = await c.call("add_partitions_to_txn", 3, v3_and_below_transactional_id="app",
                             v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0, v3_and_below_topics=(
                                 nested("add_partitions_to_txn", 3, "AddPartitionsToTxnTopic", name="t",
                                        partitions=(0, 1)),))
        assert [int(p.partition_error_code) for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition] == [0, 0]
        assert int((await c.call("add_offsets_to_txn", 3, transactional_id="app", producer_id=pid,
                                 producer_epoch=0, group_id="g")).error_code) == 0
        assert await _txn_offset_commit(c, pid, 5) == 0
        # Pending: a read_committed consumer is told to retry, a read_uncommitted one sees nothing yet.
        assert await _stable(c, "g", True) == {("t", 0): (-1, UNSTABLE_OFFSET_COMMIT)}
        assert await _stable(c, "g", False) == {("t", 0): (-1, 0)}
        described = await c.call("describe_transactions", 0, transactional_ids=("app", "nope"))
        states = {s.transactional_id: (int(s.error_code), s.transaction_state) for s in described.transaction_states}
        assert states == {"app": (0, "Ongoing"), "nope": (105, "")}  # 105: TRANSACTIONAL_ID_NOT_FOUND
        # The old-version and new-version answers to a fenced producer (KIP-588).
        ended = await c.call("end_txn", 3, transactional_id="app", producer_id=pid, producer_epoch=0, committed=True)
        assert int(ended.error_code) == 0
        assert await _stable(c, "g", True) == {("t", 0): (5, 0)}
        assert int((await c.call("end_txn", 3, transactional_id="app", producer_id=pid, producer_epoch=0,
                                 committed=True)).error_code) == 0  # a retry
        init = await c.call("init_producer_id", 5, transactional_id="app", transaction_timeout=timeout,
                            producer_id=-1, producer_epoch=-1)
        assert (int(init.producer_id), int(init.producer_epoch)) == (pid, 1)
        for version, expected in ((1, INVALID_PRODUCER_EPOCH), (2, PRODUCER_FENCED)):
            r = await c.call("add_offsets_to_txn", version, transactional_id="app", producer_id=pid,
                             producer_epoch=0, group_id="g")
            assert int(r.error_code) == expected
        listed = await c.call("list_transactions", 0, state_filters=(), producer_id_filters=())
        assert [(s.transactional_id, s.transaction_state) for s in listed.transaction_states] == [("app", "Empty")]
        # v1's duration filter (KIP-994): a transaction that began within the filter is left out (one older
        # than it is kept: tests/e2e/test_transaction_admin.py); a negative filter keeps all; one not
        # ongoing (no start) passes any filter.
        init = await c.call("init_producer_id", 5, transactional_id="young", transaction_timeout=timeout,
                            producer_id=-1, producer_epoch=-1)
        young = int(init.producer_id)
        await c.call("add_partitions_to_txn", 3, v3_and_below_transactional_id="young",
                     v3_and_below_producer_id=young, v3_and_below_producer_epoch=0, v3_and_below_topics=(
                         nested("add_partitions_to_txn", 3, "AddPartitionsToTxnTopic", name="t", partitions=(0,)),))

        async def listed_with(duration_ms: int) -> list[tuple[str, str]]:
            r = await c.call("list_transactions", 1, state_filters=(), producer_id_filters=(),
                             duration_filter=duration_ms)
            return sorted((s.transactional_id, s.transaction_state) for s in r.transaction_states)

        assert await listed_with(-1) == [("app", "Empty"), ("young", "Ongoing")]
        assert await listed_with(3_600_000) == [("app", "Empty")]
        txn.close()
    # A new coordinator on the same store: the id, its producer id and epoch are back.
    async with coordinator(tmp_path) as (b, groups, connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        meta = txn.state.get("app")
        assert meta is not None and (meta.producer_id, meta.producer_epoch, meta.state.value) == (pid, 1, "Empty")
        txn.close()


UNKNOWN_TOPIC_OR_PARTITION = 3


def _markers(producer_id: int, epoch: int, topic: str, partition: int) -> tuple:
    return (nested("write_txn_markers", 1, "WritableTxnMarker", producer_id=producer_id, producer_epoch=epoch,
                   transaction_result=False, coordinator_epoch=-1, topics=(
                       nested("write_txn_markers", 1, "WritableTxnMarkerTopic", name=topic,
                              partition_indexes=(partition,)),)),)


async def test_write_txn_markers_sets_the_producers_epoch_and_refuses_an_older_one(patient_clock, tmp_path):  # noqa: F811
    """The admin abort's WriteTxnMarkers (KIP-664): an ABORT marker is appended and becomes the producer's
    epoch on the partition (DescribeProducers shows it, with no open transaction); an older epoch is
    refused (INVALID_PRODUCER_EPOCH), an unknown partition too."""
    async with coordinator(tmp_path) as (b, groups, connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        c = await connect()
        b.apis.catalog.describe("m", auto_create=True)  # one partition, as Metadata auto-creates it

        async def write(epoch: int, topic: str = "m", partition: int = 0) -> int:
            r = await c.call("write_txn_markers", 1, markers=_markers(77, epoch, topic, partition))
            return int(r.markers[0].topics[0].partitions[0].error_code)

        assert await write(5) == 0
        assert await write(3) == INVALID_PRODUCER_EPOCH
        assert await write(5, partition=1) == UNKNOWN_TOPIC_OR_PARTITION
        assert await write(5, topic="nope") == UNKNOWN_TOPIC_OR_PARTITION
        described = await c.call("describe_producers", 0, topics=(
            nested("describe_producers", 0, "TopicRequest", name="m", partition_indexes=(0, 4)),))
        [(ok, unknown)] = [t.partitions for t in described.topics]
        assert int(unknown.error_code) == UNKNOWN_TOPIC_OR_PARTITION
        assert [(int(p.producer_id), int(p.producer_epoch), int(p.last_sequence), int(p.current_txn_start_offset))
                for p in ok.active_producers] == [(77, 5, -1, -1)]
        assert b.apis.logs.log_end_offset("m", 0) == 1  # the one marker written
        txn.close()


async def _transaction(c: GroupClient, tid: str, topic: str, partition: int, group: str | None = None) -> int:
    """InitProducerId, AddPartitionsToTxn of ``topic``-``partition`` (and AddOffsetsToTxn of ``group``):
    the producer id, at epoch 0, with a transaction ongoing."""
    init = await c.call("init_producer_id", 5, transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60),
                        producer_id=-1, producer_epoch=-1)
    assert int(init.error_code) == 0 and int(init.producer_epoch) == 0
    pid = int(init.producer_id)
    added = await c.call("add_partitions_to_txn", 3, v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                         v3_and_below_producer_epoch=0, v3_and_below_topics=(
                             nested("add_partitions_to_txn", 3, "AddPartitionsToTxnTopic", name=topic,
                                    partitions=(partition,)),))
    assert [int(p.partition_error_code) for t in added.results_by_topic_v3_and_below for p in t.results_by_partition] == [0]
    if group is not None:
        assert int((await c.call("add_offsets_to_txn", 3, transactional_id=tid, producer_id=pid, producer_epoch=0,
                                 group_id=group)).error_code) == 0
    return pid


async def test_txn_offset_commit_is_fenced_by_the_groups_generation_and_member(patient_clock, tmp_path):  # noqa: F811
    """KIP-447: TxnOffsetCommit v3 carries the consumer's group metadata, checked as Kafka's group
    coordinator checks it (``validateOffsetCommit``): the current member and generation commit; a
    zombie whose group rebalanced since (an older generation) gets ILLEGAL_GENERATION, a member the
    group does not know UNKNOWN_MEMBER_ID, a static member whose instance id another member holds
    FENCED_INSTANCE_ID; nothing of a refused request reaches the transaction. v2, with no group
    metadata, is not checked."""
    async with coordinator(tmp_path) as (b, groups, connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        c, member = await connect(), await connect()
        joined = await member.response(await member.send_join("g", instance_id="static-1"))  # static: no KIP-394 trip
        assert int(joined.error_code) == 0 and joined.generation_id == 1
        assert int((await member.sync("g", 1, joined.member_id, {joined.member_id: b""})).error_code) == 0
        pid = await _transaction(c, "app", "t", 0, group="g")

        def commit(offset: int, generation: int, member_id: str, instance_id: str | None = None, version: int = 3):
            return _txn_offset_commit(c, pid, offset, generation, member_id, instance_id, version)

        assert await commit(5, 1, joined.member_id, "static-1") == 0
        # The member's group rebalances (its leader joins again): generation 2. What the producer took
        # from the consumer before is a zombie's now.
        rejoined = await member.response(await member.send_join("g", joined.member_id, instance_id="static-1"))
        assert int(rejoined.error_code) == 0 and rejoined.generation_id == 2
        assert await commit(6, 1, joined.member_id, "static-1") == gc.ILLEGAL_GENERATION
        assert await commit(6, 2, "someone-else") == gc.UNKNOWN_MEMBER_ID
        assert await commit(6, 2, "someone-else", "static-1") == gc.FENCED_INSTANCE_ID
        assert await commit(6, 2, joined.member_id, "static-2") == gc.UNKNOWN_MEMBER_ID
        assert await commit(7, -1, "", version=2) == 0  # no group metadata: a pre-KIP-447 producer
        assert txn.pending["app"]["g"][("t", 0)][0] == 7  # the refused offsets are not in the transaction
        assert await commit(8, 2, joined.member_id, "static-1") == 0
        assert txn.pending["app"]["g"][("t", 0)][0] == 8
        txn.close()


def _transactional_batch(producer_id: int, values: list[bytes]) -> bytes:
    """A RecordBatch of a transaction (epoch 0, sequence 0)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
                                        producer_epoch=0, base_sequence=0, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


async def test_a_transactional_produce_delayed_past_its_end_txn_is_refused_and_leaves_no_hanging_transaction(
        patient_clock, tmp_path):  # noqa: F811
    """KIP-890 part 1: a transactional batch is checked against its transaction where it is appended,
    not only when it arrives. Here it waits for persister memory (``buffer.memory`` full while the
    table write is held) while the producer's EndTxn commits; checked again once memory is free, it
    is refused INVALID_TXN_STATE. Appended, it would follow the COMMIT marker with no transaction
    open to end it: a hanging transaction pinning the last stable offset (DescribeProducers would
    show its start offset)."""
    async with coordinator(tmp_path, max_buffer_bytes=1) as (b, groups, _connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)

        async def connect(other_than: int | None = None) -> tuple[GroupClient, int]:
            while True:  # a connection on another handler's queue than ``other_than``'s
                client, channel = await b.connect()
                queue = b.request_channel.queue_index(channel.connection_id)
                if queue != other_than:
                    return GroupClient(client), queue

        producer, queue = await connect()
        coordinator_client, _ = await connect(other_than=queue)
        pid = await _transaction(coordinator_client, "app", "t", 0)

        def produce(partition: int, records: bytes, transactional_id: str | None = None) -> object:
            return req("produce", 9, transactional_id=transactional_id, acks=-1, timeout=datetime.timedelta(seconds=30),
                       topic_data=(nested("produce", 9, "TopicProduceData", name="t", partition_data=(
                           nested("produce", 9, "PartitionProduceData", index=partition, records=records),)),))

        def error(answer) -> int:
            [code] = [int(p.error_code) for t in answer.responses for p in t.partition_responses]
            return code

        # buffer.memory full: a record (another partition) acknowledged from the WAL, its table write held
        b.sink.hold()
        filler = await producer.response(await producer.send("produce", 9, produce(1, rc.record_batch([b"x"]))))
        assert error(filler) == 0
        await eventually(lambda: b.sink.writes_started == 1)
        produced = await producer.send("produce", 9, produce(0, _transactional_batch(pid, [b"late"]), "app"))
        await trio.testing.wait_all_tasks_blocked()
        assert not producer.answered(produced)  # checked against the transaction, waiting for memory
        ended = await coordinator_client.call("end_txn", 3, transactional_id="app", producer_id=pid, producer_epoch=0,
                                              committed=True)
        assert int(ended.error_code) == 0
        b.sink.resume()
        assert error(await producer.response(produced)) == INVALID_TXN_STATE
        assert b.apis.logs.log_end_offset("t", 0) == 1  # the COMMIT marker alone
        described = await coordinator_client.call("describe_producers", 0, topics=(
            nested("describe_producers", 0, "TopicRequest", name="t", partition_indexes=(0,)),))
        [[partition]] = [t.partitions for t in described.topics]
        assert [(int(p.producer_id), int(p.current_txn_start_offset)) for p in partition.active_producers] == [(pid, -1)]
        txn.close()


async def test_a_transactions_end_is_retried_through_failed_writes_until_it_completes(patient_clock, tmp_path):  # noqa: F811
    """Kafka retries a transaction's end until it is written (TransactionMarkerChannelManager): here
    the database writes of an EndTxn fail once each, injected (the stored PrepareCommit, the group's
    offsets, the stored CompleteCommit: a metadata database out of reach for a moment). Each is tried
    again after a backoff, without a restart, and EndTxn is answered NONE once the transaction is
    complete: one COMMIT marker per attempt that reached the log (a second changes nothing), the
    offsets the group's, the state CompleteCommit, stored (a new coordinator on the store reads it)."""
    import sqlite3

    from pipeline.coordinator.txn_store import TransactionStore

    async with coordinator(tmp_path) as (b, groups, connect):
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        c = await connect()
        pid = await _transaction(c, "app", "t", 0, group="g")
        assert await _txn_offset_commit(c, pid, 5) == 0

        failed: list[str] = []
        store = txn._store
        assert store is not None
        save, commit_offsets = store.save, groups.commit_offsets

        def failing_save(meta, *args):
            if meta.state.value not in {f for f in failed if f != "offsets"}:
                failed.append(meta.state.value)
                raise sqlite3.OperationalError("injected: the database is locked")
            return save(meta, *args)

        async def failing_commit_offsets(group_id, offsets):
            if "offsets" not in failed:
                failed.append("offsets")
                return False
            return await commit_offsets(group_id, offsets)

        store.save = failing_save  # type: ignore[method-assign]
        groups.commit_offsets = failing_commit_offsets  # type: ignore[method-assign]
        ended = await c.call("end_txn", 3, transactional_id="app", producer_id=pid, producer_epoch=0, committed=True)
        assert int(ended.error_code) == 0
        assert failed == ["PrepareCommit", "offsets", "CompleteCommit"]
        assert await _stable(c, "g", True) == {("t", 0): (5, 0)}
        assert b.apis.logs.log_end_offset("t", 0) == 2  # the markers of the two attempts that wrote one
        meta = txn.state.get("app")
        assert meta is not None and meta.state.value == "CompleteCommit"
        txn.close()
    reread = TransactionStore(tmp_path / "transactions.db")
    try:
        metas, _pending = reread.load()
        assert [(m.transactional_id, m.state.value) for m in metas] == [("app", "CompleteCommit")]
    finally:
        reread.close()
