"""Transactions end to end (issue 22, "Must show"): real transactional clients, a ``kill -9``, real Spark.

One data directory, one story, its steps the tests of this module in order (a failed step
skips the rest):

1. a confluent-kafka transactional producer (reading its input with a consumer, as a
   consume-transform-produce job does) and a kafkajs one (``tests/e2e/txn_kafkajs.js``, driven a
   step at a time) each run 5 transactions of 6 records over 3 partitions, committed, aborted,
   committed, aborted, committed, each sending its consumed offsets (TxnOffsetCommit). Inside the
   third, with both transactions open, their records at the broker and plain records written to
   the table after them, ONE ``kill -9`` of the server's whole process group, then ONE restart on
   the same data directory and port, and both producers commit the transaction the crash
   interrupted. The group's committed offsets are checked around every transaction: an open or
   aborted transaction's offsets never apply, a committed one's do;
2. a ``read_committed`` consumer reads exactly the committed records, in order per partition;
   a ``read_uncommitted`` one the aborted ones too, as Kafka would;
3. zombie fencing: a new producer with the same ``transactional.id`` fences the previous one,
   whose open transaction is aborted and whose next Produce or EndTxn is refused
   (INVALID_PRODUCER_EPOCH / PRODUCER_FENCED: librdkafka's fatal ``_FENCED``); and a producer
   whose consumer's group rebalanced since it took the group metadata cannot commit offsets
   (KIP-447: ILLEGAL_GENERATION, the transaction aborts);
4. a transaction left open past its ``transaction.timeout.ms`` is aborted by the coordinator:
   the last stable offset moves on;
5. DescribeTransactions and ListTransactions through kafka-python's admin client;
6. the table holds exactly the committed records, each once (read by name through the
   restarted server's Spark Connect endpoint), and the server stops with exit code 0.

Server starts: two. The module cannot use a shared server, because the story kills its server
and restarts it on the same data directory (that crash is what step 1 is about).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.compat import envs
from tests.e2e.server_process import TABLE_READY, ServerProcess, describe, free_port
from tests.e2e.shared_server import create_topics
from tests.e2e.table_reader import read_table_until

pytestmark = pytest.mark.slow

OUTCOMES = ("commit", "abort", "commit", "abort", "commit")
"""The transactions each producer runs, in order."""
KILLED_IN = 2
"""The transaction open when the server is killed (it is committed after the restart)."""
PER_TXN = 6
"""Records per transaction, round-robin over ``PARTITIONS``."""
PARTITIONS = 3
FAMILIES = ("confluent", "kafkajs")
INPUT = "txn-input"
"""The topic the transactions' consumed offsets point into (the confluent job reads it)."""
PLAIN = "txn-plain"
"""Plain records written to the table while the killed transactions are open."""
ZOMBIE, TIMEOUT, DESCRIBED = "txn-zombie", "txn-timeout", "txn-described"
REBALANCED = "txn-rebalanced"
"""The input of the consume-transform-produce job whose group rebalances under it (KIP-447)."""
KAFKAJS = "2.2.4"
LATE_TIMEOUT_MS = 10_000
"""``transaction.timeout.ms`` of the transaction left open (long enough for its records to reach the
broker before the coordinator aborts it on a loaded machine)."""
WAIT_S = 120.0
"""Deadline of any one wait for the server or a client (generous: the 2-core machine is loaded)."""
CHILDREN_GRACE_S = 15.0
SERVER_ARGS = ("--table-commit-interval-ms", "1000", "--linger-ms", "5")
"""A table commit every second, so table checks do not wait long."""


def topic_of(family: str) -> str:
    return f"txn-{family}"


def group_of(family: str) -> str:
    return f"txn-{family}-job"


def committed_values(family: str) -> list[str]:
    """What a ``read_committed`` consumer and the table must hold of ``family``'s transactions."""
    return [v for i, outcome in enumerate(OUTCOMES) if outcome == "commit" for v in txn_values(family, i)]


def txn_values(family: str, i: int) -> list[str]:
    """The values of ``family``'s transaction ``i``: the input records it consumed, transformed."""
    return [f"{family}-t{i}-in-{PER_TXN * i + j}" for j in range(PER_TXN)]


def by_partition(values: list[str]) -> dict[int, list[str]]:
    """``values`` of one or more transactions, each of ``PER_TXN`` round-robin over the partitions."""
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for k, value in enumerate(values):
        out[(k % PER_TXN) % PARTITIONS].append(value)
    return out


def offset_after(i: int) -> int:
    """The input offset transaction ``i`` commits for its group (the next record to consume)."""
    return PER_TXN * (i + 1)


# -- the story -------------------------------------------------------------------------------------

@dataclass
class Story:
    """What the steps share: the server of the moment and the clients to close if a step fails."""

    root: Path
    port: int = field(default_factory=free_port)
    server: ServerProcess | None = None
    failed_step: str | None = None
    closers: list[Any] = field(default_factory=list)  # called at the end whatever happens

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, log_name: str, table: bool) -> ServerProcess:
        self.server = ServerProcess(self.data_dir, *SERVER_ARGS, port=self.port,
                                    log_path=self.root / log_name).start(WAIT_S * 1.5, table=table)
        return self.server

    def abort(self) -> None:
        """After a failed step: no server or client is left running."""
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):  # best effort: the step's failure is what matters
                close()
        self.closers.clear()
        if self.server is not None:
            self.server.kill()


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    story = Story(tmp_path_factory.mktemp("transactions"))
    try:
        yield story
    finally:
        story.abort()


# -- clients ---------------------------------------------------------------------------------------

def kafkajs_modules() -> Path:
    """kafkajs 2.2.4's ``node_modules``, where the compatibility matrix keeps it (``tests.compat.envs``).

    Fails (never skips) when node or the environment is missing: ``.ci/run`` installs node and
    builds the environment before the suite."""
    client = next(c for c in envs.CLIENTS if c.family == "kafkajs" and c.version == KAFKAJS)
    if shutil.which("node") is None:
        pytest.fail("node is not installed (apt-get install nodejs npm; .ci/run installs it)")
    if not client.built:
        pytest.fail(f"kafkajs {KAFKAJS} is not built under {client.env}: run `{envs.BUILD_COMMAND}` in the "
                    f"work tree (.ci/run does), or point COMPAT_CACHE at a cache that has it")
    return client.env / "node_modules"


class KafkajsProducer:
    """``tests/e2e/txn_kafkajs.js``: a kafkajs transactional producer, one command at a time."""

    def __init__(self, node_modules: Path, bootstrap: str, transactional_id: str) -> None:
        script = Path(__file__).with_name("txn_kafkajs.js")
        self.proc = subprocess.Popen(["node", str(script), str(node_modules), bootstrap, transactional_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="kafkajs-stdout").start()
        self._answer("connect")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _answer(self, what: str) -> dict:
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"kafkajs: no answer to {what} within {WAIT_S:g} s") from None
        if line is None:
            raise AssertionError(f"kafkajs exited during {what}: {self.stderr()}")
        answer = json.loads(line)
        assert answer["ok"], f"kafkajs {what}: {answer.get('error')}"
        return answer

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:]

    def command(self, op: str, **fields: Any) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._answer(op)

    def begin(self, topic: str, values: list[str], group: str, offset: int) -> None:
        """A new transaction with ``values`` (partition k % PARTITIONS) and the group's offset; left open."""
        self.command("begin", topic=topic, messages=[{"partition": k % PARTITIONS, "value": v}
                                                     for k, v in enumerate(values)],
                     offsets={"group": group, "topic": INPUT, "partition": 0, "offset": str(offset)})

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.command("close")
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class ConfluentJob:
    """A confluent-kafka consume-transform-produce job: reads ``INPUT`` partition 0, writes its
    output in transactions, sends the consumed offsets with each (``send_offsets_to_transaction``)."""

    def __init__(self, bootstrap: str, transactional_id: str, group: str) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        # transaction.timeout.ms: longer than a restart on a loaded machine takes, so the
        # coordinator does not abort the transaction open across it.
        # metadata.recovery.strategy=none: librdkafka 2.16's re-bootstrap (KIP-899), started when the
        # only broker is gone, decommissions the broker the group coordinator is cached as, and
        # send_offsets_to_transaction then waits for it forever, past its own timeout
        # (confluentinc/librdkafka#5511, #5456: a client bug, which any restart of a lone broker sets off).
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "transaction.timeout.ms": 120_000, "linger.ms": 5,
                                  "metadata.recovery.strategy": "none"})
        self.producer.init_transactions(WAIT_S)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(INPUT, 0, 0)])
        self.errors: list[str] = []

    def next_inputs(self, n: int) -> list[Any]:
        got: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < n and time.monotonic() < deadline:
            message = self.consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
        assert len(got) == n, f"read {len(got)} input records of {n} within {WAIT_S:g} s"
        return got

    def begin(self, topic: str, family: str, i: int) -> list[str]:
        """Transaction ``i``: ``PER_TXN`` inputs consumed, transformed, produced and flushed to the
        broker, the offsets sent; left open. Returns the values produced."""
        from confluent_kafka import TopicPartition

        self.producer.begin_transaction()
        inputs = self.next_inputs(PER_TXN)
        values = [f"{family}-t{i}-{m.value().decode()}" for m in inputs]
        for k, value in enumerate(values):
            self.producer.produce(topic, value.encode(), partition=k % PARTITIONS, on_delivery=self._delivered)
        assert self.producer.flush(WAIT_S) == 0 and self.errors == [], self.errors
        self.producer.send_offsets_to_transaction([TopicPartition(INPUT, 0, inputs[-1].offset() + 1)],
                                                  self.consumer.consumer_group_metadata(), WAIT_S)
        return values

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.errors.append(str(err))

    def end(self, outcome: str) -> None:
        if outcome == "commit":
            self.producer.commit_transaction(WAIT_S)
        else:
            self.producer.abort_transaction(WAIT_S)

    def close(self) -> None:
        self.consumer.close()
        self.producer.flush(10)


def group_offset(bootstrap: str, group: str) -> int:
    """``group``'s committed offset of ``INPUT`` partition 0 (-1001, OFFSET_INVALID: none), asked without
    ``require_stable`` (a read_uncommitted consumer), so an open transaction's pending offsets are not waited for."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_uncommitted"})
    try:
        return consumer.committed([TopicPartition(INPUT, 0)], timeout=WAIT_S)[0].offset
    finally:
        consumer.close()


def consume(bootstrap: str, topic: str, isolation: str, until=lambda got: True,
            timeout_s: float = WAIT_S) -> dict[int, list[tuple[int, str]]]:
    """(offset, value) of each record a consumer with ``isolation.level`` reads from every partition of
    ``topic`` from the beginning, once it is at the end of each (PARTITION_EOF: the last stable offset
    for read_committed) and ``until(got)`` holds.

    Raises AssertionError (with what was read) when that does not happen within ``timeout_s``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-{isolation}-reader",
                         "isolation.level": isolation, "enable.partition.eof": True, "enable.auto.commit": False})
    got: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    at_end: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_s
        while not (len(at_end) == PARTITIONS and until(got)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{isolation} read of {topic}: not at the end of every partition with the "
                                     f"expected records within {timeout_s:g} s; read {got}, at the end of {at_end}")
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            got[message.partition()].append((message.offset(), message.value().decode()))
    finally:
        consumer.close()
    return got


def values_of(got: dict[int, list[tuple[int, str]]]) -> dict[int, list[str]]:
    return {p: [v for _o, v in records] for p, records in got.items()}


def kill_group(server: ServerProcess) -> list[str]:
    """``kill -9`` of the server's whole process group (server, Spark's JVM, workers); what survived it."""
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGKILL)
    return describe(server.kill(grace_s=CHILDREN_GRACE_S))


# -- the steps -------------------------------------------------------------------------------------

def test_transactions_commit_and_abort_across_a_kill_9(story):
    node_modules = kafkajs_modules()  # before the server starts: a missing one fails at once
    # Spark starts meanwhile: the first transactions are acknowledged at the WAL
    server = story.start("server-a.log", table=False)
    create_topics(server, {INPUT: 1, PLAIN: 1, **{topic_of(f): PARTITIONS for f in FAMILIES}})
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": story.bootstrap, "acks": "all"})
    for k in range(PER_TXN * len(OUTCOMES)):
        plain.produce(INPUT, b"in-%d" % k, partition=0)
    assert plain.flush(WAIT_S) == 0

    job = ConfluentJob(story.bootstrap, "txn-confluent-job", group_of("confluent"))
    story.closers.append(job.close)
    js = KafkajsProducer(node_modules, story.bootstrap, "txn-kafkajs-job")
    story.closers.append(js.close)

    expected = {f: -1001 for f in FAMILIES}  # each group's committed offset: none yet
    for i, outcome in enumerate(OUTCOMES):
        assert job.begin(topic_of("confluent"), "confluent", i) == txn_values("confluent", i)
        js.begin(topic_of("kafkajs"), txn_values("kafkajs", i), group_of("kafkajs"), offset_after(i))
        # the open transaction's offsets are pending: not the group's yet
        assert {f: group_offset(story.bootstrap, group_of(f)) for f in FAMILIES} == expected, f"transaction {i}"
        if i == KILLED_IN:
            # Plain records after the open transactions' reach the table (a table commit and a
            # checkpoint with the transactions open), and so do transaction 0's committed ones.
            for k in range(PER_TXN):
                plain.produce(PLAIN, b"plain-%d" % k, partition=0)
            assert plain.flush(WAIT_S) == 0
            server.wait_for(TABLE_READY, WAIT_S * 1.5)
            read_table_until(story.data_dir, f"SELECT topic FROM records WHERE topic IN ('{PLAIN}', "
                             f"'{topic_of('confluent')}', '{topic_of('kafkajs')}')",
                             lambda rows: len(rows) >= 3 * PER_TXN, timeout_s=WAIT_S)
            survivors = kill_group(server)
            assert survivors == [], survivors
            server = story.start("server-b.log", table=False)  # the transactions go on while Spark starts
            assert "2 transactional ids loaded, 2 with an open transaction" in server.log_text(), \
                server.log_text()[-3000:]
        job.end(outcome)
        js.command(outcome)
        if outcome == "commit":
            expected = {f: offset_after(i) for f in FAMILIES}
        # a commit applies its offsets, an abort leaves the last committed transaction's
        assert {f: group_offset(story.bootstrap, group_of(f)) for f in FAMILIES} == expected, f"after {i} {outcome}"
    js.close()
    assert js.proc.returncode == 0, js.stderr()
    job.close()
    story.closers.clear()


def test_read_committed_sees_exactly_the_committed_records_in_order(story):
    for family in FAMILIES:
        got = consume(story.bootstrap, topic_of(family), "read_committed")
        assert values_of(got) == by_partition(committed_values(family)), family


def test_read_uncommitted_sees_the_aborted_records_too(story):
    for family in FAMILIES:
        everything = [v for i in range(len(OUTCOMES)) for v in txn_values(family, i)]
        got = consume(story.bootstrap, topic_of(family), "read_uncommitted")
        assert values_of(got) == by_partition(everything), family
        # each transaction's marker takes an offset of each partition it wrote; never delivered
        for records in got.values():
            offsets = [o for o, _v in records]
            per_txn = PER_TXN // PARTITIONS
            assert offsets == [t * (per_txn + 1) + k for t in range(len(OUTCOMES)) for k in range(per_txn)], family


def test_a_fenced_zombie_producer_writes_nothing(story):
    from confluent_kafka import KafkaError, KafkaException, Producer

    create_topics(story.server, {ZOMBIE: PARTITIONS})
    config = {"bootstrap.servers": story.bootstrap, "transactional.id": "txn-zombie", "linger.ms": 5}
    zombie = Producer(config)
    zombie.init_transactions(WAIT_S)
    zombie.begin_transaction()
    zombie.produce(ZOMBIE, b"zombie-before", partition=0)
    assert zombie.flush(WAIT_S) == 0

    successor = Producer(config)
    successor.init_transactions(WAIT_S)  # a new epoch: the zombie's open transaction is aborted

    # The zombie's next record is refused (INVALID_PRODUCER_EPOCH: an old epoch); librdkafka makes
    # that a fatal error, _FENCED, which flush() raises (confluent-kafka raises a fatal error from
    # the call that serves the delivery report; a delivery callback would see it as a SystemError).
    errors: list[KafkaError] = []
    zombie.produce(ZOMBIE, b"zombie-after", partition=0)
    with pytest.raises(KafkaException) as flush:
        zombie.flush(WAIT_S)
    errors.append(flush.value.args[0])
    with pytest.raises(KafkaException) as commit:
        zombie.commit_transaction(WAIT_S)
    errors.append(commit.value.args[0])
    fenced = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    assert all(e.fatal() and e.code() in fenced for e in errors), errors

    successor.begin_transaction()
    successor.produce(ZOMBIE, b"successor", partition=1)
    assert successor.flush(WAIT_S) == 0
    successor.commit_transaction(WAIT_S)

    # Fenced with nothing in flight: the first request with the old epoch is its EndTxn.
    successor.begin_transaction()
    successor.produce(ZOMBIE, b"successor-open", partition=2)
    assert successor.flush(WAIT_S) == 0
    Producer(config).init_transactions(WAIT_S)
    with pytest.raises(KafkaException) as commit:
        successor.commit_transaction(WAIT_S)
    error = commit.value.args[0]
    assert error.fatal() and error.code() in fenced, error

    assert values_of(consume(story.bootstrap, ZOMBIE, "read_committed")) == {0: [], 1: ["successor"], 2: []}
    # the zombies' open transactions' records are there, aborted; what one sent once fenced is not
    assert values_of(consume(story.bootstrap, ZOMBIE, "read_uncommitted")) == {
        0: ["zombie-before"], 1: ["successor"], 2: ["successor-open"]}


def test_a_zombie_of_an_older_group_generation_cannot_commit_offsets_in_its_transaction(story):
    """KIP-447 with confluent-kafka: the producer sends its consumer's group metadata with the offsets
    (``send_offsets_to_transaction``). Metadata taken before the group rebalanced (a zombie: another
    instance owns the partitions now) is refused with Kafka's ILLEGAL_GENERATION and the transaction
    can only abort; the same job with the current metadata commits its offsets."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    create_topics(story.server, {REBALANCED: PARTITIONS})
    group = "txn-rebalanced-group"
    config = {"bootstrap.servers": story.bootstrap, "group.id": group, "enable.auto.commit": False,
              "isolation.level": "read_committed", "session.timeout.ms": 10_000}
    first = Consumer(config)
    second = Consumer(config)
    producer = Producer({"bootstrap.servers": story.bootstrap, "transactional.id": "txn-rebalanced", "linger.ms": 5})
    story.closers += [first.close, second.close]
    try:
        def assigned(consumers: list[Any], count: int) -> None:
            deadline = time.monotonic() + WAIT_S
            while sum(len(c.assignment()) for c in consumers) != count or any(not c.assignment() for c in consumers):
                assert time.monotonic() < deadline, [c.assignment() for c in consumers]
                for c in consumers:
                    c.poll(0.2)

        first.subscribe([REBALANCED])
        assigned([first], PARTITIONS)
        stale = first.consumer_group_metadata()  # generation 1
        second.subscribe([REBALANCED])
        assigned([first, second], PARTITIONS)  # a rebalance: a later generation, the partitions shared
        producer.init_transactions(WAIT_S)

        producer.begin_transaction()
        producer.produce(REBALANCED, b"zombie", partition=0)
        assert producer.flush(WAIT_S) == 0
        with pytest.raises(KafkaException) as refused:
            producer.send_offsets_to_transaction([TopicPartition(REBALANCED, 0, 1)], stale, WAIT_S)
        error = refused.value.args[0]
        assert error.code() == KafkaError.ILLEGAL_GENERATION and error.txn_requires_abort(), error
        producer.abort_transaction(WAIT_S)

        producer.begin_transaction()
        producer.produce(REBALANCED, b"current", partition=0)
        producer.send_offsets_to_transaction([TopicPartition(REBALANCED, 0, 1)], first.consumer_group_metadata(),
                                             WAIT_S)
        producer.commit_transaction(WAIT_S)
        committed = first.committed([TopicPartition(REBALANCED, 0)], timeout=WAIT_S)
        assert committed[0].offset == 1
    finally:
        producer.flush(10)
    assert values_of(consume(story.bootstrap, REBALANCED, "read_committed")) == {0: ["current"], 1: [], 2: []}


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(story):
    from confluent_kafka import KafkaException, Producer

    create_topics(story.server, {TIMEOUT: PARTITIONS})
    late = Producer({"bootstrap.servers": story.bootstrap, "transactional.id": "txn-late",
                     "transaction.timeout.ms": LATE_TIMEOUT_MS, "linger.ms": 5})
    late.init_transactions(WAIT_S)
    late.begin_transaction()
    for p in range(PARTITIONS):
        late.produce(TIMEOUT, b"late-%d" % p, partition=p)
    assert late.flush(WAIT_S) == 0
    # plain records after the open transaction's: read_committed reaches them once the LSO moves on
    plain = Producer({"bootstrap.servers": story.bootstrap, "acks": "all"})
    for p in range(PARTITIONS):
        plain.produce(TIMEOUT, b"after-%d" % p, partition=p)
    assert plain.flush(WAIT_S) == 0

    after = {p: [f"after-{p}"] for p in range(PARTITIONS)}
    got = consume(story.bootstrap, TIMEOUT, "read_committed", until=lambda got: values_of(got) == after)
    assert values_of(got) == after
    assert values_of(consume(story.bootstrap, TIMEOUT, "read_uncommitted")) == {
        p: [f"late-{p}", f"after-{p}"] for p in range(PARTITIONS)}
    with pytest.raises(KafkaException):  # aborted: it cannot commit any more
        late.commit_transaction(WAIT_S)
    assert "transaction of 'txn-late'" in story.server.log_text() and f"timed out after {LATE_TIMEOUT_MS} ms" in \
        story.server.log_text()


def test_describe_and_list_transactions(story):
    from confluent_kafka import Producer
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TransactionalIdNotFoundError

    create_topics(story.server, {DESCRIBED: PARTITIONS})
    producer = Producer({"bootstrap.servers": story.bootstrap, "transactional.id": "txn-described",
                         "transaction.timeout.ms": 60_000})
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(DESCRIBED, b"described-%d" % p, partition=p)
    assert producer.flush(WAIT_S) == 0

    admin = KafkaAdminClient(bootstrap_servers=story.bootstrap, request_timeout_ms=int(WAIT_S * 1000))
    try:
        ongoing = admin.describe_transactions(["txn-described"])["txn-described"]
        assert str(ongoing.state.value) == "Ongoing", ongoing
        assert ongoing.topic_partitions == {TopicPartition(DESCRIBED, p) for p in range(PARTITIONS)}
        assert ongoing.transaction_timeout_ms == 60_000 and ongoing.producer_id >= 0, ongoing

        listed = {t.transactional_id: t for ts in admin.list_transactions().values() for t in ts}
        assert str(listed["txn-described"].state.value) == "Ongoing"
        assert str(listed["txn-confluent-job"].state.value) == "CompleteCommit"
        assert str(listed["txn-late"].state.value) == "CompleteAbort"
        only_ongoing = {t.transactional_id for ts in admin.list_transactions(state_filters=["Ongoing"]).values()
                        for t in ts}
        assert only_ongoing == {"txn-described"}

        producer.abort_transaction(WAIT_S)
        aborted = admin.describe_transactions(["txn-described"])["txn-described"]
        assert str(aborted.state.value) == "CompleteAbort" and aborted.topic_partitions == set(), aborted
        assert aborted.producer_id == ongoing.producer_id and aborted.producer_epoch == ongoing.producer_epoch
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["txn-never-used"])
    finally:
        admin.close()


def test_the_table_holds_exactly_the_committed_records_each_once(story):
    server = story.server
    server.wait_for(TABLE_READY, WAIT_S * 1.5)
    expected = {
        **{topic_of(f): committed_values(f) for f in FAMILIES},
        PLAIN: [f"plain-{k}" for k in range(PER_TXN)],
        ZOMBIE: ["successor"],
        TIMEOUT: [f"after-{p}" for p in range(PARTITIONS)],
        DESCRIBED: [],
    }
    total = sum(len(v) for v in expected.values())
    topics = ", ".join(f"'{t}'" for t in expected)
    rows = read_table_until(story.data_dir, "SELECT topic, `partition`, `offset`, CAST(value AS STRING) AS v "
                            f"FROM records WHERE topic IN ({topics})", lambda rows: len(rows) >= total,
                            timeout_s=WAIT_S * 1.5)
    keys = [(r["topic"], r["partition"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys)) == total, "a record is in the table twice"
    for topic, values in expected.items():
        assert sorted(r["v"] for r in rows if r["topic"] == topic) == sorted(values), topic
    # each committed record is the row at the offset the read_committed consumer read it from
    for family in FAMILIES:
        got = consume(story.bootstrap, topic_of(family), "read_committed")
        assert sorted((r["partition"], r["offset"], r["v"]) for r in rows if r["topic"] == topic_of(family)) == \
            sorted((p, o, v) for p, records in got.items() for o, v in records), family
    assert server.stop() == 0, server.log_text()[-3000:]
