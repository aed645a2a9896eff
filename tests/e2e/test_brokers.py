"""End to end: ``pipeline serve --brokers N``, real clients, the brokers sharing one Spark Connect server.

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
* Exactly-once processing across the kill of a transaction coordinator (issue 35), on
  ``--brokers 3`` writing through the session's Spark Connect server (``--spark-remote``, a catalog
  database of its own): a consume-transform-produce loop (confluent-kafka: a ``read_committed``
  consumer in a group, a transactional producer, batches of ``EOS_BATCH`` records per transaction
  with the consumer's positions sent to it) turns ``EOS_N`` keyed input records over 3 partitions
  into ``value + b"-out"`` records on a 3-partition output topic. Its clients are bootstrapped on
  broker 0 alone; its transactional id is coordinated by broker 1 and its group by broker 2 (the
  static rule, ``crc32(key) % 3``), so every EndTxn's markers go to partitions other brokers lead
  and the offsets to another broker's group. After ``EOS_KILL_AFTER`` commits broker 1 (the
  transaction coordinator, leader of one input and one output partition) is killed with
  ``kill -9``; the supervisor restarts it and the loop (retrying what librdkafka calls retriable,
  aborting and rewinding the consumer to its committed offsets on an abortable error, failing on
  a fatal one) consumes everything. Then a ``read_committed`` consumer reads each input record's
  transform exactly once, the group's committed offsets are the input's end offsets, and after
  SIGTERM the table holds each output record once, none from an aborted transaction.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import psutil
import pytest

from tests.conftest import unique_database
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


@pytest.mark.crash
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


@pytest.mark.crash
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


EOS_N = 3000
EOS_BATCH = 100
EOS_KILL_AFTER = 5
"""Transactions committed before the coordinator is killed."""
EOS_INPUT, EOS_OUTPUT = "eos-in", "eos-out"
EOS_DEADLINE_S = 240.0
EOS_CALL_S = 60.0
"""What one librdkafka call (init, send_offsets, commit, abort, committed) may block."""
BOOTSTRAP_NODE, TXN_NODE, GROUP_NODE = 0, 1, 2


def _coordinator(address: tuple[str, int], key_type: int, key: str) -> int:
    """The node FindCoordinator v4 (``key_type`` 0: a group, 1: a transactional id) names for ``key``,
    asked of the broker at ``address``."""
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
    from kio.serial import entity_reader
    from kio.static.primitive import i8

    client = rc.RawClient(*address)
    try:
        client.send(rc.frame(FindCoordinatorRequest(key_type=i8(key_type), coordinator_keys=(key,)), 5))
        correlation_id, body = client.read_response()
    finally:
        client.close()
    assert correlation_id == 5 and body[0] == 0  # flexible response header: no tagged fields
    [found] = entity_reader(FindCoordinatorResponse)(body, 1)[0].coordinators
    assert int(found.error_code) == 0, found
    return int(found.node_id)


def _static_node(key: str, brokers: int = 3) -> int:
    """The node (brokers 0..n-1, so index == id) coordinating ``key`` by the static rule ``crc32(key) % n``."""
    return zlib.crc32(key.encode()) % brokers


@dataclass
class EosLoop:
    """What the consume-transform-produce loop did (written by its thread, read after it ends)."""

    commits: list[float] = field(default_factory=list)  # time.monotonic() of each commit's return
    aborts: int = 0
    retries: list[str] = field(default_factory=list)  # retriable errors, retried
    abortable: list[str] = field(default_factory=list)  # abortable errors, aborted
    delivery_errors: list[str] = field(default_factory=list)
    consumer_errors: list[str] = field(default_factory=list)
    committed: list = field(default_factory=list)  # the group's committed offsets at the end
    error: BaseException | None = None


def _eos_inputs(bootstrap: str, topic: str) -> tuple[dict[bytes, tuple[bytes, int, int]], dict[int, int]]:
    """The loop's input: ``EOS_N`` keyed records with unique values in ``topic`` (3 partitions), acknowledged
    by all (acks=all). Returns (value -> (key, partition, offset), partition -> end offset)."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    inputs: dict[bytes, tuple[bytes, int, int]] = {}
    failed: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            inputs[msg.value()] = (msg.key(), msg.partition(), msg.offset())

    for i in range(EOS_N):
        while True:
            try:
                producer.produce(topic, b"in-%d" % i, b"key-%d" % (i % KEYS), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0 and not failed, failed[:5]
    assert len(inputs) == EOS_N
    return inputs, {p: 1 + max(o for _k, q, o in inputs.values() if q == p) for p in range(3)}


def _read_committed(bootstrap: str, topic: str, group: str, timeout_s: float = 120.0) -> list[tuple[bytes, bytes]]:
    """(value, key) of every record a read_committed confluent-kafka consumer reads from ``topic``'s 3
    partitions, from their starts to their ends (EOF on each, within ``timeout_s``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                       "enable.auto.commit": False, "enable.partition.eof": True})
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    read: list[tuple[bytes, bytes]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(at_end) < 3 and time.monotonic() < deadline:
        for msg in reader.consume(1000, 1.0):
            if msg.error() is None:
                read.append((msg.value(), msg.key()))
                at_end.discard(msg.partition())
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
    reader.close()
    assert len(at_end) == 3, f"not at the end of every partition within {timeout_s:g} s: {len(read)} read"
    return read


def _eos_loop(bootstrap: str, transactional_id: str, group: str, ends: dict[int, int], deadline: float,
              loop: EosLoop, topics: tuple[str, str] = (EOS_INPUT, EOS_OUTPUT), config: dict | None = None,
              gate: threading.Event | None = None) -> None:
    """Consume ``topics[0]`` (``EOS_INPUT``) in group ``group``, produce each record's transform to
    ``topics[1]`` (``EOS_OUTPUT``, 3 partitions) in transactions of up to ``EOS_BATCH`` records with the
    consumer's positions, until the positions committed are ``ends``; ``config``: more of both clients'
    settings; ``gate``: a transaction begins only while it is set. The transforms keep their input's key but go round-robin over the output's
    partitions (a batch comes from one input partition, and its keys' partition would be the same
    number): each transaction writes to the partitions of all three brokers. The error handling of
    confluent-kafka's documentation (docs/index.rst, "Error handling example"): a retriable error
    retries the call; an abortable one aborts the transaction and rewinds the consumer to the group's
    committed offsets; any other is raised."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer

    def call(f, *args):
        """``f(*args)``, again while it fails with a retriable error (until the deadline)."""
        while True:
            try:
                return f(*args)
            except KafkaException as exc:
                err = exc.args[0]
                if not err.retriable() or err.fatal() or time.monotonic() > deadline:
                    raise
                loop.retries.append(f"{f.__name__}: {err}")
                time.sleep(0.1)

    def delivered(err, _msg):
        if err is not None:
            loop.delivery_errors.append(str(err))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", **(config or {})})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
                         **(config or {})})
    source, sink = topics
    try:
        call(producer.init_transactions, EOS_CALL_S)
        consumer.subscribe([source])
        while True:
            assert time.monotonic() < deadline, f"the loop did not finish within {EOS_DEADLINE_S:g} s"
            batch = []
            for msg in consumer.consume(EOS_BATCH, 1.0):
                if msg.error() is None:
                    batch.append(msg)
                elif msg.error().fatal():
                    raise KafkaException(msg.error())
                else:  # informational (a broker down): librdkafka goes on by itself
                    loop.consumer_errors.append(str(msg.error()))
            if not batch:  # (after an abort's rewind the positions are the committed offsets)
                if {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())} == ends:
                    break
                continue
            if gate is not None:
                gate.wait(deadline - time.monotonic())
            producer.begin_transaction()
            try:
                for k, msg in enumerate(batch):
                    while True:
                        try:
                            producer.produce(sink, msg.value() + b"-out", msg.key(), partition=k % 3,
                                             on_delivery=delivered)
                            break
                        except BufferError:
                            producer.poll(0.05)
                positions = consumer.position(consumer.assignment())
                call(producer.send_offsets_to_transaction, positions, consumer.consumer_group_metadata(), EOS_CALL_S)
                call(producer.commit_transaction, EOS_CALL_S)
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or not err.txn_requires_abort():
                    raise
                loop.abortable.append(str(err))
                call(producer.abort_transaction, EOS_CALL_S)
                loop.aborts += 1
                for tp in consumer.committed(consumer.assignment(), EOS_CALL_S):
                    if tp.offset < 0:  # nothing committed yet
                        tp.offset = OFFSET_BEGINNING
                    consumer.seek(tp)
                continue
            loop.commits.append(time.monotonic())
            if {tp.partition: tp.offset for tp in positions} == ends:
                break
        loop.committed = consumer.committed(consumer.assignment(), EOS_CALL_S)
    except BaseException as exc:  # handed to the test below
        loop.error = exc
    finally:
        consumer.close()
        producer.flush(10)


@pytest.mark.crash
def test_exactly_once_consume_transform_produce_across_a_transaction_coordinator_kill(
        cluster_factory, connect_server, connect_spark):
    from confluent_kafka.admin import AdminClient, NewTopic

    # The ids: the first of each form the static rule places on the broker wanted. Bootstrapped on broker 0,
    # the clients must follow FindCoordinator to broker 1 for the transaction and broker 2 for the group;
    # broker 1, killed, then coordinates neither the group (its offsets, its JoinGroup) nor is the bootstrap,
    # and its EndTxn writes markers to the output partitions broker 0 and 2 lead through the shared queue.
    transactional_id = next(t for k in itertools.count() if _static_node(t := f"eos-txn-{k}") == TXN_NODE)
    group = next(g for k in itertools.count() if _static_node(g := f"eos-job-{k}") == GROUP_NODE)
    database = unique_database()
    cluster = cluster_factory(3, "--spark-remote", connect_server.url, "--table-database", database,
                              "--group-initial-rebalance-delay-ms", "0")
    assert sorted(cluster.addresses) == [0, 1, 2]
    bootstrap = "%s:%d" % cluster.addresses[BOOTSTRAP_NODE]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in (EOS_INPUT, EOS_OUTPUT)]).values():
        future.result(60)
    # every broker names broker 1 the transaction's coordinator and broker 2 the group's, and each
    # broker leads one partition of each topic
    for node, address in cluster.addresses.items():
        assert _coordinator(address, 1, transactional_id) == TXN_NODE, node
        assert _coordinator(address, 0, group) == GROUP_NODE, node
    for topic in (EOS_INPUT, EOS_OUTPUT):
        leaders = {p.partition_index: p.leader_id for p in _metadata(*cluster.addresses[0], topic).topics[0].partitions}
        assert sorted(leaders.values()) == [0, 1, 2], (topic, leaders)

    inputs, ends = _eos_inputs(bootstrap, EOS_INPUT)
    del admin  # closed: no reconnection attempts after the cluster stops
    assert sum(ends.values()) == EOS_N, ends  # offsets 0..n-1 in each of the 3 partitions

    loop = EosLoop()
    started = time.monotonic()
    worker = threading.Thread(target=_eos_loop, name="eos-loop", daemon=True,
                              args=(bootstrap, transactional_id, group, ends, started + EOS_DEADLINE_S, loop))
    worker.start()
    while len(loop.commits) < EOS_KILL_AFTER and worker.is_alive():
        time.sleep(0.01)
    assert len(loop.commits) >= EOS_KILL_AFTER, f"{loop.error!r}\n{cluster.log_about('eos-', 'transaction')}"
    killed_pid = cluster.broker_pid(TXN_NODE)
    commits_before_kill = len(loop.commits)
    os.kill(killed_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    worker.join(started + EOS_DEADLINE_S + 2 * EOS_CALL_S - time.monotonic())  # the loop's deadline, its last call
    assert not worker.is_alive(), f"the loop hangs\n{cluster.log_about('eos-', 'transaction', 'marker')}"
    after_kill = [t - killed_at for t in loop.commits if t > killed_at]
    print(f"\nEOS loop: {len(loop.commits)} transactions committed ({commits_before_kill} before the kill), "
          f"{loop.aborts} aborted, {len(loop.retries)} retriable errors retried, in {time.monotonic() - started:.1f} s; "
          f"first commit {after_kill[0] if after_kill else float('nan'):.2f} s after the kill")
    print(f"EOS loop: abortable errors {loop.abortable[:5]}, retried {loop.retries[:5]}, "
          f"delivery errors {loop.delivery_errors[:3]}, consumer errors {loop.consumer_errors[:3]}")
    assert loop.error is None, f"{loop.error!r}\n{cluster.log_about('eos-', 'transaction', 'marker')}"
    assert after_kill, "no commit after the kill"

    # the supervisor restarted the coordinator, under a new pid
    cluster.wait_listening(4, 60)
    assert cluster.broker_pid(TXN_NODE) != killed_pid
    assert re.search(rf"broker {TXN_NODE} \(pid {killed_pid}\) exited with signal SIGKILL", cluster.log_text())

    # brokers 0 and 2 carried out the coordinator's queued markers of their partitions
    log = cluster.log_path.read_text(errors="replace")
    print("restarted coordinator:", *re.findall(rf"\[broker {TXN_NODE}\] .* transactional ids loaded.*", log))
    for node in (0, 2):
        written = re.findall(rf"\[broker {node}\] .*markers written for other coordinators: .*{transactional_id}", log)
        print(f"broker {node}: {len(written)} carry-outs of queued markers")
        assert written, node

    # the group's committed offsets are the input's end offsets
    assert {tp.partition: tp.offset for tp in loop.committed if tp.topic == EOS_INPUT} == ends

    # a read_committed consumer reads each input record's transform exactly once, with its key
    read = _read_committed(bootstrap, EOS_OUTPUT, "eos-verify")
    expected = {value + b"-out": key for value, (key, _p, _o) in inputs.items()}
    assert len(read) == len(dict(read)), f"{len(read) - len(dict(read))} transforms read more than once"
    assert dict(read) == expected, f"{len(set(expected) - dict(read).keys())} missing"

    # SIGTERM: every broker drains and flushes; the table holds each output record once, nothing aborted
    assert cluster.stop() == 0, cluster.log_text()
    rows = [r.asDict() for r in connect_spark.sql(
        f"SELECT `partition`, `offset`, key, value FROM {database}.records WHERE topic = '{EOS_OUTPUT}'").collect()]
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)) == EOS_N, \
        f"{len(values)} rows, {len(values) - len(set(values))} duplicates, {EOS_N - len(set(values))} missing"
    assert {bytes(r["value"]): bytes(r["key"]) for r in rows} == expected
    assert len({(r["partition"], r["offset"]) for r in rows}) == EOS_N
