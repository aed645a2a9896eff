"""``pipeline.cluster.service.LeadershipService`` on a real SQLite metadata file: membership's end, and
with ``--ack-on wal`` a dead broker's WAL drained before its partitions are taken over.

A clean stop ends the broker's lease (``unregister``); the heartbeat the database then refuses is
the stop's own doing, not a fence: the broker must not end with the fenced status (3) then, which
its supervisor (or a host's service manager) would take for a crash. A lease that runs out while
the broker still serves is a fence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from pipeline.cluster.membership import DynamicCluster
from pipeline.cluster.service import LeadershipService, lease_margin_s
from pipeline.log.manager import LogManager

ENDPOINT = (("PLAINTEXT", "127.0.0.1", 9092),)


TWO_BROKERS_SESSION_MS = 3000
TWO_BROKERS_HEARTBEAT_MS = 100
"""The session and heartbeat of the tests where two brokers share one SQLite database: their heartbeats,
the controller's writes and the take-over queue on its write lock, and on a CPU-saturated CI machine a
1 s session ran out under a live broker (it fenced itself; the take-over it was to make never came)."""


def _service(tmp_path, fenced: list[str]) -> LeadershipService:
    return LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                             session_ms=1000, heartbeat_ms=50, logs=LogManager(), end_offsets=lambda topics: {}, topics=dict,
                             on_fenced=lambda: fenced.append("fenced"))


async def _until_registered(service: LeadershipService) -> None:
    with trio.fail_after(30):
        while not service.cluster.member:
            await trio.sleep(0.02)


@asynccontextmanager
async def _registered(service: LeadershipService) -> AsyncIterator[None]:
    """``service`` running and registered for the block; its tasks cancelled after it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await _until_registered(service)
        yield
        nursery.cancel_scope.cancel()



async def _until(predicate, what: str) -> None:
    """Return once ``predicate()`` holds; AssertionError naming ``what`` after 30 s."""
    with trio.move_on_after(30):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"not in 30 s: {what}")

def test_a_clean_stop_ends_the_lease_without_fencing_the_broker(tmp_path):
    fenced: list[str] = []
    service = _service(tmp_path, fenced)

    async def main() -> None:
        async with _registered(service):
            await service.unregister()
            await trio.sleep(0.5)  # ten heartbeats, each refused: the lease is over

    trio.run(main)
    assert fenced == []
    assert not service.cluster.member


def test_a_lease_ended_by_someone_else_fences_the_broker(tmp_path):
    fenced: list[str] = []
    service = _service(tmp_path, fenced)

    async def main() -> None:
        async with _registered(service):
            assert service.store is not None and service.epoch is not None
            # As the lease running out while the broker was stalled: the database ends it, not the broker.
            await trio.to_thread.run_sync(service.store.registry.unregister, 0, service.epoch)
            with trio.fail_after(30):
                while not fenced:
                    await trio.sleep(0.02)

    trio.run(main)
    assert fenced == ["fenced"]


def test_with_ack_on_wal_a_dead_brokers_wal_is_drained_before_its_partition_is_taken_over(tmp_path):
    """Broker 0 (``--ack-on wal``) leads ``t``-0 and dies (its tasks end, its lease runs out). Broker 1,
    the controller then, moves the partition to itself but takes it over only once broker 0's WAL is
    drained (``drain_wal``, held here until released; the real one writes to the table:
    tests/e2e/test_failover.py): the idempotent batch the WAL held joins the producer states, broker 1
    continues at the table end the drain recorded (the table read once, by broker 0's first load), and
    broker 0's next incarnation deletes the drained WAL's directory."""
    import threading
    from pathlib import Path

    from pipeline.log.batch import PartitionAppend

    db = tmp_path / "cluster.db"
    drained: list[Path] = []
    release = threading.Event()
    table_reads: list[set[str]] = []
    acked = PartitionAppend("t", 0, 40, b"", 10, 0, producer_id=7, producer_epoch=0, base_sequence=0)

    def drain(directory: Path, ends) -> tuple[list[PartitionAppend], list[PartitionAppend]]:
        drained.append(directory)
        assert release.wait(30)
        assert ends.recorded([("t", 0)]) == {("t", 0): 40}  # broker 0's load recorded what it read
        ends.begin([acked])  # what Server.drain_wal does around its table write of [40, 50)
        ends.done([acked])
        return [acked], []  # no open transaction in it

    def end_offsets(keys) -> dict[tuple[str, int], int]:
        table_reads.append({t for t, _ in keys})
        return {("t", 0): 40}  # the table before the drain

    def service(node: int, wal_path: str) -> LeadershipService:
        return LeadershipService(DynamicCluster(node, "127.0.0.1", 9092 + node), db, ENDPOINT,
                                 session_ms=TWO_BROKERS_SESSION_MS, heartbeat_ms=TWO_BROKERS_HEARTBEAT_MS, logs=LogManager(), end_offsets=end_offsets,
                                 topics=lambda: {"t": 1}, on_fenced=lambda: None, data_dir=tmp_path,
                                 wal_path=wal_path, drain_wal=drain)

    dead_wal = tmp_path / "_pipeline" / "broker-0" / "incarnation-a"
    dead_wal.mkdir(parents=True)
    first, second = service(0, "_pipeline/broker-0/incarnation-a"), service(1, "_pipeline/broker-1/incarnation-b")

    async def main() -> None:
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as broker_0:
                async with trio.open_nursery() as nursery:
                    await nursery.start(first.run)
                    await _until(lambda: ("t", 0) in first.cluster.loaded, "broker 0 serves t-0")
                    await outer.start(second.run)
                    await _until(lambda: second.cluster.member, "broker 1 registered")
                    broker_0.cancel()  # broker 0 dies: no unregister, its lease runs out
            await _until(lambda: drained, "broker 0's WAL drained")
            assert drained == [dead_wal]
            await _until(lambda: getattr(second.cluster.leaders.get(("t", 0)), "leader_id", None) == 1,
                        "broker 1 reads the move")
            await trio.sleep(0.5)  # more of broker 1's watch passes (every 0.25 s): the take-over waits
            assert ("t", 0) not in second.cluster.loaded and {"t"} not in table_reads[1:]
            release.set()
            await _until(lambda: ("t", 0) in second.cluster.loaded, "broker 1 serves t-0")
            # Broker 1 continues at the end the drain recorded, without reading the table.
            assert second.logs.log_end_offset("t", 0) == 50
            assert table_reads == [{"t"}] and second.ends_read_from_table == 0
            assert second.store is not None
            batches = await trio.to_thread.run_sync(second.store.producers, {("t", 0): 50})
            assert [(b.producer_id, b.base_offset) for b in batches] == [(7, 40)]
            # Broker 0's next incarnation deletes the drained directory before it serves anything.
            again = service(0, "_pipeline/broker-0/incarnation-c")
            await outer.start(again.run)
            await _until(lambda: again.cluster.member, "broker 0 registered again")
            assert not dead_wal.exists()
            outer.cancel_scope.cancel()

    trio.run(main)


def test_a_coordinator_serves_its_groups_before_its_partitions_table_end_offsets_are_read(tmp_path):
    """A broker that takes over ``t``-0 and the ``__consumer_offsets`` partitions loads the groups on their own
    (the offset store), so its groups are coordinated (not COORDINATOR_LOAD_IN_PROGRESS) while the table's
    end offsets are still being read (held here until released; Spark's take seconds); and ``t``-0 has no
    leader in Metadata (LEADER_NOT_AVAILABLE) until it is served, then this broker, marked serving in the
    store for every other broker's Metadata."""
    import threading

    release = threading.Event()
    reads: list[set[str]] = []

    def end_offsets(keys) -> dict[tuple[str, int], int]:
        reads.append({t for t, _ in keys})
        assert release.wait(30)
        return {("t", 0): 5}

    service = LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                                session_ms=TWO_BROKERS_SESSION_MS, heartbeat_ms=TWO_BROKERS_HEARTBEAT_MS,
                                logs=LogManager(), end_offsets=end_offsets, topics=lambda: {"t": 1}, on_fenced=lambda: None)
    cluster = service.cluster

    async def main() -> None:
        try:
            async with _registered(service):
                await _until(lambda: reads, "the table's end offsets asked for")
                await _until(lambda: cluster.coordinates("g"), "group g coordinated")
                assert ("t", 0) not in cluster.loaded and not cluster.leads("t", 0)
                assert cluster.assigned_leader("t", 0) == 0 and cluster.leader("t", 0) == 0  # named at once (DynamicCluster.leader)
                release.set()
                await _until(lambda: cluster.leads("t", 0), "t-0 served")
                assert cluster.leader("t", 0) == 0
                assert service.store is not None
                rows = await trio.to_thread.run_sync(service.store.assignment)
                assert rows[("t", 0)].serving and all(row.serving for row in rows.values())
        finally:
            release.set()  # the held read's thread ends whatever happened

    trio.run(main)


def test_a_broker_whose_heartbeats_stop_reaching_the_database_stops_acknowledging_a_margin_before_its_lease_ends(
        tmp_path):
    """Heartbeats that hang (the database cut off): ``lease_until`` is the last renewal's send time plus the
    session less ``lease_margin_s``; from then the broker acknowledges nothing (``lease_current``) and
    its watchdog fences it, never earlier."""
    fenced: list[float] = []
    service = LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                                session_ms=3000, heartbeat_ms=50, logs=LogManager(), end_offsets=lambda topics: {},
                                topics=dict, on_fenced=lambda: fenced.append(trio.current_time()))
    cut = threading.Event()
    release = threading.Event()

    async def main() -> None:
        async with _registered(service):
            assert service.leases is not None
            heartbeat = service.leases.heartbeat

            def hanging(*args):
                if cut.is_set():
                    release.wait(60)
                    raise OSError("the database is unreachable")
                return heartbeat(*args)

            service.leases.heartbeat = hanging  # type: ignore[method-assign]
            await trio.sleep(0.3)
            cut.set()
            try:
                await _until(lambda: fenced, "the broker fenced")
                last = service._lease_from
                assert last is not None
                assert service.cluster.lease_until == last + 3.0 - lease_margin_s(3000)
                assert fenced[0] >= service.cluster.lease_until
                assert not service.cluster.lease_current(fenced[0])
                assert service.cluster.lease_current(service.cluster.lease_until - 0.01)
            finally:
                release.set()

    trio.run(main)
    assert len(fenced) == 1


def test_a_stopping_broker_takes_over_nothing_and_says_so_once(tmp_path, caplog):
    """After ``stop_taking_over`` (a clean stop has begun: the broker's stores close next) a partition the
    controller assigns to the broker is not taken over (its table end offsets are not read, it is not
    served), and the broker logs it once, not at every pass; before it, a partition is taken over."""
    topics = {"t": 1}
    reads: list[set[tuple[str, int]]] = []

    def end_offsets(keys) -> dict[tuple[str, int], int]:
        reads.append(set(keys))
        return {}

    service = LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                                session_ms=TWO_BROKERS_SESSION_MS, heartbeat_ms=TWO_BROKERS_HEARTBEAT_MS,
                                logs=LogManager(), end_offsets=end_offsets, topics=lambda: dict(topics),
                                on_fenced=lambda: None)
    cluster = service.cluster
    said = "is stopping: 1 partition(s) assigned to it are left for the other brokers"

    async def main() -> None:
        async with _registered(service):
            await _until(lambda: cluster.leads("t", 0), "t-0 taken over before the stop")
            service.stop_taking_over()
            topics["u"] = 1
            await _until(lambda: ("u", 0) in cluster.leaders and cluster.leaders[("u", 0)].leader_id == 0,
                         "u-0 assigned to the stopping broker")
            await _until(lambda: said in caplog.text, "the stopping broker's message")
            count = caplog.text.count(said)
            for _ in range(2):  # two more passes: the first one's take-over (none) is done by the second
                version = cluster.leaders
                await _until(lambda seen=version: cluster.leaders is not seen, "another pass over the assignment")
            assert ("u", 0) not in cluster.loaded and not cluster.leads("u", 0)
            assert all(("u", 0) not in keys for keys in reads), reads
            assert caplog.text.count(said) == count == 1

    with caplog.at_level(logging.INFO, logger="pipeline.cluster.service"):
        trio.run(main)


class _InvalidatedTable:
    """The table side of a LogManager as a take-over sees it: which partitions it was told to forget
    (``TableReader.invalidate``, which refreshes their tables at their next read). Nothing is read."""

    def __init__(self) -> None:
        self.invalidated: list[tuple[str | None, int | None]] = []

    def invalidate(self, topic: str | None = None, partition: int | None = None) -> None:
        self.invalidated.append((topic, partition))


def test_a_take_over_invalidates_the_tables_only_of_partitions_with_rows_and_reads_none(tmp_path):
    """Partitions whose ends their commits recorded are taken over without reading the table; the
    table reader is told to forget a partition whose recorded end is above 0 (another broker's commits
    are in the table: its tables are refreshed at their next read, not on the take-over's path), not a
    new topic's partition (recorded end 0: nothing to read). Both continue at their recorded ends."""
    from pipeline.metadata.leadership import LeadershipStore

    store = LeadershipStore(tmp_path / "cluster.db")
    try:
        store.record_new_partitions("fresh", [0])
        store.settle_table_ends({("used", 0): 7})
    finally:
        store.close()
    reads: list[set] = []
    table = _InvalidatedTable()
    logs = LogManager(table=table)  # type: ignore[arg-type]
    service = LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                                session_ms=TWO_BROKERS_SESSION_MS, heartbeat_ms=TWO_BROKERS_HEARTBEAT_MS, logs=logs,
                                end_offsets=lambda keys: reads.append(set(keys)) or {},
                                topics=lambda: {"fresh": 1, "used": 1}, on_fenced=lambda: None)

    async def main() -> None:
        async with _registered(service):
            await _until(lambda: service.cluster.leads("fresh", 0) and service.cluster.leads("used", 0),
                         "both partitions served")
            assert reads == []
            assert table.invalidated == [("used", 0)]
            assert logs.log_end_offset("fresh", 0) == 0 and logs.log_end_offset("used", 0) == 7

    trio.run(main)


def test_a_take_over_that_finds_the_table_short_of_the_recorded_end_continues_there_and_says_so(tmp_path, caplog):
    """A partition whose last commit is pending (its writer died within it) is read from the table; when
    the table's rows end below the end its earlier commits recorded (retention dropped rows, or a commit
    recorded done never landed: the fault test's lost dead letters), the new leader continues at the
    recorded end, as Kafka's log end offset never goes back, and logs a warning naming both ends."""
    import uuid

    from pipeline.metadata.leadership import LeadershipStore

    store = LeadershipStore(tmp_path / "cluster.db")
    try:
        writer = store.registry.register(5, uuid.uuid4(), ENDPOINT, 60_000)
        store.record_producers(5, writer, [], {("used", 0): 7}, "broker-5/a")
        store.commit_done({("used", 0): 7})
        store.record_producers(5, writer, [], {("used", 0): 9}, "broker-5/b")  # pending when broker 5 died
    finally:
        store.close()
    logs = LogManager()
    service = LeadershipService(DynamicCluster(0, "127.0.0.1", 9092), tmp_path / "cluster.db", ENDPOINT,
                                session_ms=TWO_BROKERS_SESSION_MS, heartbeat_ms=TWO_BROKERS_HEARTBEAT_MS, logs=logs,
                                end_offsets=lambda keys: {("used", 0): 5}, topics=lambda: {"used": 1},
                                on_fenced=lambda: None)

    async def main() -> None:
        async with _registered(service):
            await _until(lambda: service.cluster.leads("used", 0), "the partition served")
            assert logs.log_end_offset("used", 0) == 7

    with caplog.at_level(logging.INFO, logger="pipeline.cluster.service"):
        trio.run(main)
    assert "used-0 continues at its recorded table end 7, above the table's rows (5)" in caplog.text
