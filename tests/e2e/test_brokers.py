"""End to end: ``pipeline serve --brokers 2``, real clients, one shared Spark Connect server.

* Metadata from either broker lists both brokers and spreads a topic's
  partition leaders over them; a produce to the broker that does not lead a
  partition answers NOT_LEADER_OR_FOLLOWER; a SIGKILLed supervisor leaves no
  process behind (its brokers and the Connect server JVM die with it).
* An idempotent confluent-kafka producer (``enable.idempotence``) writes keyed
  records to a 4-partition topic while one broker is killed with ``kill -9``;
  the supervisor restarts it, the producer finishes, a consumer group reads
  everything back through both brokers; after SIGTERM (nothing left running)
  the table holds every acknowledged record exactly once, at the offset its
  producer was told, offsets 0..n-1 per partition, in send order.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import defaultdict

import psutil
import pytest

from tests.e2e import raw_client as rc
from tests.e2e.cluster_process import Cluster, cmdline as _cmdline
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture
def cluster_factory(tmp_path):
    started: list[Cluster] = []

    def make(n: int = 2, *args: str) -> Cluster:
        c = Cluster(tmp_path / f"data{len(started)}", n, *args)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.kill_all()


def _metadata(host: str, port: int, topic: str):
    from kio.schema.metadata.v9.response import MetadataResponse
    from kio.serial import entity_reader

    client = rc.RawClient(host, port)
    try:
        client.send(rc.frame(rc.metadata(topic), 7))
        correlation_id, body = client.read_response()
    finally:
        client.close()
    assert correlation_id == 7 and body[0] == 0  # response header v1: no tagged fields
    return entity_reader(MetadataResponse)(body, 1)[0]


def test_metadata_spreads_leaders_and_a_killed_supervisor_leaves_nothing(cluster_factory):
    cluster = cluster_factory(2, "--num-partitions", "4")
    assert sorted(cluster.addresses) == [0, 1]
    leaders_seen = []
    for node, (host, port) in sorted(cluster.addresses.items()):
        md = _metadata(host, port, "spread")
        assert sorted((b.node_id, b.host, b.port) for b in md.brokers) == [
            (i, *cluster.addresses[i]) for i in (0, 1)], f"broker {node}"
        assert md.controller_id == 0
        topic = md.topics[0]
        assert int(topic.error_code) == 0 and len(topic.partitions) == 4
        leaders_seen.append({p.partition_index: p.leader_id for p in topic.partitions})
    assert leaders_seen[0] == leaders_seen[1]  # both brokers agree
    assert set(leaders_seen[0].values()) == {0, 1}  # and the leaders are spread over both

    # a produce to the broker that does not lead the partition: NOT_LEADER_OR_FOLLOWER; to the leader: stored
    for partition, leader in leaders_seen[0].items():
        for node, (host, port) in cluster.addresses.items():
            client = rc.RawClient(host, port)
            try:
                client.send(rc.frame(rc.produce("spread", [b"x"], partition=partition), 11))
                _cid, body = client.read_response()
            finally:
                client.close()
            error = int(rc.decode_produce_response(body).responses[0].partition_responses[0].error_code)
            assert error == (0 if node == leader else NOT_LEADER_OR_FOLLOWER), (partition, leader, node)

    tree = cluster.tree()
    assert any("SparkConnectServer" in " ".join(_cmdline(p)) for p in tree)
    assert sum(1 for p in tree if "--node-id" in _cmdline(p)) == 2
    cluster.proc.kill()  # SIGKILL: no clean-up runs in the supervisor
    cluster.proc.wait(30)
    _gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, [f"{p.pid} {_cmdline(p)[:4]}" for p in alive]  # PR_SET_PDEATHSIG took them all


N = 12_000
TOPIC = "orders"
KEYS = 40


def test_idempotent_producer_exactly_once_in_order_across_a_broker_kill(cluster_factory):
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = cluster_factory(2)
    bootstrap = cluster.bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 4, 1)]).values():
        future.result(60)

    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
        "message.timeout.ms": 600_000, "batch.num.messages": 200})
    acked: dict[int, tuple[int, int]] = {}  # i -> (partition, offset)
    errors: list[tuple[int, str]] = []
    duplicates: list[int] = []

    def on_delivery(err, msg):
        i = int(msg.value())
        if err is not None:
            errors.append((i, str(err)))
        elif i in acked:
            duplicates.append(i)
        else:
            acked[i] = (msg.partition(), msg.offset())

    victim = 1
    killed_pid = None
    acked_before_kill: dict[int, tuple[int, int]] = {}
    for i in range(N):
        while True:
            try:
                producer.produce(TOPIC, key=f"key-{i % KEYS}".encode(), value=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if i == N // 3:
            assert producer.flush(120) == 0  # a third acknowledged by both brokers before the kill
        if i == N // 2:  # the kill: requests in flight to it are retried by the producer
            killed_pid = cluster.broker_pid(victim)
            os.kill(killed_pid, signal.SIGKILL)
            acked_before_kill = dict(acked)
    assert producer.flush(480) == 0, f"undelivered; errors {errors[:5]}\n{cluster.log_text()}"
    assert not errors, errors[:5]
    assert not duplicates
    assert len(acked) == N
    assert len(acked_before_kill) >= N // 3
    assert all(acked[i] == pos for i, pos in acked_before_kill.items())

    # the supervisor noticed and restarted the broker, under a new pid
    cluster.wait_listening(3, 60)
    assert cluster.broker_pid(victim) != killed_pid
    assert re.search(rf"broker {victim} \(pid {killed_pid}\) exited with signal SIGKILL", cluster.log_text())

    # per partition, in send order, gapless from 0
    by_partition: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, (p, offset) in acked.items():
        by_partition[p].append((offset, i))
    assert len(by_partition) == 4
    for p, rows in by_partition.items():
        rows.sort()
        assert [o for o, _ in rows] == list(range(len(rows))), f"partition {p}: offsets not 0..n-1"
        assert [i for _, i in rows] == sorted(i for _, i in rows), f"partition {p}: not in send order"

    # a consumer group reads it all back through both brokers (FindCoordinator, Fetch from each leader)
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "readers",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    seen: dict[int, tuple[int, int]] = {}
    deadline = time.monotonic() + 180
    while len(seen) < N and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 1.0):
            if msg.error() is None:
                seen[int(msg.value())] = (msg.partition(), msg.offset())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == acked

    # SIGTERM: every broker drains and flushes, then Spark stops; nothing is left running
    tree = cluster.tree()
    assert cluster.stop() == 0, cluster.log_text()
    _gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, [f"{p.pid} {_cmdline(p)[:4]}" for p in alive]

    rows = read_table(cluster.data_dir, f"SELECT partition, offset, CAST(value AS STRING) AS v FROM records "
                                        f"WHERE topic = '{TOPIC}'")
    table = {(r["partition"], r["offset"]): int(r["v"]) for r in rows}
    assert len(rows) == len(table) == N, "a row is missing or written twice"
    assert table == {pos: i for i, pos in acked.items()}
