"""End to end: three broker hosts, leadership through PostgreSQL (``--cluster-leadership database``),
one host killed while idempotent producers and a consumer group run (issue 24), in both ack modes:
with ``--ack-on spark`` the table holds everything acknowledged; with ``--ack-on wal`` the dead
broker's WAL, on the shared volume, holds acknowledged records the table lacks, and the controller
drains it into the table before any partition is taken over.

The hosts are Linux network namespaces on one bridge (``tests.e2e.netns``): each broker is its own
``pipeline serve --node-id I`` in its namespace, listening on that namespace's address, as on a
separate machine, with its own state directory (``DATA_DIR/_pipeline/broker-I``) on the one shared
data directory (the shared volume). The services every host reaches listen on the bridge's
address, on the machine's side: this test's own PostgreSQL (the session's listens on 127.0.0.1
only, which a namespace does not reach) and one Spark Connect server on the data directory's
catalog (the Spark cluster the brokers write through; it replaces the one ``serve --brokers 3``
started, so the run starts no more JVMs than before). The clients run on the machine's side and
reach the brokers through the bridge.

Both modes' clusters run one after the other on the same hosts, shared volume and Connect server
(module-scoped), each with its own metadata database, topic and group.

The kill: the victim is the controller, as the database names it (the broker that also runs the table
maintenance, compaction every 3 s here). Its link goes down, then its process tree gets SIGKILL (the
broker and its decode worker); nothing restarts it until the test does. Its lease runs out
(``broker.session.timeout.ms``, 5 s here), another broker claims the controller and moves the
victim's partitions and group coordinators to the live brokers; once they were seen served elsewhere, its link comes up and it
starts again (a new incarnation), registers, and gets its partitions back.

* the partitions the killed broker led accept produce again while it is down (a record sent to each
  after the kill is acknowledged by a live broker, before the victim restarts); how long after the
  kill is printed, with when the controller moved them and when their new leaders took them over
  (a speed figure, in docs/benchmarks.md, not asserted: issue 24 asks for 15 s);
* the killed broker rejoins and leads partitions again (leadership rebalances); every take-over
  from the kill on continues at the end offset the partition's commits recorded, none reads the table;
* then another broker (neither the controller nor the group's coordinator) is paused (SIGSTOP of
  its tree) while one of its table commits is pending in the database, past its lease, while the
  producers go on, and while that commit's Spark job (the typed topic's dead letters) is in flight on
  the Connect server, which goes on running it: its partitions move, the broker that finds the commit
  pending fences it (moves its staging directory away) before reading the table, so the job lands
  nothing, and the paused broker, resumed, ends fenced and starts again (as its supervisor would);
* then a third broker's link is cut, past its lease, while an idempotent producer inside its own
  namespace (``tests/e2e/inner_producer.py``, reaching only that broker) and the others go on: the
  cut broker ends fenced, and once its link is back it starts again, and the inner producer's
  records are delivered;
* the table maintenance moved with the controller: a broker compacts after the kill (a survivor, or
  the victim's next incarnation when the controller moved to it after the cut);
* afterwards every acknowledged record (from any producer) is in the table exactly once, at the offset its producer was told,
  offsets 0..n-1 per partition in send order per producer, nothing else in the table; the same for
  the typed topic's records in ``dead_letters``;
* a consumer group of two kafkajs and two confluent-kafka members, consuming the whole time, read every record of the table
  in offset order per partition: the first delivery of each offset follows the first delivery of
  the one before it (nothing skipped), and a record is delivered again only to a member that a
  rebalance gave its partition after the record's first delivery (a re-delivery from the
  committed offset after a rebalance), or by a member a rebalance took the partition from, which
  reads on until its next heartbeat tells it so, or after a first delivery by such a member;
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import re
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable

import psutil
import pytest

from pipeline.cluster.membership import OFFSETS_TOPIC, offsets_partition
from pipeline.cluster.service import FENCED_STATUS
from pipeline.metadata.leadership import LeadershipStore
from pipeline.process.lifecycle import die_with_parent
from pipeline.table.layout import RECORDS_TABLE, TABLES_DIR
from pipeline.table.staging import STAGING_DIR
from tests.e2e import netns
from tests.e2e.server_process import reap
from tests.e2e.table_reader import read_table
from tests.e2e.test_transactions import kafkajs_modules
from tests.missing import missing
from tests.postgres import PostgresServer, binaries

# Run alone by make fault-test (pyproject's fault_hosts marker), not by make test: three brokers, a Connect server
# and their clients fill the 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.fault_hosts]

PARTITIONS = 6
PRODUCERS = 2
PER_PRODUCER = 1500
INNER, INNER_COUNT = PRODUCERS, 400
"""The producer inside a cut host's namespace: its id in the records' values, and how many it sends."""
"""Records each producer sends: a third before the kill, a third while the partitions move, a third after
the victim rejoined."""
BROKERS = 3
PORT = 9092
"""Every broker's port, on its own host's address."""
START_TIMEOUT_S = 300.0
"""A broker's start on a loaded 2-core runner (Python, the Connect client, leadership)."""
BROKER_ARGS = ("--linger-ms", "20", "--cluster-leadership", "database",
               "--broker-session-timeout-ms", "5000", "--broker-heartbeat-interval-ms", "1000",
               # table maintenance often enough to see it move with the controller
               "--table-compaction-interval-ms", "3000", "--table-compaction-min-files", "3")
TYPED_CONFIG = {"value.format": "json", "value.schema": "n BIGINT"}
"""The typed topic's configs. Its producer sends values that are not JSON: every one is a dead letter, and
a commit with dead letters writes them with a Spark job on the Connect server (into the broker run's
staging directory, ``TableCatalog._spark_staged``), which the pause below catches in flight."""
COMPACTED = "table maintenance: "
"""What a broker logs when its maintenance compacted partitions (``BatchingPersister._maintain``)."""


@pytest.fixture(scope="module")
def network():
    """Three hosts (network namespaces on one bridge), removed after the module's tests whatever happens."""
    reason = netns.unavailable()
    if reason is not None:
        missing(f"network namespaces: {reason}")
    with netns.network(BROKERS) as made:
        yield made


@pytest.fixture(scope="module")
def bridge_postgres(network):
    """A PostgreSQL server listening on 127.0.0.1 and the bridge's address, trusting the hosts' subnet.

    A server of its own: the session's (``postgres_server``) listens on 127.0.0.1 only, and the
    bridge does not exist when it starts."""
    bin_dir = binaries()
    if bin_dir is None:
        missing("PostgreSQL's initdb is missing (apt-get install postgresql)")
    server = PostgresServer(bin_dir, listen=("127.0.0.1", network.bridge_address), clients=(network.subnet,))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shared_volume(network, tmp_path_factory):
    """The shared data directory and one Spark Connect server on its catalog, listening on the bridge's
    address: the Spark cluster every host's broker writes through. Both ack modes' clusters use it, one
    after the other, each with its own metadata database and topic (one JVM start for both)."""
    from pipeline.persist.spark_cluster import ConnectServer
    from pipeline.table.catalog import catalog_conf

    base = tmp_path_factory.mktemp("failover")
    data_dir = base / "data"
    connect = ConnectServer(base / "spark-connect", conf=catalog_conf(data_dir), host=network.bridge_address,
                            timeout_s=300.0, die_with_parent=True)
    try:
        connect.start()
        yield data_dir, connect
    finally:
        connect.stop()


def _group_coordinated_by_the_controller(url: str, prefix: str, timeout_s: float = 60.0) -> str:
    """A group id ``prefix-N`` whose ``__consumer_offsets`` partition the controller leads (asked of the
    database once it names a controller and has assigned that topic)."""
    deadline = time.monotonic() + timeout_s
    store = LeadershipStore(url)
    try:
        while True:
            controller, rows = store.controller(), store.assignment()
            if controller is not None and any(t == OFFSETS_TOPIC for t, _ in rows):
                for n in range(1000):
                    row = rows.get((OFFSETS_TOPIC, offsets_partition(f"{prefix}-{n}")))
                    if row is not None and row.leader_id == controller[0]:
                        return f"{prefix}-{n}"
            assert time.monotonic() < deadline, f"no controller or no {OFFSETS_TOPIC} assignment: {controller}"
            time.sleep(0.2)
    finally:
        store.close()


def _log_since(broker: HostBroker, offset: int) -> str:
    """The broker's log from byte ``offset`` on."""
    return _text_since(broker.log_path, offset)


def _text_since(path: Path, offset: int) -> str:
    """The file from byte ``offset`` on."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a text file, each cut to 300 characters ("" if it is missing)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(line[:300] for line in text.splitlines()[-lines:])


def _log_lines(broker: HostBroker) -> list[str]:
    """The broker's log, line by line (none if it has no log yet)."""
    try:
        return broker.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []


class _EosLog:
    """A logger for confluent-kafka producers (``logger=``; librdkafka's lines arrive on their ``poll``,
    so their times are when the test polled) writing to ``path``; ``digest()``: its last events that
    can renumber records (``EVENTS``), and how many produce requests timed out."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.logger = logging.getLogger(name)
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self._handler = logging.FileHandler(path)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self.logger.addHandler(self._handler)

    def digest(self, last: int = 30) -> str:
        self._handler.flush()
        lines = self.path.read_text(errors="replace").splitlines()
        events = [line[:300] for line in lines if any(w in line for w in self.EVENTS)]
        timeouts = sum(1 for line in lines if " REQTMOUT " in line and "Timed out ProduceRequest" in line)
        return (f"librdkafka's idempotence events ({self.path}; {timeouts} produce requests timed out), the last "
                f"{last}:\n" + "\n".join(events[-last:]))

    EVENTS = (" ERRSEQ ", " DUPSEQ ", " ERRPID ", " NEWPID ", " IDEMPSTATE ", "drain in state", "fatal", "FATAL")
    """The lines of an event that can renumber records (sequence errors, epoch bumps, fatal errors);
    not the partition drains and request timeouts that every move makes by the hundred."""

    def close(self) -> None:
        self.logger.removeHandler(self._handler)
        self._handler.close()


def _digest(brokers: list[HostBroker], per_broker: int = 25) -> str:
    """Each broker's last ``per_broker`` lines that matter to a failure (warnings, errors, fences,
    moves, take-overs, restarts), short enough that a CI report keeps every broker's."""
    words = (" WARNING ", " ERROR ", "Traceback", "fenced", "leads", "drain", "taking over", "took", "handed",
             "controller (", "registered", "listening on", "--- the test", "pipeline.coordinator.coordinator",
             "refused")
    out = []
    for b in brokers:
        picked = [line[:240] for line in _log_lines(b) if any(w in line for w in words)][-per_broker:]
        out.append(f"--- broker {b.node_id} ({b.fenced_restarts} fenced restarts)\n" + "\n".join(picked))
    return "\n".join(out)


def _move_lines(brokers: list[HostBroker]) -> str:
    """Each broker's log lines on partition moves, WAL drains and reads that found a gap in the table."""
    words = ("leads", "moved", "drain", "hold no offset", "goes on at", "taking over", "took", "handing off",
             "handed off", "adopted",
             "controller (", "fenced", " WARNING ", " ERROR ", COMPACTED)
    out = []
    for b in brokers:  # not "hand": every request handler line (pipeline.requests.handler) has it
        out += [f"broker {b.node_id}: {line[:300]}" for line in _log_lines(b) if any(w in line for w in words)]
    return "\n".join(out[-80:])


class HostBroker:
    """``pipeline serve --node-id I`` in host I's namespace; ``start`` again after a kill (a new incarnation)."""

    def __init__(self, host: netns.Host, node_id: int, data_dir: Path, metadata_url: str, spark_remote: str,
                 ack_on: str, log_dir: Path) -> None:
        self.host = host
        self.node_id = node_id
        self.cmd = host.command(sys.executable, "-m", "pipeline.cli", "serve", "--node-id", str(node_id),
                                "--listen", f"{host.address}:{PORT}", "--data-dir", str(data_dir),
                                "--metadata-url", metadata_url, "--spark-remote", spark_remote,
                                "--ack-on", ack_on, *BROKER_ARGS)
        self.log_path = log_dir / f"broker-{node_id}.log"
        self.proc: subprocess.Popen | None = None
        self.listening = threading.Event()
        self.fenced_restarts = 0
        self.spawns = 0  # processes started (``_spawn``): the first, then one per fenced restart
        """Times it ended fenced (status ``FENCED_STATUS``: its lease ran out, e.g. a start-up too slow
        for its heartbeats on a loaded runner) and was started again, as ``Restart=on-failure`` does
        (deploy/pipeline.service)."""
        self._ending = False  # kill() or stop(): its end is the test's doing, not restarted
        self.restart_gate = threading.Event()
        """Set: a broker that ends fenced is started again at once; cleared: once it is set again (a host
        whose link is down would start a broker that cannot reach the database)."""
        self.restart_gate.set()

    @property
    def address(self) -> str:
        return f"{self.host.address}:{PORT}"

    def start(self) -> None:
        self._ending = False
        threading.Thread(target=self._supervise, args=(self._spawn(),), daemon=True,
                         name=f"broker-{self.node_id}-supervisor").start()

    def _spawn(self) -> subprocess.Popen:
        self.listening = listening = threading.Event()
        with open(self.log_path, "ab") as log:
            # No orphans: SIGKILL when the thread that starts it ends (PR_SET_PDEATHSIG, kept across ip netns
            # exec's exec): the test's thread, or the supervisor's, which outlives what it starts.
            self.proc = proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, process_group=0,
                                                preexec_fn=functools.partial(die_with_parent, os.getpid()))

        def read() -> None:
            for raw in iter(proc.stdout.readline, b""):
                if b"listening on" in raw:
                    listening.set()

        threading.Thread(target=read, daemon=True, name=f"broker-{self.node_id}-stdout").start()
        self.spawns += 1
        return proc

    def _supervise(self, proc: subprocess.Popen) -> None:
        """Start the broker again, from this thread, each time it ends fenced and the test did not end it
        (PR_SET_PDEATHSIG ties a process to the thread that started it: this one waits on it next)."""
        while proc.wait() == FENCED_STATUS and not self._ending and self.proc is proc:
            self.fenced_restarts += 1
            with open(self.log_path, "a") as log:
                log.write(f"--- the test: broker {self.node_id} ended fenced (status {FENCED_STATUS}); "
                          "started again, as its supervisor would\n")
            self.restart_gate.wait()
            if self._ending:
                return
            proc = self._spawn()

    def wait_started_again(self, spawns: int) -> None:
        """Wait for the supervisor to start the broker after its ``spawns``-th process ended fenced (it
        counts the fenced end before it starts the next one), then for that one to listen."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.spawns == spawns:
            assert time.monotonic() < deadline, f"broker {self.node_id} not started again in {START_TIMEOUT_S} s"
            time.sleep(0.1)
        self.wait_listening()

    def wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.listening.wait(1.0):
            assert self.proc.poll() is None, f"broker {self.node_id} exited with {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"broker {self.node_id} not listening in {START_TIMEOUT_S} s\n{self.log()}"

    def tree(self) -> list[psutil.Process]:
        """The broker and every process under it (its decode worker)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL to the whole process tree at once (a host that dies takes everything on it)."""
        self._ending = True
        for process in self.tree():
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(30)

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM (drain, flush, end the lease); the exit status."""
        self._ending = True
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-15000:]
        except OSError:
            return ""


def _serve(brokers: list[HostBroker]):
    """Start ``brokers`` and wait until each listens; (their bootstrap list, an AdminClient on it)."""
    from confluent_kafka.admin import AdminClient

    for b in brokers:
        b.start()
    for b in brokers:
        b.wait_listening()
    bootstrap = ",".join(b.address for b in brokers)
    return bootstrap, AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000})


class ConsumerGroup:
    """One consumer group of four members: two kafkajs consumers in one process
    (``tests/e2e/group_kafkajs.js``, members 0 and 1) and two confluent-kafka consumers in threads here
    (members 2 and 3), all with the round robin assignor under librdkafka's name. Every line a member
    gives, in the order it arrived, with its time (monotonic s): ``{"m", "p", "o", "v"}`` per record,
    ``{"m", "join": [partitions]}`` per assignment, ``{"m", "crash"}`` per kafkajs crash."""

    KAFKAJS_MEMBERS = (0, 1)
    CONFLUENT_MEMBERS = (2, 3)

    def __init__(self, node_modules: Path, bootstrap: str, group: str, topic: str, log_path: Path) -> None:
        script = Path(__file__).with_name("group_kafkajs.js")
        self.log_path = log_path
        self.confluent_log_path = log_path.with_name("confluent-group.log")
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(["node", str(script), str(node_modules), bootstrap, group, topic,
                                          str(len(self.KAFKAJS_MEMBERS))],
                                         stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                         preexec_fn=functools.partial(die_with_parent, os.getpid()))
        self.lines: list[tuple[float, dict]] = []
        self.seen: dict[int, set[int]] = defaultdict(set)
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        threading.Thread(target=self._read, daemon=True, name="kafkajs-group-stdout").start()
        self._confluent = [threading.Thread(target=self._confluent_member, args=(m, bootstrap, group, topic),
                                            daemon=True, name=f"confluent-member-{m}")
                           for m in self.CONFLUENT_MEMBERS]
        for thread in self._confluent:
            thread.start()

    def _add(self, line: dict) -> None:
        with self._changed:
            self.lines.append((time.monotonic(), line))
            if "o" in line:
                self.seen[line["p"]].add(int(line["o"]))
            self._changed.notify_all()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            self._add(json.loads(raw))

    def _confluent_member(self, m: int, bootstrap: str, group: str, topic: str) -> None:
        """A confluent-kafka member until ``stop``: its librdkafka log (the group's protocol errors
        among it) goes to ``confluent_log_path``."""
        import logging

        import confluent_kafka

        logger = logging.getLogger(f"failover.confluent.{self.confluent_log_path}.{m}")  # one per group and member
        logger.propagate = False
        handler = logging.FileHandler(self.confluent_log_path)
        handler.setFormatter(logging.Formatter(f"%(asctime)s member {m} %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)  # librdkafka's "cgrp" debug lines come as DEBUG records
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "roundrobin", "heartbeat.interval.ms": 1000,
            "socket.timeout.ms": 5000, "debug": "cgrp"}, logger=logger)  # session.timeout.ms: 45 s, its default

        def on_assign(_consumer, partitions) -> None:
            self._add({"m": m, "join": sorted(p.partition for p in partitions)})

        consumer.subscribe([topic], on_assign=on_assign)
        try:
            while not self._stopping.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                self._add({"m": m, "p": msg.partition(), "o": str(msg.offset()), "v": msg.value().decode()})
        finally:
            consumer.close()
            logger.removeHandler(handler)
            handler.close()

    def wait_stable(self, partitions: int, timeout_s: float) -> None:
        """Until every member's latest assignment is known and together they hold each of the topic's
        ``partitions`` once: a generation every member synced (the group is Stable)."""
        members = {*self.KAFKAJS_MEMBERS, *self.CONFLUENT_MEMBERS}
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                latest = {line["m"]: line["join"] for _, line in self.lines if "join" in line}
                if set(latest) == members and sorted(p for ps in latest.values() for p in ps) == list(range(partitions)):
                    return
                assert self.proc.poll() is None, f"kafkajs exited with {self.proc.returncode}: {self.stderr()}"
                assert time.monotonic() < deadline, f"the group is not Stable with every member: {latest}"
                self._changed.wait(1.0)

    def wait_for(self, ends: dict[int, int], timeout_s: float) -> None:
        """Until every offset below ``ends[p]`` of each partition ``p`` was consumed."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while any(len(self.seen[p]) < end for p, end in ends.items()):
                assert self.proc.poll() is None, f"kafkajs exited with {self.proc.returncode}: {self.stderr()}"
                missing = {p: end - len(self.seen[p]) for p, end in ends.items()}
                assert time.monotonic() < deadline, (f"the group still misses {missing} records "
                                                     f"({self.progress(ends)}): {self.stderr()}")
                self._changed.wait(1.0)

    def progress(self, ends: dict[int, int]) -> str:
        """One line on each partition the group has not read to ``ends[p]``: the offsets it lacks (ranges),
        when its last record arrived, and the members the group's latest joins gave it to (times in
        monotonic s, as ``self.lines``)."""
        now, parts = time.monotonic(), []
        for p, end in sorted(ends.items()):
            lacking = sorted(set(range(end)) - self.seen[p])
            if not lacking:
                continue
            ranges, start = [], lacking[0]
            for a, b in zip(lacking, lacking[1:] + [None]):
                if b != a + 1:
                    ranges.append(f"{start}-{a}" if a > start else f"{start}")
                    start = b
            last = max((t for t, line in self.lines if line.get("p") == p), default=None)
            owners = [(round(now - t, 1), line["m"]) for t, line in self.lines if p in line.get("join", ())][-3:]
            parts.append(f"p{p} lacks {','.join(ranges)}, last record {'never' if last is None else f'{now - last:.1f} s ago'}, "
                         f"joins giving it (s ago, member) {owners}")
        return "; ".join(parts) + f"; kafkajs logged {self.log_summary()}"

    def log_summary(self) -> str:
        """kafkajs' own log lines above DEBUG, counted by level and message (their start)."""
        counts: dict[str, int] = defaultdict(int)
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if entry.get("level") != "DEBUG":
                counts[f"{entry.get('level')} {str(entry.get('message', ''))[:60]}"] += 1
        return ", ".join(f"{n}x {m}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]))

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._confluent:
            thread.join(60)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def _settled_with(url: str, node_id: int) -> bool:
    """Whether the cluster's leadership (in the database at ``url``) is settled with broker ``node_id``
    leading partitions: every partition served by its leader, and some led by ``node_id``."""
    store = LeadershipStore(url)
    try:
        rows = store.assignment()
    finally:
        store.close()
    return all(row.serving for row in rows.values()) and any(row.leader_id == node_id for row in rows.values())


def _leaders(admin, topic: str, timeout_s: float = 60.0) -> dict[int, int]:
    """Each partition's leader, from a Metadata answer; asked again while a request goes to the dead
    host and times out (``socket.timeout.ms``), and while a partition has no leader (-1: its new leader
    has not taken it over yet, or the answering broker has not read that it has)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = admin.list_topics(topic, timeout=10)
            leaders = {p: m.leader for p, m in md.topics[topic].partitions.items()}
            if min(leaders.values()) >= 0 or time.monotonic() > deadline:
                return leaders
            time.sleep(0.2)
        except KafkaException:
            if time.monotonic() > deadline:
                raise


def _read_from(bootstrap: str, topic: str, starts: dict[int, int], timeout_s: float = 15.0) -> dict[int, str]:
    """What a confluent-kafka consumer outside any group reads of each partition ``p`` from offset
    ``starts[p]`` within ``timeout_s``: how many records, and their first and last offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-diagnosis", "enable.auto.commit": False})
    got: dict[int, list[int]] = {p: [] for p in starts}
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got[msg.partition()].append(msg.offset())
    finally:
        consumer.close()
    return {p: f"{len(o)} records" + (f" {o[0]}-{o[-1]}" if o else "") for p, o in got.items()}


FENCED_COMMIT = "within a table commit: its staging directory"
"""What a broker logs when it fences a commit another broker left pending (``Server._fence_dead_writers``)."""


def _signal_tree(broker: HostBroker, sig: signal.Signals) -> None:
    """``sig`` to the broker's whole process tree (SIGSTOP: a frozen host, a long GC pause)."""
    for process in broker.tree():
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _spark_job_in_flight(data_dir: Path, node_id: int) -> bool:
    """Whether a Spark job writing into broker ``node_id``'s staging directory is in flight on the Connect
    server: Hadoop's FileOutputCommitter keeps the job's ``_temporary`` directory in its output directory
    (``<staging>/spark-<id>``, ``TableCatalog._spark_staged``) from the job's setup to its commit."""
    staging = data_dir / TABLES_DIR / RECORDS_TABLE / STAGING_DIR / f"broker-{node_id}"
    return any(staging.glob("*/spark-*/_temporary"))


def _pause_within_a_commit(broker: HostBroker, url: str, topic: str, produce: Callable[[], None],
                           in_flight: Callable[[], bool] = lambda: True, timeout_s: float = 120.0) -> int:
    """SIGSTOP ``broker``'s process tree while one of its table commits of ``topic`` is pending in the
    database (between ``record_producers`` and ``commit_done``: it holds the tables' lock within a
    commit) and ``in_flight()`` holds, calling ``produce`` between looks so that commits keep coming. A
    stop that came after the commit ended, or when ``in_flight()`` did not hold, is undone and tried
    again. Returns how many tries it took."""
    import psycopg

    query = "SELECT count(*) FROM table_ends WHERE topic = %s AND pending_writer = %s"
    deadline = time.monotonic() + timeout_s
    tries = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            assert time.monotonic() < deadline, f"broker {broker.node_id} was not caught within a commit"
            produce()
            if not conn.execute(query, (topic, broker.node_id)).fetchone()[0]:
                time.sleep(0.005)
                continue
            tries += 1
            _signal_tree(broker, signal.SIGSTOP)
            if conn.execute(query, (topic, broker.node_id)).fetchone()[0] and in_flight():
                return tries
            _signal_tree(broker, signal.SIGCONT)  # the commit ended before the stop: again


def _takeover_times(brokers: list[HostBroker], killed_wall: float, restarted_wall: float,
                    until_wall: float) -> tuple[float, float, int]:
    """From the brokers' logs (``time.time()`` instants): seconds from the kill to the first
    controller move after it and to the last take-over ("leads N more partition(s)") before the
    victim's restart, and how many partitions taken over from the kill to ``until_wall`` had their
    end offset read from the table (not as their commits recorded it)."""
    moved, taken, read = [], [], 0
    for b in brokers:
        for line in b.log_path.read_text(errors="replace").splitlines():
            try:
                when = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            except ValueError:
                continue
            if killed_wall <= when < until_wall and "more partition(s) now" in line:
                found = re.search(r"\((\d+) read from the table", line)
                assert found, line
                read += int(found.group(1))
            if not killed_wall <= when < restarted_wall:
                continue
            if "controller:" in line and "moved" in line:
                moved.append(when - killed_wall)
            elif "more partition(s) now" in line:
                taken.append(when - killed_wall)
    return min(moved, default=float("nan")), max(taken, default=float("nan")), read


@pytest.mark.timeout(1200)  # alone 1.5-2.5 min here; CI's slower machine took ~6 min under make test's load
@pytest.mark.parametrize("ack_on", ["spark", "wal"])
def test_a_killed_hosts_partitions_move_and_come_back_with_every_acknowledged_record_once(tmp_path, network,
                                                                                         bridge_postgres,
                                                                                         shared_volume, ack_on):
    import confluent_kafka
    from confluent_kafka.admin import NewTopic

    node_modules = kafkajs_modules()  # before anything starts: a missing one fails at once
    data_dir, connect = shared_volume  # every host's broker, one directory
    TOPIC, GROUP = f"failover-{ack_on}-orders", f"failover-{ack_on}-readers"  # noqa: N806
    TYPED = f"failover-{ack_on}-typed"  # noqa: N806
    url = bridge_postgres.create_database(f"failover_{ack_on}")
    hosts = network.hosts
    brokers_url = url.replace("@127.0.0.1:", f"@{network.bridge_address}:")
    brokers = [HostBroker(host, i, data_dir, brokers_url, connect.url, ack_on, tmp_path) for i, host in enumerate(hosts)]
    group: ConsumerGroup | None = None
    admin = None
    producers: list = []
    eos: _EosLog | None = None
    try:
        bootstrap, admin = _serve(brokers)
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1),
                                           NewTopic(TYPED, PARTITIONS, 1, config=TYPED_CONFIG)]).values():
            future.result(60)

        # (producer, i) -> (partition, offset, when). The offset is None for a record librdkafka acknowledged
        # implicitly: sent in a request that timed out (to a paused broker that had committed it), then
        # known persisted once a later request of the same producer and partition was acknowledged
        # (rd_kafka_dr_implicit_ack): its delivery report carries no offset.
        acked: dict[tuple[int, int], tuple[int, int | None, float]] = {}
        errors: list[str] = []
        duplicates: list[tuple[int, int]] = []
        lock = threading.Lock()

        def on_delivery(err, msg):
            j, i = (int(x) for x in msg.value().split(b":"))
            with lock:
                if err is not None:
                    errors.append(f"{j}:{i} {err}")
                elif (j, i) in acked:
                    duplicates.append((j, i))
                else:
                    acked[(j, i)] = (msg.partition(), msg.offset(), time.monotonic())

        # A host whose link is down answers nothing: a request to it times out after request.timeout.ms
        # (then the producer reconnects, refreshes its metadata and finds the new leader), well within
        # the 15 s the moved partitions have; an idempotent retry of a batch that did land is answered
        # as a duplicate, with its offset.
        # librdkafka's idempotence events (PID, drains, epoch bumps, sequence errors: debug "eos", a few
        # lines per event) in a file, for a failure's message: an epoch bump renumbers what it has not seen
        # acknowledged, and a record the table already held is then written again.
        eos = _EosLog(tmp_path / "librdkafka-eos.log", f"failover-{ack_on}-librdkafka")
        producers += [confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 300_000, "batch.num.messages": 100, "request.timeout.ms": 5000,
            "socket.timeout.ms": 5000, "debug": "eos"}, logger=eos.logger) for _ in range(PRODUCERS)]
        # The typed topic's producer (last in ``producers``): record i is b"not json <i>", a dead letter, sent
        # to partition i % PARTITIONS; i -> (partition, offset), the offset None when acknowledged implicitly.
        typed_acked: dict[int, tuple[int, int | None]] = {}
        typed_sent = [0]

        def on_typed_delivery(err, msg):
            i = int(msg.value().split(b" ")[-1])
            with lock:
                if err is not None:
                    errors.append(f"typed {i} {err}")
                elif i in typed_acked:
                    duplicates.append((-1, i))
                else:
                    typed_acked[i] = (msg.partition(), msg.offset())

        producers.append(confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 300_000, "request.timeout.ms": 5000, "socket.timeout.ms": 5000}))

        def send_typed() -> None:
            i, typed = typed_sent[0], producers[PRODUCERS]
            typed_sent[0] += 1
            while True:
                try:
                    typed.produce(TYPED, value=b"not json %d" % i, partition=i % PARTITIONS, on_delivery=on_typed_delivery)
                    break
                except BufferError:
                    typed.poll(0.05)
            typed.poll(0)

        def send(j: int, i: int, partition: int | None = None) -> None:
            extra = {} if partition is None else {"partition": partition}
            while True:
                try:
                    producers[j].produce(TOPIC, key=f"key-{i % 24}".encode(), value=f"{j}:{i}".encode(),
                                         on_delivery=on_delivery, **extra)
                    break
                except BufferError:
                    producers[j].poll(0.05)
            producers[j].poll(0)

        def logs() -> str:
            return _digest(brokers)

        def flush(timeout_s: float) -> None:
            for p in producers:
                assert p.flush(timeout_s) == 0, f"undelivered; errors {errors[:5]}\n{logs()}"

        third = PER_PRODUCER // 3
        sent = [0] * PRODUCERS
        for i in range(third):
            for j in range(PRODUCERS):
                send(j, i)
                sent[j] += 1
        flush(180)  # leadership assigned and every partition served, before the kill
        assert not errors, errors[:5]
        # The group, once leadership settled (every partition served): its coordinator is the controller,
        # the broker the test kills (its members must keep their ids when the coordinator moves). It
        # reads from the beginning. Stable with its four members before the kill: a move during the
        # group's first rebalance loses the members that had joined (a coordinator stores a generation
        # once it is complete, as Kafka does), which is not what this checks; what the clients log
        # from then on is.
        GROUP = _group_coordinated_by_the_controller(url, GROUP)  # noqa: N806
        group = ConsumerGroup(node_modules, bootstrap, GROUP, TOPIC, tmp_path / "kafkajs.log")
        group.wait_stable(PARTITIONS, 120)
        stable_at = (group.log_path.stat().st_size, group.confluent_log_path.stat().st_size)
        # The victim: the controller, asked of the database (it also runs the table maintenance).
        store = LeadershipStore(url)
        try:
            controller = store.controller()
            coordinator = store.assignment().get((OFFSETS_TOPIC, offsets_partition(GROUP)))
        finally:
            store.close()
        assert controller is not None, "no controller"
        victim_id = controller[0]
        coordinator_moves = coordinator is not None and coordinator.leader_id == victim_id
        led_by_victim = [p for p, leader in _leaders(admin, TOPIC).items() if leader == victim_id]
        assert led_by_victim, f"the victim, controller {victim_id}, leads no partition"
        # Every broker's log at the kill: what the victim logs from then on is its next incarnation's.
        logged = {b.node_id: b.log_path.stat().st_size for b in brokers}

        victim = brokers[victim_id]
        killed = victim.tree()
        assert len(killed) > 1, f"the victim's decode worker is not running: {killed}"
        hosts[victim_id].set_link(False)  # first: the clients get no reset from the dying host
        victim.kill()
        killed_at, killed_wall = time.monotonic(), time.time()
        # One record per moved partition right at the kill (a producer's next record, which waits for its
        # request to the dead host to time out), then the second third in the background. The link is
        # down: nothing reaches a dying process.
        probes = {p: (0, sent[0] + k) for k, p in enumerate(led_by_victim)}
        for p, (j, i) in probes.items():
            send(j, i, partition=p)
        sent[0] += len(probes)
        probed_after = time.monotonic() - killed_at
        # SIGKILL is delivered at once but a loaded machine runs the dying process a little later.
        _, alive = psutil.wait_procs(killed, timeout=30)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
        for _ in range(third):
            for j in range(PRODUCERS):
                send(j, sent[j])
                sent[j] += 1
        flush(240)
        assert not errors, errors[:5]
        moved_after = {p: acked[probe][2] - killed_at for p, probe in probes.items()}
        assert {acked[probe][0] for probe in probes.values()} == set(led_by_victim)
        moved = _leaders(admin, TOPIC)
        assert all(moved[p] not in (victim_id, -1) for p in led_by_victim), moved

        # The host comes back: link up, a new incarnation of its broker; once registered it gets its
        # partitions back.
        hosts[victim_id].set_link(True)
        restarted_wall = time.time()
        victim.start()
        victim.wait_listening()
        deadline = time.monotonic() + 120
        while victim_id not in _leaders(admin, TOPIC).values():
            assert time.monotonic() < deadline, f"leadership did not rebalance\n{logs()}"
            time.sleep(0.5)
        # What the victim leads again (the pause and the cut below may move it once more).
        rejoined = [p for p, leader in _leaders(admin, TOPIC).items() if leader == victim_id]

        # A broker paused within a table commit past its lease, while the producers go on (issue 34): one
        # that is neither the controller nor the group's coordinator now, stopped (SIGSTOP, its whole
        # tree) while its commit is pending in the database. Its partitions move; their new leaders
        # (or, with --ack-on wal, the controller draining its WAL) find the commit pending and fence
        # it (its staging directory moved away) before they read the table. Then it wakes (SIGCONT),
        # finds its lease gone, ends fenced and is started again.
        store = LeadershipStore(url)
        try:
            others = {controller_now[0] for controller_now in [store.controller()] if controller_now is not None}
            coordinator_now = store.assignment().get((OFFSETS_TOPIC, offsets_partition(GROUP)))
            others |= {coordinator_now.leader_id} if coordinator_now is not None else set()
        finally:
            store.close()
        leading = set(_leaders(admin, TOPIC).values()) & set(_leaders(admin, TYPED).values())
        paused = next(b for b in sorted(brokers, key=lambda b: (b.node_id in others, b.node_id))
                      if b.node_id in leading)
        paused_logged = {b.node_id: b.log_path.stat().st_size for b in brokers}

        def produce_one() -> None:  # ~100 records/s from each producer until the pause: commits keep coming
            for j in range(PRODUCERS):
                send(j, sent[j])
                sent[j] += 1
            send_typed()
            time.sleep(0.01)

        # Caught with its commit's Spark job (the typed topic's dead letters) in flight on the Connect
        # server (issue 34): the job runs on there while the broker is paused and after it lost its lease.
        tries = _pause_within_a_commit(paused, url, TYPED, produce_one,
                                       in_flight=lambda: _spark_job_in_flight(data_dir, paused.node_id))
        paused_wall = time.time()
        for _ in range(third):  # and on while it is paused: its partitions' records wait for their move
            produce_one()
        deadline = time.monotonic() + 120
        while not any(FENCED_COMMIT in _log_since(b, paused_logged[b.node_id]) for b in brokers if b is not paused):
            assert time.monotonic() < deadline, f"the paused broker's pending commit was not fenced\n{logs()}"
            time.sleep(0.5)
        fenced_before, spawns = paused.fenced_restarts, paused.spawns
        _signal_tree(paused, signal.SIGCONT)
        deadline = time.monotonic() + 120
        while paused.fenced_restarts == fenced_before:
            assert time.monotonic() < deadline, f"the paused broker did not end fenced once resumed\n{logs()}"
            time.sleep(0.2)
        paused.wait_started_again(spawns)
        # Its return moves partitions back to it (the controller spreads them over the live brokers):
        # once every partition is served again, it leading some, and every record of the outer
        # producers is acknowledged, the cluster is settled; the cut below is then the only change the
        # inner producer meets (a rebalance's hand-offs and take-overs took it 25 s to its first 20
        # acknowledgements here, and more than 60 s in a CI run).
        # (CI's machine took more than 120 s: a take-over's read of the table there took 30 s.)
        deadline = time.monotonic() + 300
        while not _settled_with(url, paused.node_id):
            assert time.monotonic() < deadline, f"broker {paused.node_id} leads nothing again in 300 s\n{logs()}"
            time.sleep(0.5)
        flush(180)
        print(f"broker {paused.node_id} paused within a commit, its Spark job in flight on the Connect server "
              f"({tries} tries), fenced by "
              f"{[b.node_id for b in brokers if FENCED_COMMIT in _log_since(b, paused_logged[b.node_id])]}, "
              f"resumed, ended fenced and started again")

        # A broker cut off from the network past its lease while it runs, with a producer inside its own
        # namespace going on (issue 34): the one with the lowest id that was not paused and leads
        # partitions. Only its own broker answers the inner producer while the link is down; the broker
        # stops acknowledging a margin before its lease could run out, ends fenced, and is started again
        # once its link is back (its host's service manager would start it at once, and it would wait
        # for the database).
        leading = set(_leaders(admin, TOPIC).values())
        cut = next(b for b in brokers if b is not paused and b.node_id in leading)
        inner_lines: list[dict] = []
        inner_log_path = tmp_path / "inner-producer.log"  # librdkafka's log (debug "eos,broker,msg")
        with inner_log_path.open("wb") as inner_log:
            inner = subprocess.Popen(cut.host.command(sys.executable,
                                                      str(Path(__file__).with_name("inner_producer.py")),
                                                      cut.address, TOPIC, str(INNER), str(INNER_COUNT)),
                                     stdout=subprocess.PIPE, stderr=inner_log, stdin=subprocess.DEVNULL,
                                     preexec_fn=functools.partial(die_with_parent, os.getpid()))

        def read_inner() -> None:
            for raw in iter(inner.stdout.readline, b""):
                inner_lines.append(json.loads(raw))

        threading.Thread(target=read_inner, daemon=True, name="inner-producer-stdout").start()
        try:
            inner_started = time.monotonic()
            deadline = inner_started + 120
            while len(inner_lines) < 20:  # it produces, and its broker acknowledges, before the cut
                assert inner.poll() is None and time.monotonic() < deadline, (
                    f"the inner producer had {len(inner_lines)} records acknowledged in 120 s: {inner_lines[:5]}\n"
                    f"its log's last lines:\n{_tail(inner_log_path, 40)}\n{logs()}")
                time.sleep(0.1)
            inner_acked_s = time.monotonic() - inner_started
            fenced_before, spawns = cut.fenced_restarts, cut.spawns
            cut.restart_gate.clear()
            hosts[cut.node_id].set_link(False)
            cut_acked = len(inner_lines)
            deadline = time.monotonic() + 120
            while cut.fenced_restarts == fenced_before:  # the outer producers go on meanwhile
                assert time.monotonic() < deadline, f"the cut broker did not end fenced\n{logs()}"
                produce_one()
            fenced_after = len(inner_lines)
            hosts[cut.node_id].set_link(True)
            cut.restart_gate.set()
            cut.wait_started_again(spawns)
            assert inner.wait(300) == 0, f"the inner producer left records undelivered: {inner_lines[-5:]}"
        finally:
            if inner.poll() is None:
                inner.kill()
                inner.wait()
        with lock:
            for line in inner_lines:
                if "err" in line:
                    errors.append(f"{INNER}:{line['i']} {line['err']}")
                elif (INNER, line["i"]) in acked:
                    duplicates.append((INNER, line["i"]))
                else:
                    acked[(INNER, line["i"])] = (line["p"], line["o"], time.monotonic())
        print(f"broker {cut.node_id} cut off: the producer inside its namespace had {cut_acked} records "
              f"acknowledged before the cut (20 in {inner_acked_s:.1f} s), {fenced_after - cut_acked} after it until the broker ended fenced, "
              f"{len(inner_lines)} in all")
        flush(240)
        assert not errors, errors[:5]
        assert not duplicates, f"{duplicates[:5]}\n{eos.digest()}"
        assert len(acked) == sum(sent) + INNER_COUNT
        assert rejoined and any(acked[k][0] in rejoined and acked[k][2] > killed_at for k in acked)

        # The group's members and the coordinator's moves (away with the kill, back after the victim's
        # return): how often each client family heard UNKNOWN_MEMBER_ID (the stored membership carries the
        # members over; the rules are tested in tests/coordinator).
        unknown = sum(1 for line in _text_since(group.log_path, stable_at[0]).splitlines()
                      if "not aware of this member" in line)
        confluent_unknown = sum(1 for line in _text_since(group.confluent_log_path, stable_at[1]).splitlines()
                                if "Unknown member" in line)
        expired = [line for b in brokers for line in _log_lines(b)
                   if f"group {GROUP}: member " in line and "no heartbeat for its session" in line]
        print(f"group {GROUP}: coordinator {'moved with the kill' if coordinator_moves else 'elsewhere'}; "
              f"UNKNOWN_MEMBER_ID heard by kafkajs {unknown} times, by confluent-kafka {confluent_unknown} times; "
              f"members whose session ran out at a coordinator: {len(expired)}")
        # Every member keeps its id across the moves (the Must-show): the coordinator that loads
        # the group restores its members' sessions (Kafka's loadGroup), and each client reaches a
        # coordinator within its session (see group_kafkajs.js for kafkajs' settings).
        assert unknown == confluent_unknown == 0 and not expired, (
            f"members unknown to a coordinator: {expired[:4]}\n{_digest(brokers)}")

        # The table maintenance moved with the controller: a broker compacted since the kill. A survivor,
        # or the victim's next incarnation: the cut above may have fenced the controller that followed
        # the victim, and the controller after it can be the victim come back.
        deadline = time.monotonic() + 60
        while not any(COMPACTED in _log_since(b, logged[b.node_id]) for b in brokers):
            assert time.monotonic() < deadline, f"no table maintenance since the controller's kill\n{logs()}"
            time.sleep(1)

        ends: dict[int, int] = defaultdict(int)
        for p, o, _ in acked.values():
            if o is not None:  # an implicitly acknowledged record is below a later one's offset
                ends[p] = max(ends[p], o + 1)
        try:
            group.wait_for(ends, 180)
        except AssertionError as e:
            # Whether the brokers serve what kafkajs lacks: another client reads it from the first offset missing.
            lacking = {p: min(set(range(end)) - group.seen[p]) for p, end in ends.items() if len(group.seen[p]) < end}
            # What matters most last: a CI report keeps the failure's end.
            raise AssertionError(f"the brokers' lines on moves and gaps:\n{_move_lines(brokers)}\n"
                                 f"leaders now {_leaders(admin, TOPIC)}; acknowledged ends {dict(ends)}; "
                                 f"librdkafka reads {_read_from(bootstrap, TOPIC, lacking)}\n{e}") from None
        group.stop()
        producers.clear()  # destroyed with the admin client: no reconnect attempts to the brokers stopping now
        admin = None

        for b in brokers:
            assert b.stop() == 0, logs()
    finally:
        # The clients go first, even on a failure (the traceback keeps this frame): once the namespaces
        # are removed their addresses would be looked for off this machine.
        producers.clear()
        admin = None
        if group is not None:
            group.stop()
        if eos is not None:
            eos.close()
        for b in brokers:
            b._ending = True  # not started again by its supervisor thread
            if b.proc is not None and b.proc.poll() is None:
                reap(b.tree(), 0)

    rows = read_table(data_dir, f"SELECT partition, offset, CAST(value AS STRING) AS v FROM records "
                                f"WHERE topic = '{TOPIC}'", remote=connect.url)
    table = {(r["partition"], r["offset"]): r["v"] for r in rows}
    assert len(rows) == len(table), "an offset is written twice"
    told = {(p, o): f"{j}:{i}" for (j, i), (p, o, _) in acked.items() if o is not None}
    implicit = {f"{j}:{i}": p for (j, i), (p, o, _) in acked.items() if o is None}
    # Each record at the offset its producer was told, each implicitly acknowledged one once at an offset no
    # other record was told, and nothing else.
    # Each failure names its records in short (a count and the first 10), then the brokers' and librdkafka's
    # lines: a CI report keeps a message's start and end, and cut them out of pytest's diff of two long lists.
    wrong = sorted((k, table.get(k), v) for k, v in told.items() if table.get(k) != v)
    assert not wrong, (f"{len(wrong)} acknowledged record(s) not at their offset ((partition, offset), the table's, "
                       f"told), first {wrong[:10]}\n{_digest(brokers)}\n{eos.digest()}")
    rest = {k: v for k, v in table.items() if k not in told}
    extra = sorted((Counter(rest.values()) - Counter(implicit.keys())).elements())
    lost = sorted((Counter(implicit.keys()) - Counter(rest.values())).elements())
    assert not extra and not lost, (
        f"{len(extra)} record(s) in the table at an offset no producer was told (a record twice, or one never "
        f"acknowledged), first {extra[:10]} at {sorted(k for k, v in rest.items() if v in set(extra[:10]))}; "
        f"{len(lost)} acknowledged implicitly and missing, first {lost[:10]}\n{_digest(brokers)}\n{eos.digest()}")
    assert all(implicit[v] == p for (p, _), v in rest.items()), "an implicitly acknowledged record elsewhere"
    print(f"the table: {len(table)} records, each once, {len(implicit)} of them acknowledged without an offset "
          f"(implicitly, after a request to the paused broker timed out)")
    by_partition: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for (p, o), v in table.items():
        j, i = (int(x) for x in v.split(":"))
        by_partition[p].append((o, j, i))
    for p, entries in by_partition.items():
        entries.sort()
        assert [o for o, _, _ in entries] == list(range(len(entries))), f"partition {p}: a gap in the offsets"
        for j in range(PRODUCERS + 1):  # and the inner producer's
            mine = [i for _, jj, i in entries if jj == j]
            assert mine == sorted(mine), f"partition {p}: producer {j}'s records out of order"

    # The typed topic's records, all dead letters, some written by the paused broker's fenced Spark job:
    # each acknowledged one once in dead_letters at its offset (an implicitly acknowledged one once at an
    # offset no other was told), offsets gapless per partition, in send order.
    dead = read_table(data_dir, f"SELECT partition, offset, CAST(value AS STRING) AS v FROM dead_letters "
                                f"WHERE topic = '{TYPED}'", remote=connect.url)
    letters = {(r["partition"], r["offset"]): int(r["v"].split(" ")[-1]) for r in dead}
    assert len(dead) == len(letters), "a dead letter's offset is written twice"
    told_typed = {(p, o): i for i, (p, o) in typed_acked.items() if o is not None}
    wrong = sorted((k, letters.get(k), i) for k, i in told_typed.items() if letters.get(k) != i)
    assert not wrong, f"{len(wrong)} typed record(s) not at their offset, first {wrong[:10]}\n{_digest(brokers)}"
    rest_typed = sorted(i for k, i in letters.items() if k not in told_typed)
    implicit_typed = sorted(i for i, (_, o) in typed_acked.items() if o is None)
    assert rest_typed == implicit_typed, (f"dead letters at offsets no producer was told {rest_typed[:10]}, "
                                          f"acknowledged implicitly {implicit_typed[:10]}\n{_digest(brokers)}")
    for p in range(PARTITIONS):
        entries = sorted((o, i) for (pp, o), i in letters.items() if pp == p)
        assert [o for o, _ in entries] == list(range(len(entries))), f"{TYPED}-{p}: a gap in the offsets"
        assert [i for _, i in entries] == sorted(i for _, i in entries), f"{TYPED}-{p}: out of send order"
    print(f"dead_letters: {len(letters)} records of {TYPED}, each once")

    # The consumer group, from its lines in the order they happened (kept beside the brokers' logs).
    with open(tmp_path / "kafkajs-lines.jsonl", "w") as f:
        f.writelines(json.dumps({"t": round(t - killed_at, 3), **line}) + "\n" for t, line in group.lines)
    first: dict[tuple[int, int], int] = {}  # (partition, offset) -> index of its first delivery
    by_owner: dict[tuple[int, int], bool] = {}  # whether the member of that first delivery owned the partition
    next_offset: dict[int, int] = defaultdict(int)
    assigned: dict[tuple[int, int], int] = {}  # (member, partition) -> index of the join that gave it the partition
    owner: dict[int, int] = {}  # partition -> the member the latest join gave it to
    redelivered = 0
    for index, (_, line) in enumerate(group.lines):
        if "join" in line:
            for p in line["join"]:
                assigned[(line["m"], p)] = index
                owner[p] = line["m"]
        if "o" not in line:
            continue
        m, p, o = line["m"], line["p"], int(line["o"])
        assert table.get((p, o)) == line["v"], f"consumed {p}/{o} = {line['v']!r}, the table has {table.get((p, o))!r}"
        if (p, o) in first:
            # A re-delivery (Kafka's at-least-once across a rebalance) comes either from the committed
            # offset, to a member a rebalance gave the partition after the record's first delivery, or
            # from a member a rebalance took the partition from (the group gave it to another one)
            # that reads on until its next heartbeat tells it so (seen in CI: removed from the group,
            # a member re-read an offset its successor had read).
            # Or the first delivery was by a member a rebalance had already taken the partition from
            # (removed from the group for a missed session timeout, it read on until it heard).
            assert assigned.get((m, p), -1) > first[(p, o)] or owner.get(p, m) != m or not by_owner[(p, o)], (
                f"{p}/{o} delivered again to member {m}, which still owns partition {p}, without a rebalance "
                f"giving it the partition since")
            redelivered += 1
        else:
            assert o == next_offset[p], f"partition {p}: offset {o} consumed before {next_offset[p]} (skipped)"
            first[(p, o)] = index
            by_owner[(p, o)] = owner.get(p, m) == m
            next_offset[p] = o + 1
    assert set(first) == set(table), "the group did not consume every record of the table"
    crashes = sorted({line["crash"][:80] for _, line in group.lines if "crash" in line})
    moved_at, taken_at, ends_read = _takeover_times(brokers, killed_wall, restarted_wall, paused_wall)
    print(f"after the kill: partitions moved by the controller at {moved_at:.1f} s, taken over by their "
          f"new leaders at {taken_at:.1f} s ({ends_read} end offsets read from the table), served (probe sent "
          f"at {probed_after:.2f} s, acknowledged) at {max(moved_after.values()):.1f} s; "
          f"group (kafkajs and confluent-kafka): "
          f"{len(first)} records, {redelivered} re-delivered after a rebalance, "
          f"{sum(1 for _, line in group.lines if 'join' in line)} joins, "
          f"{sum(1 for _, line in group.lines if 'crash' in line)} crashes {crashes}; "
          f"fenced restarts {[b.fenced_restarts for b in brokers]}")
    # Every take-over from the kill to the pause (the moved partitions, then their return) continued at the
    # end the partition's commits (or the dead broker's WAL drain) recorded in the database: no table read.
    assert ends_read == 0, f"{ends_read} take-over(s) read their end offset from the table\n{_move_lines(brokers)}"


EOS_KILL_AFTER = 5
"""Transactions committed before the coordinator is killed."""
EOS_CLIENTS = {"socket.timeout.ms": 5000, "request.timeout.ms": 5000}
"""A paused broker answers nothing: its requests time out in 5 s, not librdkafka's 30-60 s."""


def _positions(bootstrap: str, topic: str, values: set[bytes], timeout_s: float = 60.0) -> list[tuple[int, int]]:
    """(partition, offset) of each record of ``topic``'s 3 partitions whose value is in ``values``, as a
    read_uncommitted consumer reads them from the partitions' starts to their ends (a failure's evidence:
    records a read_committed read missed)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-positions",
                       "isolation.level": "read_uncommitted", "enable.auto.commit": False,
                       "enable.partition.eof": True})
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    found: list[tuple[int, int]] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(at_end) < 3 and time.monotonic() < deadline:
        for msg in reader.consume(1000, 1.0):
            if msg.error() is None:
                at_end.discard(msg.partition())
                if msg.value() in values:
                    found.append((msg.partition(), msg.offset()))
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
    reader.close()
    return sorted(found)


def _watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Partition -> (high watermark, last stable offset) of ``topic``'s 3 partitions, as ListOffsets
    answers them at each isolation level (a failure's evidence: a last stable offset that stays behind)."""
    from confluent_kafka import Consumer, TopicPartition

    ends: dict[str, dict[int, int]] = {}
    for isolation in ("read_uncommitted", "read_committed"):
        client = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-watermarks",
                           "isolation.level": isolation})
        ends[isolation] = {p: client.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(3)}
        client.close()
    return {p: (ends["read_uncommitted"][p], ends["read_committed"][p]) for p in range(3)}


def _leader_of(url: str, topic: str, partition: int) -> int:
    """The leader of ``topic``-``partition`` as the database names it (-1: no row)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT leader_id FROM partition_leaders WHERE topic = %s AND partition = %s",
                           (topic, partition)).fetchone()
    return -1 if row is None else int(row[0])


@pytest.mark.timeout(1200)
def test_exactly_once_consume_transform_produce_across_a_killed_and_a_paused_transaction_coordinator(
        tmp_path, network, bridge_postgres, shared_volume):
    """Issue 35 on three hosts with leadership through PostgreSQL (``--ack-on wal``): a confluent-kafka
    consume-transform-produce loop (``send_offsets_to_transaction``, read_committed) runs while the broker
    that coordinates its transactional id, as the database names it, is killed (SIGKILL of its tree, then
    started again), then while the broker coordinating it then is paused (SIGSTOP) past its lease and
    resumed (it ends fenced and starts again). Every input record's transform is read exactly once by a
    read_committed consumer and is in the table exactly once, nothing else is (nothing aborted), and the
    group's committed offsets are the input's ends."""
    from confluent_kafka.admin import NewTopic

    from tests.e2e.test_brokers import EosLoop, _eos_inputs, _eos_loop, _read_committed

    data_dir, connect = shared_volume
    source, sink, job, tid = "eos-failover-in", "eos-failover-out", "eos-failover-job", "eos-failover-txn"
    url = bridge_postgres.create_database("eos_failover")
    brokers_url = url.replace("@127.0.0.1:", f"@{network.bridge_address}:")
    brokers = [HostBroker(host, i, data_dir, brokers_url, connect.url, "wal", tmp_path)
               for i, host in enumerate(network.hosts)]
    loop = EosLoop()
    worker: threading.Thread | None = None
    try:
        bootstrap, admin = _serve(brokers)
        for future in admin.create_topics([NewTopic(t, 3, 1) for t in (source, sink)]).values():
            future.result(60)
        inputs, ends = _eos_inputs(bootstrap, source)
        del admin

        started = time.monotonic()
        deadline = started + 600
        gate = threading.Event()
        gate.set()
        worker = threading.Thread(target=_eos_loop, name="eos-loop", daemon=True,
                                  args=(bootstrap, tid, job, ends, deadline, loop, (source, sink), EOS_CLIENTS, gate))
        worker.start()
        coordinated_by = functools.partial(_leader_of, url, OFFSETS_TOPIC, offsets_partition(tid))

        def commits_reach(n: int) -> None:
            while len(loop.commits) < n and worker.is_alive():
                assert time.monotonic() < deadline, f"{len(loop.commits)} commits\n{_move_lines(brokers)}"
                time.sleep(0.01)
            assert len(loop.commits) >= n, f"{loop.error!r}\n{_move_lines(brokers)}"

        # 1. the coordinator killed, then started again once a transaction committed without it (the loop
        # waits meanwhile, so that transactions are left for the pause)
        commits_reach(EOS_KILL_AFTER)
        victim = brokers[coordinated_by()]
        victim.kill()
        killed_at = time.monotonic()
        commits_reach(len(loop.commits) + 1)
        first_after_kill = loop.commits[-1] - killed_at
        gate.clear()
        assert coordinated_by() != victim.node_id
        victim.start()
        victim.wait_listening()
        gate.set()

        # 2. the coordinator then paused past its lease (5 s), then resumed: it ends fenced and starts again
        commits_reach(len(loop.commits) + 2)
        paused = brokers[coordinated_by()]
        spawns = paused.spawns
        _signal_tree(paused, signal.SIGSTOP)
        paused_at = time.monotonic()
        commits_reach(len(loop.commits) + 1)
        first_after_pause = loop.commits[-1] - paused_at
        _signal_tree(paused, signal.SIGCONT)
        paused.wait_started_again(spawns)

        worker.join(max(0.0, deadline + 120 - time.monotonic()))
        assert not worker.is_alive(), f"the loop hangs\n{_move_lines(brokers)}"
        print(f"\nEOS loop on 3 hosts: {len(loop.commits)} transactions committed, {loop.aborts} aborted, "
              f"{len(loop.retries)} retriable errors retried, in {time.monotonic() - started:.1f} s; first commit "
              f"{first_after_kill:.1f} s after the coordinator's kill, {first_after_pause:.1f} s after the pause")
        print(f"EOS loop: abortable errors {loop.abortable[:5]}, retried {loop.retries[:5]}, "
              f"delivery errors {loop.delivery_errors[:3]}, consumer errors {loop.consumer_errors[:3]}")
        assert loop.error is None, f"{loop.error!r}\n{_move_lines(brokers)}"
        assert {tp.partition: tp.offset for tp in loop.committed if tp.topic == source} == ends

        # a read_committed consumer reads each input record's transform exactly once, with its key
        read = _read_committed(bootstrap, sink, "eos-failover-verify")
        expected = {value + b"-out": key for value, (key, _p, _o) in inputs.items()}
        assert len(read) == len(dict(read)), f"{len(read) - len(dict(read))} transforms read more than once"
        missing = set(expected) - dict(read).keys()
        assert not missing, (f"{len(missing)} missing from the read_committed read; a read_uncommitted read finds "
                             f"them at (partition, offset) {_positions(bootstrap, sink, missing)}; (high watermark, "
                             f"last stable offset) by partition: {_watermarks(bootstrap, sink)}\n"
                             f"{_move_lines(brokers)}")
        assert dict(read) == expected
        for b in brokers:
            assert b.stop() == 0, _digest(brokers)
    finally:
        for b in brokers:
            b._ending = True
            if b.proc is not None and b.proc.poll() is None:
                reap(b.tree(), 0)

    # the table holds each transform once and nothing else: no aborted transaction's record
    rows = read_table(data_dir, f"SELECT partition, offset, key, value FROM records WHERE topic = '{sink}'",
                      remote=connect.url)
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)) == len(expected), \
        f"{len(values)} rows, {len(values) - len(set(values))} duplicates, {len(expected) - len(set(values))} missing"
    assert {bytes(r["value"]): bytes(r["key"]) for r in rows} == expected
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(expected)
