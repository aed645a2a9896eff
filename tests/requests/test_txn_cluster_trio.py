"""Transactions across two brokers of a static cluster, in-process (issue 35): each broker's middle as
``Server.serve`` wires it (``tests.requests.test_handler_trio.broker``), its own WAL, the group and
transaction stores shared in tmp_path as ``serve --brokers N`` shares them.

The transactional id is coordinated by broker 0, the group by broker 1, and "t"'s two partitions are
led one by each: the coordinator writes the marker of its own partition and queues the other's and
the group's offsets in the store (Kafka sends WriteTxnMarkers); the leader that does not coordinate
the transaction verifies its first transactional produce against the stored state (KIP-890 part 1)
and refuses one for a partition outside the transaction or after its end.
"""

from __future__ import annotations

import datetime
import zlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.cluster.membership import Cluster, ClusterBroker
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.coordinator.coordinator import GroupConfig
from pipeline.requests.txn_apis import TransactionApis
from tests.coordinator.test_service_trio import GroupClient, nested, patient_clock, req  # noqa: F401 (a fixture)
from tests.requests.test_handler_trio import broker

pytestmark = pytest.mark.trio

NOT_COORDINATOR, INVALID_TXN_STATE = 16, 48
BROKERS = (ClusterBroker(0, "127.0.0.1", 9092), ClusterBroker(1, "127.0.0.1", 9093))


def _coordinated_by(node: int, prefix: str) -> str:
    """The first ``prefix-k`` the static rule (crc32 % 2) places on ``node``."""
    return next(f"{prefix}-{k}" for k in range(100) if zlib.crc32(f"{prefix}-{k}".encode()) % 2 == node)


def _leader(topic: str, partition: int) -> int:
    return (zlib.crc32(topic.encode()) + partition) % 2


def _batch(producer_id: int, values: list[bytes], epoch: int = 0, base_sequence: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=base_sequence, batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    return bytes(builder.build())


def _produce(tid: str, partition: int, records: bytes) -> object:
    return req("produce", 9, transactional_id=tid, acks=-1, timeout=datetime.timedelta(seconds=30),
               topic_data=(nested("produce", 9, "TopicProduceData", name="t", partition_data=(
                   nested("produce", 9, "PartitionProduceData", index=partition, records=records),)),))


async def _send(c: GroupClient, produce: object):
    return await c.response(await c.send("produce", 9, produce))


def _error(answer) -> int:
    [code] = [int(p.error_code) for t in answer.responses for p in t.partition_responses]
    return code


async def _offsets(c: GroupClient, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    r = await c.call("offset_fetch", 8, require_stable=True, groups=(
        nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id=group, topics=(
            nested("offset_fetch", 8, "OffsetFetchRequestTopics", name="t", partition_indexes=(0,)),)),))
    return {(t.name, int(p.partition_index)): (int(p.committed_offset), int(p.error_code))
            for t in r.groups[0].topics for p in t.partitions}


async def _begin(coordinator: GroupClient, tid: str, partition: int) -> int:
    """InitProducerId for ``tid``, then "t"-``partition`` added to its transaction; the producer id."""
    init = await coordinator.call("init_producer_id", 5, transactional_id=tid,
                                  transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
    pid = int(init.producer_id)
    added = await coordinator.call("add_partitions_to_txn", 3, v3_and_below_transactional_id=tid,
                                   v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
                                   v3_and_below_topics=(nested("add_partitions_to_txn", 3, "AddPartitionsToTxnTopic",
                                                               name="t", partitions=(partition,)),))
    assert {int(p.partition_error_code) for t in added.results_by_topic_v3_and_below
            for p in t.results_by_partition} == {0}
    return pid


@asynccontextmanager
async def two_brokers(tmp_path) -> AsyncIterator[tuple[list, list[GroupClient], list[TransactionApis]]]:
    """Brokers 0 and 1 of one static cluster, each with its group coordinator and transaction apis
    over the stores shared in tmp_path: (brokers, a client of each, their TransactionApis)."""
    async with AsyncExitStack() as stack:
        brokers: list = []
        clients: list[GroupClient] = []
        txns: list[TransactionApis] = []
        for node in (0, 1):
            b = await stack.enter_async_context(broker(tmp_path / f"b{node}", cluster=Cluster(BROKERS, node),
                                                       node_id=node))
            groups = GroupCoordinatorService(b.apis, GroupConfig(initial_rebalance_delay_ms=0), tmp_path / "groups.db")
            groups.register()
            await b.nursery.start(groups.run)
            stack.callback(groups.close)
            txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
            txn.register()
            await b.nursery.start(txn.run)
            stack.callback(txn.close)
            brokers.append(b)
            txns.append(txn)
            clients.append(GroupClient((await b.connect())[0]))
        yield brokers, clients, txns


async def test_a_transaction_spans_two_brokers_markers_and_offsets_reach_the_other_one(patient_clock, tmp_path):  # noqa: F811
    tid, group = _coordinated_by(0, "app"), _coordinated_by(1, "g")
    by_leader = {_leader("t", p): p for p in (0, 1)}
    assert set(by_leader) == {0, 1}  # "t"'s partitions: one led by each broker
    async with two_brokers(tmp_path) as (brokers, clients, txns):
        coordinator, other = clients

        # FindCoordinator from either broker names broker 0; broker 1 refuses the coordinator's requests.
        for c in clients:
            found = await c.call("find_coordinator", 4, key_type=1, coordinator_keys=(tid,))
            assert [(int(x.error_code), int(x.node_id), int(x.port)) for x in found.coordinators] == [(0, 0, 9092)]
        refused = await other.call("init_producer_id", 5, transactional_id=tid,
                                   transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1, producer_epoch=-1)
        assert int(refused.error_code) == NOT_COORDINATOR

        init = await coordinator.call("init_producer_id", 5, transactional_id=tid,
                                      transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                                      producer_epoch=-1)
        assert int(init.error_code) == 0
        pid = int(init.producer_id)
        # Broker 1 leads a partition not yet in the transaction: its first produce is verified against
        # the stored state and refused.
        remote, local = by_leader[1], by_leader[0]
        assert _error(await _send(other, _produce(tid, remote, _batch(pid, [b"early"])))) == \
            INVALID_TXN_STATE
        added = await coordinator.call("add_partitions_to_txn", 3, v3_and_below_transactional_id=tid,
                                       v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
                                       v3_and_below_topics=(nested("add_partitions_to_txn", 3,
                                                                   "AddPartitionsToTxnTopic", name="t",
                                                                   partitions=(0, 1)),))
        assert {int(p.partition_error_code) for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition} == {0}
        assert _error(await _send(other, _produce(tid, remote, _batch(pid, [b"r0", b"r1"])))) == 0
        assert _error(await _send(coordinator, _produce(tid, local, _batch(pid, [b"l0"])))) == 0
        assert int((await coordinator.call("add_offsets_to_txn", 3, transactional_id=tid, producer_id=pid,
                                           producer_epoch=0, group_id=group)).error_code) == 0
        # TxnOffsetCommit goes to the group's coordinator, broker 1 (broker 0 refuses it).
        commit_fields = dict(transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=0, generation_id=-1,
                             member_id="", group_instance_id=None, topics=(nested(
                                 "txn_offset_commit", 3, "TxnOffsetCommitRequestTopic", name="t", partitions=(nested(
                                     "txn_offset_commit", 3, "TxnOffsetCommitRequestPartition", partition_index=0,
                                     committed_offset=7, committed_leader_epoch=-1, committed_metadata=None),)),))
        for c, expected in ((coordinator, NOT_COORDINATOR), (other, 0)):
            answer = await c.call("txn_offset_commit", 3, **commit_fields)
            assert [int(p.error_code) for t in answer.topics for p in t.partitions] == [expected]
        assert await _offsets(other, group) == {("t", 0): (-1, 88)}  # UNSTABLE_OFFSET_COMMIT: pending

        ended = await coordinator.call("end_txn", 3, transactional_id=tid, producer_id=pid, producer_epoch=0,
                                       committed=True)
        assert int(ended.error_code) == 0
        # Answered once both partitions hold their COMMIT marker and the group its offsets.
        assert brokers[1].apis.logs.log_end_offset("t", remote) == 3
        assert brokers[0].apis.logs.log_end_offset("t", local) == 2
        assert await _offsets(other, group) == {("t", 0): (7, 0)}
        meta = txns[0].state.get(tid)
        assert meta is not None and meta.state.value == "CompleteCommit"
        # Broker 1 does not coordinate it: DescribeTransactions there is NOT_COORDINATOR.
        described = await other.call("describe_transactions", 0, transactional_ids=(tid,))
        assert [int(s.error_code) for s in described.transaction_states] == [NOT_COORDINATOR]
        # The transaction is over: a late batch of the same epoch at broker 1 is refused, not appended.
        late = _produce(tid, remote, _batch(pid, [b"late"], base_sequence=2))
        assert _error(await _send(other, late)) == INVALID_TXN_STATE
        assert brokers[1].apis.logs.log_end_offset("t", remote) == 3

        # An aborted transaction: its marker reaches broker 1 and its pending offsets there are dropped.
        added = await coordinator.call("add_partitions_to_txn", 3, v3_and_below_transactional_id=tid,
                                       v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
                                       v3_and_below_topics=(nested("add_partitions_to_txn", 3,
                                                                   "AddPartitionsToTxnTopic", name="t",
                                                                   partitions=(remote,)),))
        assert int((await coordinator.call("add_offsets_to_txn", 3, transactional_id=tid, producer_id=pid,
                                           producer_epoch=0, group_id=group)).error_code) == 0
        retry = _produce(tid, remote, _batch(pid, [b"aborted"], base_sequence=2))
        assert _error(await _send(other, retry)) == 0
        commit_fields["topics"] = (nested("txn_offset_commit", 3, "TxnOffsetCommitRequestTopic", name="t", partitions=(
            nested("txn_offset_commit", 3, "TxnOffsetCommitRequestPartition", partition_index=0, committed_offset=9,
                   committed_leader_epoch=-1, committed_metadata=None),)),)
        answer = await other.call("txn_offset_commit", 3, **commit_fields)
        assert [int(p.error_code) for t in answer.topics for p in t.partitions] == [0]
        ended = await coordinator.call("end_txn", 3, transactional_id=tid, producer_id=pid, producer_epoch=0,
                                       committed=False)
        assert int(ended.error_code) == 0
        assert brokers[1].apis.logs.log_end_offset("t", remote) == 5  # the record and its ABORT marker
        assert await _offsets(other, group) == {("t", 0): (7, 0)}  # not 9
        assert txns[1].pending == {}
        assert await trio.to_thread.run_sync(lambda: txns[0]._store.queued()) == []  # type: ignore[union-attr]


async def test_a_marker_during_a_leaders_verification_read_leaves_no_guard(patient_clock, tmp_path):  # noqa: F811
    """KIP-890's VerificationGuard at a leader that does not coordinate the transaction: the stored state
    it reads says Ongoing, but the transaction's marker lands on the partition while the read is under
    way. The guard being made is dropped: the batch is refused INVALID_TXN_STATE, and the sequencing
    point's check finds no guard, so nothing is appended after the marker (a hanging transaction)."""
    import threading

    tid = _coordinated_by(0, "app")
    remote = next(p for p in (0, 1) if _leader("t", p) == 1)
    async with two_brokers(tmp_path) as (_brokers, (coordinator, _other), txns):
        pid = await _begin(coordinator, tid, remote)
        leader = txns[1]
        store = leader._store
        assert store is not None
        read, entered, release = store.read, threading.Event(), threading.Event()

        def held_read(transactional_id):
            meta = read(transactional_id)  # Ongoing, with the partition
            entered.set()
            assert release.wait(30)
            return meta

        store.read = held_read  # type: ignore[method-assign]
        verdict: list[int] = []

        async def verify() -> None:
            verdict.append(await leader.verify_produce(tid, pid, 0, "t", remote))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(verify)
            await trio.to_thread.run_sync(entered.wait)
            commit = leader._append_markers([(pid, 0, False, "t", remote)])  # the transaction's ABORT lands
            assert commit is not None
            release.set()
        assert verdict == [INVALID_TXN_STATE]
        assert leader.check_produce(tid, pid, 0, "t", remote) == INVALID_TXN_STATE
        assert leader._verified == {} and leader._verifying == {}


async def test_a_coordinator_that_moves_loads_its_ids_answers_load_in_progress_meanwhile_and_is_fenced_after(
        patient_clock, tmp_path):  # noqa: F811
    """Leadership through the database, in-process: the transactional id's coordinator is the leader of its
    ``__consumer_offsets`` partition. While the broker takes that partition over, the id's requests are
    COORDINATOR_LOAD_IN_PROGRESS (Kafka's answer while it loads a ``__transaction_state`` partition); once
    loaded (``load_partitions``), the id is served, its state written to the leadership's database; once
    the partition moved on, a write of the old term is fenced (NOT_COORDINATOR), and the id is forgotten
    (``unload_partitions``)."""
    from pipeline.cluster.membership import OFFSETS_TOPIC, DynamicCluster, offsets_partition
    from pipeline.coordinator.txn_store import TransactionStore
    from pipeline.metadata.leadership import Leadership, LeadershipStore

    load_in_progress = 14
    tid = "moving-app"
    key = (OFFSETS_TOPIC, offsets_partition(tid))
    db = tmp_path / "cluster.db"
    store = LeadershipStore(db)
    epoch = store.registry.register(0, "incarnation-0", (("PLAINTEXT", "127.0.0.1", 9092),), 60_000)
    controller = store.claim_controller(0, epoch, 60_000)
    store.write_assignment(0, epoch, controller, {key: (0, True)})
    leader_epoch = store.assignment()[key].leader_epoch
    cluster = DynamicCluster(0, "127.0.0.1", 9092)
    cluster.member, cluster.leaders = True, {key: Leadership(0, leader_epoch)}

    def init() -> object:
        return req("init_producer_id", 5, transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60),
                   producer_id=-1, producer_epoch=-1)

    try:
        async with broker(tmp_path / "b0", cluster=cluster, node_id=0) as b:
            groups = GroupCoordinatorService(b.apis, GroupConfig(initial_rebalance_delay_ms=0), tmp_path / "groups.db")
            groups.register()
            await b.nursery.start(groups.run)
            txn = TransactionApis(b.apis, groups, db)
            txn.register()
            await b.nursery.start(txn.run)
            client = GroupClient((await b.connect())[0])
            assert int((await client.response(await client.send("init_producer_id", 5, init()))).error_code) == \
                load_in_progress
            await txn.load_partitions({key[1]: leader_epoch})
            cluster.loaded.add(key)
            answer = await client.response(await client.send("init_producer_id", 5, init()))
            assert int(answer.error_code) == 0
            reader = TransactionStore(db)  # another broker's view of the leadership's database
            assert reader.read(tid) is not None and reader.read(tid).producer_id == int(answer.producer_id)
            reader.close()
            # The partition moves to broker 1: this term's next write is fenced, then the id is unloaded.
            store.registry.register(1, "incarnation-1", (("PLAINTEXT", "127.0.0.1", 9093),), 60_000)
            store.write_assignment(0, epoch, controller, {key: (1, True)})
            again = await client.response(await client.send("init_producer_id", 5, init()))
            assert int(again.error_code) == NOT_COORDINATOR
            txn.unload_partitions({key[1]})
            cluster.loaded.discard(key)
            assert txn.state.get(tid) is None
            txn.close()
            groups.close()
    finally:
        store.close()


async def test_a_coordinator_ending_a_transaction_carries_out_a_queued_offsets_entry_of_its_own_group(
        patient_clock, tmp_path):  # noqa: F811
    """The three-host exactly-once test's hang (session 57): a coordinator that took a PrepareCommit over
    found in the queue, beside the marker of a partition another broker led, the offsets entry its
    predecessor had queued for the group, which the new coordinator coordinates too. Its end held the
    transaction's lock while it waited for the queue to empty; the marker loop waited for that lock to
    carry the group's entry out, and wrote no marker meanwhile: the end waited forever. Here the group's
    entry is queued (as the predecessor left it) when the coordinator queues its own: EndTxn is answered,
    the offsets are committed, the other broker's partition holds its marker, and the queue is empty."""
    from pipeline.coordinator.txn_store import QueuedMarker

    tid, group = _coordinated_by(0, "app"), _coordinated_by(0, "g")
    remote = next(p for p in (0, 1) if _leader("t", p) == 1)
    async with two_brokers(tmp_path) as (brokers, clients, txns):
        coordinator = clients[0]
        pid = await _begin(coordinator, tid, remote)
        assert _error(await _send(clients[1], _produce(tid, remote, _batch(pid, [b"r0"])))) == 0
        assert int((await coordinator.call("add_offsets_to_txn", 3, transactional_id=tid, producer_id=pid,
                                           producer_epoch=0, group_id=group)).error_code) == 0
        answer = await coordinator.call("txn_offset_commit", 3, transactional_id=tid, group_id=group,
                                        producer_id=pid, producer_epoch=0, generation_id=-1, member_id="",
                                        group_instance_id=None, topics=(nested(
                                            "txn_offset_commit", 3, "TxnOffsetCommitRequestTopic", name="t",
                                            partitions=(nested("txn_offset_commit", 3,
                                                               "TxnOffsetCommitRequestPartition", partition_index=0,
                                                               committed_offset=11, committed_leader_epoch=-1,
                                                               committed_metadata=None),)),))
        assert [int(p.error_code) for t in answer.topics for p in t.partitions] == [0]

        store = txns[0]._store
        assert store is not None
        queue = store.queue_markers

        def with_the_predecessors_entry(markers, fence=None):
            queue([*markers, QueuedMarker(tid, pid, 0, True, group_id=group)], fence)

        store.queue_markers = with_the_predecessors_entry  # type: ignore[method-assign]
        with trio.fail_after(2):  # virtual time: seconds of polling the queue (the hang: none answers)
            ended = await coordinator.call("end_txn", 3, transactional_id=tid, producer_id=pid, producer_epoch=0,
                                           committed=True)
        assert int(ended.error_code) == 0
        assert brokers[1].apis.logs.log_end_offset("t", remote) == 2  # the record and its COMMIT marker
        assert await _offsets(coordinator, group) == {("t", 0): (11, 0)}
        assert await trio.to_thread.run_sync(store.queued) == []
        assert txns[0].pending == {}
