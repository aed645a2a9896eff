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

from pipeline.coordinator import coordinator as gc
from pipeline.requests.txn_apis import TransactionApis
from tests.coordinator.test_service_trio import coordinator, nested, patient_clock  # noqa: F401 (a fixture)

pytestmark = pytest.mark.trio

UNSTABLE_OFFSET_COMMIT, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH = 88, 90, 47


async def _stable(c, group: str, require_stable: bool) -> dict[tuple[str, int], tuple[int, int]]:
    r = await c.call("offset_fetch", 8, require_stable=require_stable, groups=(
        nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id=group, topics=(
            nested("offset_fetch", 8, "OffsetFetchRequestTopics", name="t", partition_indexes=(0,)),)),))
    return {(t.name, int(p.partition_index)): (int(p.committed_offset), int(p.error_code))
            for t in r.groups[0].topics for p in t.partitions}


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
        committed = await c.call("txn_offset_commit", 3, transactional_id="app", group_id="g", producer_id=pid,
                                 producer_epoch=0, generation_id=-1, member_id="", group_instance_id=None, topics=(
                                     nested("txn_offset_commit", 3, "TxnOffsetCommitRequestTopic", name="t",
                                            partitions=(nested("txn_offset_commit", 3,
                                                               "TxnOffsetCommitRequestPartition", partition_index=0,
                                                               committed_offset=5, committed_leader_epoch=-1,
                                                               committed_metadata=None),)),))
        assert [int(p.error_code) for t in committed.topics for p in t.partitions] == [0]
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
