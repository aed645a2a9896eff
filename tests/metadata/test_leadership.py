"""The controller row, partition leaders and producer states on both backends (``metadata_target``), and the
sans-I/O rules a controller and a broker follow (``pipeline.cluster.membership.reassign``, ``DynamicCluster``).

Two "brokers" are two store instances on one database (or file), as in tests/metadata/test_stores.py.
"""

from __future__ import annotations

import time
import uuid

import pytest

from pipeline.cluster.membership import OFFSETS_PARTITIONS, OFFSETS_TOPIC, DynamicCluster, offsets_partition, preferred_leader, reassign
from pipeline.metadata.brokers import FencedBrokerError
from pipeline.metadata.leadership import BrokerWal, Leadership, LeadershipStore, NotControllerError, ProducerBatch

ENDPOINT = (("PLAINTEXT", "127.0.0.1", 9092),)


def _register(store: LeadershipStore, node: int, lease_ms: int = 60_000) -> int:
    return store.registry.register(node, uuid.uuid4(), ENDPOINT, lease_ms)


def _two_brokers_and_controller_0(store: LeadershipStore) -> tuple[int, int]:
    """Brokers 0 and 1 registered, 0 the controller: (broker 0's epoch, the controller epoch)."""
    epoch = _register(store, 0)
    _register(store, 1)
    controller = store.claim_controller(0, epoch, 60_000)
    assert controller is not None
    return epoch, controller


def test_one_controller_at_a_time_and_a_deposed_one_cannot_write(metadata_target):
    a, b = LeadershipStore(metadata_target("cluster.db")), LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch_a, epoch_b = _register(a, 0, lease_ms=1500), _register(b, 1)
        first = a.claim_controller(0, epoch_a, 60_000)
        assert first == 1 and b.claim_controller(1, epoch_b, 60_000) is None
        assert a.claim_controller(0, epoch_a, 60_000) == first  # renewed, same epoch
        assert b.controller() == (0, first)
        a.write_assignment(0, epoch_a, first, {("t", 0): (0, True), ("t", 1): (1, True)})
        assert b.assignment() == {("t", 0): Leadership(0, 1, serving=False), ("t", 1): Leadership(1, 1, serving=False)}

        time.sleep(1.6)  # broker 0's lease runs out: its controller row may be taken at once
        second = b.claim_controller(1, epoch_b, 60_000)
        assert second == first + 1
        with pytest.raises(FencedBrokerError):
            a.write_assignment(0, epoch_a, first, {("t", 0): (1, True)})
        epoch_a2 = _register(a, 0)
        with pytest.raises(NotControllerError):
            a.write_assignment(0, epoch_a2, first, {("t", 0): (1, True)})
        assert a.claim_controller(0, epoch_a2, 60_000) is None  # broker 1 holds it, alive
        assert b.assignment()[("t", 0)] == Leadership(0, 1, serving=False)
    finally:
        a.close()
        b.close()


def test_a_move_waits_for_the_prior_leaders_hand_off_and_bumps_the_leader_epoch(metadata_target):
    store = LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch, controller = _two_brokers_and_controller_0(store)
        store.write_assignment(0, epoch, controller, {("t", 0): (0, True)})
        version = store.change_version()
        store.write_assignment(0, epoch, controller, {("t", 0): (1, False)})  # 0 is alive: it hands off
        assert store.change_version() != version
        assert store.assignment()[("t", 0)] == Leadership(1, 2, prior_id=0, handed_off=False, serving=False)
        # Moved again before the hand-off: broker 0 still has to hand off.
        store.write_assignment(0, epoch, controller, {("t", 0): (2, False)})
        assert store.assignment()[("t", 0)] == Leadership(2, 3, prior_id=0, handed_off=False, serving=False)
        assert not store.hand_off("t", 0, 0, 2)  # an older epoch's hand-off changes nothing
        assert store.hand_off("t", 0, 0, 3)
        assert store.assignment()[("t", 0)] == Leadership(2, 3, prior_id=0, handed_off=True, serving=False)
        store.write_assignment(0, epoch, controller, {}, [("t", 0)])
        assert store.assignment() == {}
        # Re-created: its leader epoch continues above the deleted one's (clients cached 3).
        store.write_assignment(0, epoch, controller, {("t", 0): (1, True), ("t", 1): (1, True)})
        assert store.assignment() == {("t", 0): Leadership(1, 4, serving=False), ("t", 1): Leadership(1, 1, serving=False)}
    finally:
        store.close()


def test_a_moved_partition_is_serving_once_its_new_leader_marks_it_so(metadata_target):
    """``serve``: the leader that took a partition over at its current epoch marks it serving (Metadata
    names it from then on); a mark for an older epoch or by another broker changes nothing, and the next
    move clears it."""
    store = LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch, controller = _two_brokers_and_controller_0(store)
        store.write_assignment(0, epoch, controller, {("t", 0): (0, True), ("t", 1): (1, True)})
        version = store.change_version()
        assert store.serve(1, {("t", 0): 1}) == 0  # broker 1 does not lead t-0
        assert store.serve(0, {("t", 0): 2}) == 0  # not the row's epoch
        assert store.change_version() == version
        assert store.serve(0, {("t", 0): 1}) == 1
        assert store.change_version() != version
        assert store.serve(0, {("t", 0): 1}) == 0  # already marked
        assert store.assignment() == {("t", 0): Leadership(0, 1), ("t", 1): Leadership(1, 1, serving=False)}
        store.write_assignment(0, epoch, controller, {("t", 0): (1, True)})
        assert store.assignment()[("t", 0)] == Leadership(1, 2, prior_id=0, serving=False)
        assert store.serve(1, {("t", 0): 2, ("t", 1): 1}) == 2
        assert store.assignment() == {("t", 0): Leadership(1, 2, prior_id=0), ("t", 1): Leadership(1, 1)}
    finally:
        store.close()


def test_producer_states_below_the_tables_end_are_kept_the_rest_dropped(metadata_target):
    writer, reader = LeadershipStore(metadata_target("cluster.db")), LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch = _register(writer, 0)
        batches = [ProducerBatch("t", 0, 7, 0, seq * 10, seq * 10 + 9, seq * 10) for seq in range(8)]
        writer.record_producers(0, epoch, batches)
        writer.record_producers(0, epoch, batches[-1:])  # a retried write: no second row
        writer.record_producers(0, epoch, [ProducerBatch("t", 1, 7, 0, 0, 4, 0)])
        # The table ends at 70: the batch at 70 was never committed.
        got = reader.producers({("t", 0): 70})
        assert got == batches[2:7]  # the last 5 below the end, oldest first
        assert reader.producers({("t", 0): 80}) == batches[2:7]  # the dropped row does not come back
        assert reader.producers({("t", 1): 5}) == [ProducerBatch("t", 1, 7, 0, 0, 4, 0)]
        writer.record_producers(0, epoch, [ProducerBatch("t", 0, 8, 1, s, s, 70 + s) for s in range(7)])
        assert writer.trim_producers() == 2
        assert [b.base_offset for b in reader.producers({("t", 0): 100}) if b.producer_id == 8] == [72, 73, 74, 75, 76]
        writer.registry.fence(0)
        with pytest.raises(FencedBrokerError):
            writer.record_producers(0, epoch, batches[:1])
    finally:
        writer.close()
        reader.close()


def test_a_partitions_table_end_is_what_its_commits_recorded_and_unknown_while_a_commit_is_pending(metadata_target):
    """``record_producers`` writes a commit's ends as pending (fenced by the writer's membership),
    ``commit_done`` makes them the ends; a partition whose last commit is pending (its writer died within
    it) or that has none is not in ``table_ends`` (a take-over reads the table), and ``settle_table_ends``
    records what that read found, never below what commits recorded (retention may drop the rows)."""
    writer, reader = LeadershipStore(metadata_target("cluster.db")), LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch = _register(writer, 0)
        keys = [("t", 0), ("t", 1), ("u", 0)]
        assert reader.table_ends(keys) == {}
        writer.record_producers(0, epoch, [], {("t", 0): 10, ("t", 1): 4}, "broker-0/a")
        assert reader.table_ends(keys) == {}  # pending: the commit may or may not be in the table
        assert reader.pending_writers(keys) == {(0, epoch, "broker-0/a")} and reader.pending_writers([("u", 0)]) == set()
        writer.commit_done({("t", 0): 10, ("t", 1): 4})
        assert reader.table_ends(keys) == {("t", 0): 10, ("t", 1): 4} and reader.pending_writers(keys) == set()
        # A retried commit (pending again at the same end), then the next one pending when its writer dies.
        writer.record_producers(0, epoch, [], {("t", 0): 10})
        writer.commit_done({("t", 0): 10})
        writer.record_producers(0, epoch, [], {("t", 0): 25}, "broker-0/b")
        assert reader.table_ends(keys) == {("t", 1): 4}
        writer.commit_done({("t", 0): 20})  # an older commit's late confirmation: the pending 25 stays
        assert reader.table_ends(keys) == {("t", 1): 4}
        # The new leader read the table: 18 (the pending commit's files did not land), below the 20 recorded.
        assert reader.pending_writers(keys) == {(0, epoch, "broker-0/b")}
        assert reader.settle_table_ends({("t", 0): 18, ("u", 0): 0}) == {("t", 0): 20, ("u", 0): 0}
        assert reader.pending_writers(keys) == set()
        assert reader.table_ends(keys) == {("t", 0): 20, ("t", 1): 4, ("u", 0): 0}
        writer.registry.fence(0)
        with pytest.raises(FencedBrokerError):
            writer.record_producers(0, epoch, [], {("t", 0): 30})
        assert reader.table_ends([("t", 0)]) == {("t", 0): 20}  # the fenced commit left nothing pending
        reader.forget_topic("t")
        assert reader.table_ends(keys) == {("u", 0): 0}
    finally:
        writer.close()
        reader.close()


def test_a_dead_brokers_wal_is_drained_by_one_live_claimant_and_a_dead_claimants_claim_moves(metadata_target):
    a, b, c = (LeadershipStore(metadata_target("cluster.db")) for _ in range(3))
    try:
        epoch_a, epoch_b, epoch_c = _register(a, 0, lease_ms=1500), _register(b, 1, lease_ms=3000), _register(c, 2)
        a.register_wal(0, epoch_a, "inc-a", "_pipeline/broker-0/incarnation-a")
        b.register_wal(1, epoch_b, "inc-b", "_pipeline/broker-1/incarnation-b")
        assert c.dead_wals() == []  # their writers are live
        assert not c.claim_wal("inc-a", 2, epoch_c)

        time.sleep(1.6)  # broker 0's lease runs out: its WAL may hold what the table lacks
        wal_a = BrokerWal("inc-a", 0, epoch_a, "_pipeline/broker-0/incarnation-a")
        assert c.dead_wals() == [wal_a]
        with pytest.raises(FencedBrokerError):
            a.claim_wal("inc-a", 0, epoch_a)
        assert b.claim_wal("inc-a", 1, epoch_b)
        assert b.claim_wal("inc-a", 1, epoch_b)  # held already
        assert not c.claim_wal("inc-a", 2, epoch_c)  # a live member holds it

        time.sleep(1.6)  # broker 1 dies while draining: its claim is taken over
        assert c.dead_wals() == [wal_a, BrokerWal("inc-b", 1, epoch_b, "_pipeline/broker-1/incarnation-b")]
        with pytest.raises(FencedBrokerError):
            b.wal_drained("inc-a", 1, epoch_b, [])
        assert c.claim_wal("inc-a", 2, epoch_c)
        version = c.change_version()
        batch = ProducerBatch("t", 0, 7, 0, 0, 9, 40)
        assert c.wal_drained("inc-a", 2, epoch_c, [batch])
        assert c.change_version() != version  # brokers waiting to take over read again
        assert not c.wal_drained("inc-a", 2, epoch_c, [])  # drained once
        assert [w.incarnation_id for w in c.dead_wals()] == ["inc-b"]
        assert c.producers({("t", 0): 50}) == [batch]  # the drained WAL's idempotent batch, below the end

        # Broker 0's next incarnation deletes its drained WAL's directory, then forgets it.
        assert c.drained_wals(0) == [BrokerWal("inc-a", 0, epoch_a, "_pipeline/broker-0/incarnation-a", True)]
        assert c.drained_wals(1) == []
        c.forget_wal("inc-a")
        c.forget_wal("inc-b")  # not drained: kept
        assert c.drained_wals(0) == [] and [w.incarnation_id for w in c.dead_wals()] == ["inc-b"]
    finally:
        for store in (a, b, c):
            store.close()


def test_a_deleted_topics_producer_states_are_forgotten(metadata_target):
    store = LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch = _register(store, 0)
        kept = ProducerBatch("u", 0, 8, 0, 0, 9, 0)
        store.record_producers(0, epoch, [ProducerBatch("t", 0, 7, 0, 0, 9, 0), kept])
        store.forget_topic("t")
        assert store.producers({("t", 0): 100, ("u", 0): 100}) == [kept]
    finally:
        store.close()


def test_reassign_spreads_over_live_members_moves_a_dead_ones_and_gives_them_back():
    topics = {"orders": 6}
    first, gone = reassign(topics, (0, 1, 2), {})
    assert gone == [] and len(first) == 6 + OFFSETS_PARTITIONS
    assert {first[("orders", p)] for p in range(6)} == {0, 1, 2}
    assert all(first[("orders", p)] == preferred_leader("orders", p, (0, 1, 2)) for p in range(6))
    rows = {key: Leadership(leader, 1) for key, leader in first.items()}
    assert reassign(topics, (0, 1, 2), rows) == ({}, [])

    moves, _ = reassign(topics, (0, 2), rows, (0, 1, 2))  # broker 1 died: only its partitions move
    assert set(moves) == {key for key, row in rows.items() if row.leader_id == 1}
    assert set(moves.values()) == {0, 2}
    after = {**rows, **{key: Leadership(leader, 2, rows[key].leader_id, False) for key, leader in moves.items()}}
    assert all(row.leader_id != 1 for row in after.values())
    back, _ = reassign(topics, (0, 1, 2), after, (0, 1, 2))  # it came back: leadership rebalances
    assert {key for key, leader in back.items() if leader == 1} == {key for key, row in rows.items()
                                                                    if row.leader_id == 1}
    assert reassign({}, (0, 1, 2), rows)[1] == [("orders", p) for p in range(6)]  # the topic was deleted
    assert reassign(topics, (), rows) == ({}, [])


def test_a_dynamic_cluster_serves_only_loaded_partitions_it_leads_as_a_member():
    view = DynamicCluster(1, "127.0.0.1", 9093)
    group = "g"
    gp = offsets_partition(group)
    view.leaders = {("t", 0): Leadership(1, 2), (OFFSETS_TOPIC, gp): Leadership(1, 1)}
    assert view.leader("t", 0) == 1 and not view.leads("t", 0)  # not a member yet
    view.member = True
    assert not view.leads("t", 0) and view.loading(group) and not view.coordinates(group)
    view.loaded = {("t", 0), (OFFSETS_TOPIC, gp)}
    assert view.leads("t", 0) and view.coordinates(group) and not view.loading(group)
    assert [b.node_id for b in view.brokers] == [1]  # itself, before reading the members
    view.leaders = {("t", 0): Leadership(2, 3, 1, False)}
    assert not view.leads("t", 0) and view.leader("t", 0) == 2
    assert view.leader("t", 1) == 1  # no row yet: the rule over the live members (itself)


def test_metadata_names_a_moved_partitions_assigned_leader_and_only_a_loaded_one_serves_it():
    """Metadata names a moved partition's row leader whether it serves it yet or not (a leader -1 left
    kafkajs's fetch manager without a fetcher for the partition); the leader serves it, and coordinates
    the group, only once it has taken it over. FindCoordinator names a coordinator that is loading
    (COORDINATOR_LOAD_IN_PROGRESS, as Kafka's)."""
    group = "g"
    gp = offsets_partition(group)
    other, leader = DynamicCluster(0, "127.0.0.1", 9092), DynamicCluster(1, "127.0.0.1", 9093)
    for view in (other, leader):
        view.member = True
        view.leaders = {("t", 0): Leadership(1, 2, 0, False, serving=False),
                        (OFFSETS_TOPIC, gp): Leadership(1, 2, 0, True, serving=False)}
        assert view.leader("t", 0) == 1 and view.assigned_leader("t", 0) == 1
        assert view.coordinator(group) == 1
    assert leader.loading(group) and not leader.leads("t", 0)
    leader.loaded = {("t", 0), (OFFSETS_TOPIC, gp)}  # taken over
    assert leader.leader("t", 0) == 1 and leader.leads("t", 0) and leader.coordinates(group)
    assert other.leader("t", 0) == 1 and not other.leads("t", 0)


def test_a_partitions_leader_epoch_is_its_rows_and_0_before_it_has_one():
    """KIP-320: Metadata, Fetch and ListOffsets take a partition's leader epoch from here
    (``BrokerInfo.leader_epoch``); a row's epoch is 1 the first time, so 0 is below every row's."""
    from pipeline.cluster.membership import Cluster, ClusterBroker

    view = DynamicCluster(1, "127.0.0.1", 9093)
    assert view.leader_epoch("t", 0) == 0
    view.leaders = {("t", 0): Leadership(1, 1)}
    assert (view.leader_epoch("t", 0), view.leader_epoch("t", 1)) == (1, 0)
    view.leaders = {("t", 0): Leadership(2, 4, 1, False)}  # moved (twice more) to broker 2
    assert view.leader_epoch("t", 0) == 4
    static = Cluster((ClusterBroker(0, "h", 1), ClusterBroker(1, "h", 2)), 1)
    assert {static.leader_epoch("t", p) for p in range(4)} == {0}  # leaders never move: KIP-320's 0


def test_a_drained_wals_open_transactions_wait_for_the_partitions_next_leader(metadata_target):
    """``wal_drained`` keeps the appends of transactions the WAL holds no marker of, with the drained flag in one
    database transaction; the partition's next leader reads them (``open_transactions``) and, once its own WAL
    has them, deletes them (``adopted``, fenced by its membership); a deleted topic's go with it."""
    store = LeadershipStore(metadata_target("cluster.db"))
    try:
        epoch, dead = _register(store, 0), _register(store, 1, lease_ms=200)
        store.register_wal(1, dead, "inc-dead", "_pipeline/broker-1/dead")
        time.sleep(0.3)  # broker 1's lease runs out
        open_appends = [("t", 1, 40, b"\x00records-40", 3, 1_700_000_000_000, 7, 2, 10, 99),
                        ("t", 1, 45, b"\x01records-45\xff", 2, 1_700_000_000_001, 7, 2, 13, 0),
                        ("u", 0, 5, b"u-5", 1, 1, 8, 0, 0, 3)]
        assert store.claim_wal("inc-dead", 0, epoch)
        assert store.wal_drained("inc-dead", 0, epoch, [], open_appends)
        assert store.open_transactions({("t", 1)}) == open_appends[:2]
        assert store.open_transactions({("t", 0), ("v", 1)}) == []
        with pytest.raises(FencedBrokerError):
            store.adopted(5, 1, open_appends[:1])  # not a member: nothing deleted
        store.adopted(0, epoch, open_appends[:1])
        assert store.open_transactions({("t", 1), ("u", 0)}) == open_appends[1:]
        store.forget_topic("u")
        assert store.open_transactions({("t", 1), ("u", 0)}) == open_appends[1:2]

        # A live leader hands a partition off with its open transactions' records, their producer batches
        # and its log end offset (its last offsets markers or those records), in one transaction.
        controller = store.claim_controller(0, epoch, 60_000)
        store.write_assignment(0, epoch, controller, {("v", 0): (0, True)})
        store.write_assignment(0, epoch, controller, {("v", 0): (1, False)})
        handed = [("v", 0, 30, b"v-30", 2, 5, 9, 1, 4, 0)]
        batch = ProducerBatch("v", 0, 9, 1, 4, 5, 30)
        assert not store.hand_off("v", 0, 0, 1, handed, [batch], 33)  # not at the move's leader epoch
        assert store.open_transactions({("v", 0)}) == []
        assert store.hand_off("v", 0, 0, 2, handed, [batch], 33)
        assert store.open_transactions({("v", 0)}) == handed
        assert store.table_ends({("v", 0)}) == {("v", 0): 33}
        assert store.producers({("v", 0): 33}) == [batch]
    finally:
        store.close()


def test_a_transaction_coordinators_writes_are_fenced_by_its_offsets_partitions_leader_epoch(metadata_target):
    """With leadership through the database the transaction store shares the leadership's database: a write
    fenced by (``__consumer_offsets``, partition, leader, leader epoch) stands only while that broker leads
    that partition at that epoch, so a coordinator paused past its lease writes nothing once it moved."""
    from pipeline.coordinator.transactions import TransactionMetadata, TxnState
    from pipeline.coordinator.txn_store import NotCoordinatorError, QueuedMarker, TransactionStore

    store = LeadershipStore(metadata_target("cluster.db"))
    txns = TransactionStore(metadata_target("cluster.db"))
    try:
        epoch, controller = _two_brokers_and_controller_0(store)
        key = (OFFSETS_TOPIC, offsets_partition("tx-1"))
        store.write_assignment(0, epoch, controller, {key: (0, True)})
        leader_epoch = store.assignment()[key].leader_epoch
        meta = TransactionMetadata("tx-1", 7, 0, 60_000, TxnState.ONGOING, -1, {("t", 0)}, set(), 1, 1)
        txns.save(meta, fence=(*key, 0, leader_epoch))
        marker = QueuedMarker("tx-1", 7, 0, True, "t", 0)
        txns.queue_markers([marker], fence=(*key, 0, leader_epoch))

        store.write_assignment(0, epoch, controller, {key: (1, True)})  # the coordinator moves to broker 1
        meta.state = TxnState.PREPARE_ABORT
        for stale in ((*key, 0, leader_epoch), (*key, 1, leader_epoch)):
            with pytest.raises(NotCoordinatorError):
                txns.save(meta, fence=stale)
            with pytest.raises(NotCoordinatorError):
                txns.queue_markers([QueuedMarker("tx-1", 7, 0, False, "t", 0)], fence=stale)
        [stored], _ = txns.load()
        assert stored.state is TxnState.ONGOING and txns.queued() == [marker]  # nothing of the fenced writes
        txns.save(meta, fence=(*key, 1, leader_epoch + 1))  # the new coordinator's
        assert txns.read("tx-1").state is TxnState.PREPARE_ABORT
    finally:
        txns.close()
        store.close()
