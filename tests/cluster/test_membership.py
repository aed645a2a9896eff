"""Several brokers, in-process: cluster membership, leadership, coordinators, producer ids, and the
routing every broker applies (Metadata lists the cluster; Produce/Fetch/ListOffsets of a partition
another broker leads answer NOT_LEADER_OR_FOLLOWER; misdirected group requests NOT_COORDINATOR)."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from pipeline.cluster.membership import Cluster, ClusterBroker, format_brokers, parse_brokers
from pipeline.config import ConfigError, resolve
from pipeline.protocol import BrokerInfo, decode_request, metadata_response, parse_request_header
from pipeline.requests.catalog import TopicCatalog
from pipeline.requests.handler import KafkaApis
from pipeline.network.listeners import FREE_PORT_FLOOR, ephemeral_ports
from pipeline.process.supervisor import broker_ports, broker_registry_listener, strip_flags
from tests.protocol.protocol_helpers import metadata_request, read_response, request_frame

BROKERS = parse_brokers("1@127.0.0.1:9093,0@127.0.0.1:9092,2@h2:9094")


def test_parse_sorts_by_id_and_round_trips():
    assert [b.node_id for b in BROKERS] == [0, 1, 2]
    assert BROKERS[2] == ClusterBroker(2, "h2", 9094)
    assert parse_brokers(format_brokers(BROKERS)) == BROKERS
    assert parse_brokers("7@[::1]:9092") == (ClusterBroker(7, "::1", 9092),)


@pytest.mark.parametrize("text", ["", "0@127.0.0.1", "x@h:1", "0@h:0", "0@h:70000", "0h:9092",
                                  "0@h:1,0@g:2", "0@h:1,1@h:1"])
def test_parse_refuses(text):
    with pytest.raises(ValueError):
        parse_brokers(text)


def test_leaders_round_robin_from_a_stable_start():
    cluster = Cluster(BROKERS, 0)
    for topic in ("orders", "payments", "a", "t1"):
        start = zlib.crc32(topic.encode()) % 3
        leaders = [cluster.leader(topic, p) for p in range(6)]
        assert leaders == [BROKERS[(start + p) % 3].node_id for p in range(6)]
        assert sorted(set(leaders)) == [0, 1, 2]  # spread over every broker
    # every broker computes the same leaders, and leads exactly its own
    others = [Cluster(BROKERS, n) for n in (1, 2)]
    for p in range(12):
        assert {c.leader("orders", p) for c in [cluster, *others]} == {cluster.leader("orders", p)}
        assert sum(c.leads("orders", p) for c in [cluster, *others]) == 1


def test_coordinator_by_crc32_of_the_group():
    for n in range(3):
        cluster = Cluster(BROKERS, n)
        for group in ("g", "consumers", "x" * 40):
            assert cluster.coordinator(group) == BROKERS[zlib.crc32(group.encode()) % 3].node_id
            assert cluster.coordinates(group) == (cluster.coordinator(group) == n)


def test_a_single_broker_leads_and_coordinates_everything():
    alone = Cluster.single(5)
    assert alone.leader("t", 3) == 5 and alone.leads("t", 3) and alone.coordinates("g")
    assert [alone.producer_id(k) for k in (10, 11)] == [10, 11]


def test_producer_ids_never_collide_across_brokers():
    ids = [{Cluster(BROKERS, n).producer_id(k) for k in range(1000, 1100)} for n in range(3)]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert all(len(s) == 100 for s in ids)


def test_node_id_must_be_a_member():
    with pytest.raises(ValueError, match="node.id 9"):
        Cluster(BROKERS, 9)


def test_config_parses_the_cluster_and_checks_it():
    flags = {"pipeline.cluster.brokers": (BROKERS, "flag:--cluster-brokers"), "node.id": (1, "flag:--node-id")}
    server = resolve(None, {}, flags).server
    assert server.cluster_brokers == BROKERS and server.node_id == 1
    assert resolve(None, {}, {}).server.cluster_brokers is None  # default: alone
    with pytest.raises(ConfigError, match="node.id 4 is not in"):
        resolve(None, {}, {**flags, "node.id": (4, "flag:--node-id")})
    with pytest.raises(ConfigError, match="both set"):
        resolve(None, {}, {**flags, "pipeline.brokers": (2, "flag:--brokers")})
    env = resolve(None, {"PIPELINE_PIPELINE_CLUSTER_BROKERS": "0@a:1,1@b:2"}, {})
    assert env.server.cluster_brokers == (ClusterBroker(0, "a", 1), ClusterBroker(1, "b", 2))
    assert env.rows()[[r["key"] for r in env.rows()].index("pipeline.cluster.brokers")]["value"] == "0@a:1,1@b:2"


class _Topics:
    def describe(self, name, auto_create):
        return 0, 4

    def all_topics(self):
        return {"orders": 4}


def _metadata(broker: BrokerInfo, version: int = 9):
    frame = request_frame(metadata_request(version, ["orders"]), correlation_id=3)
    header = parse_request_header(frame)
    return read_response(3, version, metadata_response(header, decode_request(header, frame), broker, _Topics()))[1]


def test_metadata_lists_every_broker_and_each_partitions_leader():
    cluster = Cluster(BROKERS, 1)
    me = BrokerInfo(1, "advertised.me", 9999, "c", cluster=cluster)
    body = _metadata(me)
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [
        (0, "127.0.0.1", 9092), (1, "advertised.me", 9999), (2, "h2", 9094)]
    assert body.controller_id == 0
    partitions = body.topics[0].partitions
    assert [p.leader_id for p in partitions] == [cluster.leader("orders", p) for p in range(4)]
    assert all(tuple(p.replica_nodes) == (p.leader_id,) == tuple(p.isr_nodes) for p in partitions)


def test_metadata_names_each_partitions_leader_epoch_from_the_database_rows():
    """KIP-320 (Metadata v7+): with leadership through the database a partition's leader epoch is its
    row's (+1 per move); one without a row yet says 0; before v7 there is no field."""
    from pipeline.cluster.membership import DynamicCluster
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(1, "127.0.0.1", 9093)
    view.leaders = {("orders", 0): Leadership(1, 1), ("orders", 1): Leadership(1, 3, 0, True),
                    ("orders", 2): Leadership(1, 7, 1, False)}
    me = BrokerInfo(1, "advertised.me", 9999, "c", cluster=view)
    assert [p.leader_epoch for p in _metadata(me, 9).topics[0].partitions] == [1, 3, 7, 0]
    assert [p.leader_epoch for p in _metadata(me, 12).topics[0].partitions] == [1, 3, 7, 0]
    assert not hasattr(_metadata(me, 6).topics[0].partitions[0], "leader_epoch")
    static = BrokerInfo(1, "advertised.me", 9999, "c", cluster=Cluster(BROKERS, 1))
    assert {p.leader_epoch for p in _metadata(static).topics[0].partitions} == {0}


def test_a_leader_that_is_not_a_live_member_is_not_available_in_metadata():
    """Between a broker's lease ending and the controller moving its partitions their rows still name
    it, but it is not a listed broker: Metadata says LEADER_NOT_AVAILABLE with leader -1, as Kafka does
    for an offline leader (kafka-python's poll raised UnknownBrokerIdError on the dangling id)."""
    from pipeline.cluster.membership import ClusterBroker, DynamicCluster
    from pipeline.metadata.leadership import Leadership

    view = DynamicCluster(1, "127.0.0.1", 9093)
    view.members = (ClusterBroker(0, "h0", 9092), ClusterBroker(1, "127.0.0.1", 9093))
    view.leaders = {("orders", p): Leadership(p % 3, 1) for p in range(4)}  # broker 2's lease ran out
    body = _metadata(BrokerInfo(1, "advertised.me", 9999, "c", cluster=view))
    assert [b.node_id for b in body.brokers] == [0, 1]
    assert [(int(p.error_code), p.leader_id, tuple(p.replica_nodes)) for p in body.topics[0].partitions] == [
        (0, 0, (0,)), (0, 1, (1,)), (5, -1, ()), (0, 0, (0,))]


def test_metadata_of_a_broker_alone_is_unchanged():
    body = _metadata(BrokerInfo(3, "h", 9092, "c"))
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(3, "h", 9092)]
    assert body.controller_id == 3
    assert {p.leader_id for p in body.topics[0].partitions} == {3}


def test_produce_to_a_partition_another_broker_leads_is_not_leader():
    cluster = Cluster(BROKERS, 2)
    apis = KafkaApis(BrokerInfo(2, "h2", 9094, "c", cluster=cluster), TopicCatalog(initial={"orders": 6}),
                     logs=None, persister=None, first_producer_id=1000)  # type: ignore[arg-type]
    for p in range(6):
        expected = ErrorCode.none.value if cluster.leads("orders", p) else ErrorCode.not_leader_or_follower.value
        assert apis._check_partition(-1, "orders", p) == expected
    assert apis._check_partition(-1, "orders", 6) == ErrorCode.unknown_topic_or_partition.value
    # producer ids: this broker's (index 2 of 3), consecutive ones 3 apart
    first, second = next(apis._producer_ids), next(apis._producer_ids)
    assert (first, second) == (1000 * 3 + 2, 1001 * 3 + 2)


def test_supervisor_argument_handling():
    argv = ["--config", "x.toml", "--listen", "h:1", "--brokers=2", "--spark-master", "local[2]",
            "--num-partitions", "4", "--metrics-port=0"]
    assert strip_flags(argv) == ["--config", "x.toml", "--num-partitions", "4"]
    assert broker_ports("127.0.0.1", 9092, 3) == [9092, 9093, 9094]
    free = broker_ports("127.0.0.1", 0, 3)
    # distinct, and below the ephemeral range: no outgoing connection takes one before its broker binds it
    assert len(set(free)) == 3 and all(FREE_PORT_FLOOR <= port < ephemeral_ports()[0] for port in free)
    assert [broker_registry_listener("https://[::1]:8081", n) for n in range(3)] == [
        "https://[::1]:8081", "https://[::1]:8082", "https://[::1]:8083"]
    assert broker_registry_listener("http://127.0.0.1:0", 2) == "http://127.0.0.1:0"


def test_catalogs_sharing_a_store_see_each_others_topics(metadata_target):
    """Two brokers' catalogs on one topics.db (two SQLite connections, as two processes have), or on one
    PostgreSQL database (two connections, as brokers on two hosts have)."""
    import trio

    from pipeline.metadata.topics import TopicStore

    a = TopicCatalog(3, True, store=TopicStore(metadata_target("topics.db")), shared=True)
    b = TopicCatalog(3, True, store=TopicStore(metadata_target("topics.db")), shared=True)
    assert a.describe("auto", True) == (0, 3)  # auto-created on a ...
    assert b.partitions("auto") == 3  # ... known on b at once: a miss rereads the store
    trio.run(a.create, "made", 5, {"retention.ms": "1000"})
    assert b.describe("made", False) == (0, 5)
    assert b.retention("made")[0] == 1000
    trio.run(b.set_partitions, "made", 8)
    assert a.partitions("made") == 5  # a name it knows: not reread until refresh (every second in a server)
    assert a.refresh() and a.partitions("made") == 8
    assert not a.refresh()  # nothing changed since
    # created at the same moment on both: the second auto-creation takes the first's
    b.store.insert(b._new("race", 2))
    assert a.describe("race", True) == (0, 2)

    async def nothing(_topic):
        pass

    trio.run(a.delete, "auto", nothing)
    assert b.refresh() and b.partitions("auto") is None
    assert b.deleted_elsewhere == ["auto"]
    alone = TopicCatalog(3, True, store=TopicStore(metadata_target("topics.db")))  # not shared: as before
    a.store.insert(a._new("later", 1))
    assert alone.partitions("later") is None and not alone.refresh()


def test_a_refresh_read_across_this_catalogs_own_write_never_undoes_it(metadata_target):
    """A CI run lost a just-created topic on its own broker (UNKNOWN_TOPIC_OR_PARTITION to an OffsetCommit
    on it): the periodic refresh had loaded the store in its thread before this broker's CreateTopics
    committed, then applied that snapshot after it, taking the new topic for one another broker deleted
    (and dropping its data). A read that overlaps a write of this catalog, or is older than one applied
    already, is dropped; the next one applies."""
    import threading

    import trio

    from pipeline.metadata.topics import TopicStore

    a = TopicCatalog(3, True, store=TopicStore(metadata_target("topics.db")), shared=True)
    b = TopicCatalog(3, True, store=TopicStore(metadata_target("topics.db")), shared=True)
    real_load = a.store.load

    async def across(local_write, other_write):
        """a's refresh reads the store after b's ``other_write``, then ``local_write`` runs on a before
        that read is applied."""
        loaded, release = threading.Event(), threading.Event()

        def held_load():
            snapshot = real_load()
            loaded.set()
            release.wait(60)
            return snapshot

        await other_write()  # moves the store's version: a's refresh loads
        a.store.load = held_load
        applied = []
        async with trio.open_nursery() as nursery:
            async def refresh():
                applied.append(await a.refresh_async())

            nursery.start_soon(refresh)
            await trio.to_thread.run_sync(loaded.wait, 60)  # the snapshot is read
            a.store.load = real_load
            await local_write()
            release.set()
        return applied

    async def main():
        # a create (its own refresh first): the snapshot lacks the new topic
        assert await across(lambda: a.create("mine", 4, {}), lambda: b.create("elsewhere", 2, {})) == [False]
        assert a.partitions("mine") == 4 and a.partitions("elsewhere") == 2 and a.deleted_elsewhere == []
        # a resize (no refresh first): the snapshot has the old count
        assert await across(lambda: a.set_partitions("mine", 6), lambda: b.create("third", 1, {})) == [False]
        assert a.partitions("mine") == 6 and "third" not in a.all_topics()  # not reread yet
        assert await a.refresh_async() and a.all_topics()["third"] == 1 and a.partitions("mine") == 6
        assert a.deleted_elsewhere == []

    trio.run(main)


def test_supervisor_restarts_a_dead_broker_and_gives_up_on_a_configuration_error(tmp_path, capsys):
    """The supervisor's loop with stand-in brokers (tiny Python processes, no Spark)."""
    import sys
    import threading

    from pipeline.process import supervisor as sv

    marker = tmp_path / "runs"
    # broker 0 dies (status 1) on its first two runs, then stays up; broker 1 lives
    flaky = [sys.executable, "-c", f"import pathlib, sys, time; p = pathlib.Path({str(marker)!r}); "
             "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
             "print('up', n, flush=True); sys.exit(1) if n < 2 else time.sleep(60)"]
    steady = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    s = sv.Supervisor(SimpleNamespace(spark_remote="sc://x:1"), [], [])
    s.brokers = [sv.Broker(0, flaky), sv.Broker(1, steady)]
    old = sv.RESTART_BACKOFF_S
    sv.RESTART_BACKOFF_S = (0.1, 0.2)
    for b in s.brokers:
        b.backoff_s = 0.1
        b.start()
    try:
        threading.Timer(6.0, s._stop.set).start()
        assert s._supervise() == 0
    finally:
        sv.RESTART_BACKOFF_S = old
        s._stop_all()
    assert s.brokers[0].restarts == 2 and s.brokers[1].restarts == 0
    out = capsys.readouterr().out
    assert "broker 0: up 0" in out and "broker 0: up 2" in out and "broker 1: up" in out
    assert all(b.proc.poll() is not None for b in s.brokers)  # SIGTERMed by _stop_all

    bad = sv.Supervisor(SimpleNamespace(spark_remote="sc://x:1"), [], [])
    bad.brokers = [sv.Broker(0, [sys.executable, "-c", "import sys; sys.exit(2)"]), sv.Broker(1, steady)]
    for b in bad.brokers:
        b.start()
    try:
        assert bad._supervise() == 2  # a configuration error: restarting cannot help
    finally:
        bad._stop_all()
