"""The compatibility matrix (issue 22): every client generation against one shared server.

One ``pipeline serve`` for the module, with a ``PLAINTEXT`` and a ``SASL_SSL`` listener
(certificates made by trustme, the SCRAM user added with ``pipeline users add --password-stdin``
before the start). Each client of ``tests/compat/envs.CLIENTS`` runs its family's driver
(``driver_*.py`` / ``driver_kafkajs.js``) from its own cached environment, four drivers at a time,
and attempts, on topics and a group of its own (``compat-<client>-<capability>``):

* ``produce``: 20 records, acks=all, idempotence off;
* ``idempotent``: the same with the client's idempotent producer;
* ``group-consume``: 20 records this module produced, through a consumer group, offsets committed;
* ``scram-tls``: produce 20 records over SASL_SSL with SCRAM-SHA-512 and read them back over it;
* ``create-topic``: CreateTopics with 3 partitions through the client's admin api;
* ``transactions``: a transactional producer commits 3 records and aborts 2, then a
  ``read_committed`` consumer reads the partition.

A cell is ✅ only when the driver reports success and this module's own checks agree: the
partition holds exactly the values in order (raw Fetch, ``tests/compat/reference.py``), an
idempotent producer's batches carry a producer id and sequence, the group consumed the values
and committed offset 20, the topic has 3 partitions, a ``read_committed`` read sees only the
committed records and a ``read_uncommitted`` one the aborted too. A client without a capability
says ``limitation: ...``; those are listed in ``EXPECTED_LIMITATIONS`` with the reason, and any
other ❌ fails the test, except transactions while the broker does not advertise EndTxn
(issue 22, item 2): then the cell is the client's real attempt and the error it reported.

The matrix is written to ``docs/compatibility.md`` (committed) before the assertions, so a
failing run still shows its table.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
import trustme

from tests.compat import envs
from tests.compat.driver_common import CAPABILITIES
from tests.compat.reference import advertised_apis, partition_count, read_partition, values
from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

N = 20
USER, PASSWORD, MECHANISM = "compat", "pw-compat-matrix", "SCRAM-SHA-512"
TIMEOUT_S = 60  # one capability of one client (a driver bounds each of its steps by it)
TXN_TIMEOUT_S = 15  # the transactional steps: refused today, so a client that retries stops here
DRIVER_TIMEOUT_S = 6 * TIMEOUT_S
PARALLEL = 4  # drivers at a time: 2 cores, the server's Spark JVM and up to 4 client processes
END_TXN = 26  # api key; transactions are served once the broker advertises it (issue 22, item 2)
DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
ADDRESS = re.compile(r"127\.0\.0\.1:\d+")
LISTENER_LINE = re.compile(r"listening on (\S+):(\d+) \((\w+), (\w+)\)")

COLUMNS = {
    "produce": "produce",
    "idempotent": "idempotent produce",
    "group-consume": "group consume",
    "scram-tls": "SCRAM-SHA-512 over TLS",
    "create-topic": "admin create-topic",
    "transactions": "transaction commit + abort, read_committed",
}

EXPECTED_LIMITATIONS = {
    # (client key, capability): why that client cannot; its driver must say "limitation: ..."
    ("kafka-python-2.0.2", "idempotent"): "kafka-python 2.0.2 has no idempotent producer (since 2.2.0)",
    ("kafka-python-2.0.2", "transactions"): "kafka-python 2.0.2 has no transactional producer (since 2.2.0)",
    ("aiokafka-0.7.0", "create-topic"): "aiokafka 0.7.0 has no admin client (aiokafka.admin came with 0.8.0)",
    ("kcat-1.7.1", "create-topic"): "kcat sends no admin requests",
}
COMMIT_ONLY = {"kcat-1.7.1"}  # kcat's transactional producer commits at exit and cannot abort


def expected_values(client: envs.Client, capability: str, n: int = N) -> list[str]:
    """What ``driver_common.values_for`` produces for ``client`` (the drivers' input names the key)."""
    return [f"{client.key}-{capability}-{i}" for i in range(n)]


def topic(client: envs.Client, capability: str) -> str:
    return f"compat-{client.key}-{capability}"


@dataclass
class Cell:
    ok: bool
    reason: str = ""


class Endpoint(Protocol):
    """A broker ``check`` reads back from: ``Compat``'s server, or a cluster's partition leader
    (``tests/compat/test_matrix_cluster.py``)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class DriverInputs(Protocol):
    """Writes a client's driver input file (``Compat``; the cluster's matrix has its own)."""

    def driver_input(self, client: envs.Client) -> Path: ...


def driver_input_file(path: Path, client: envs.Client, *, plaintext: str, sasl_ssl: str, ca: Path,
                      topics: dict[str, str], group: str, transactional_id: str,
                      capabilities: tuple[str, ...] = CAPABILITIES, user: str = USER, password: str = PASSWORD,
                      mechanism: str = MECHANISM) -> Path:
    """``path``: a driver's input (``driver_common``'s docstring), readable by this user alone."""
    path.write_text(json.dumps({
        "client": client.key, "plaintext": plaintext, "sasl_ssl": sasl_ssl, "ca": str(ca),
        "user": user, "password": password, "mechanism": mechanism, "n": N,
        "topics": topics, "group": group, "transactional_id": transactional_id, "timeout_s": TIMEOUT_S,
        "txn_timeout_s": TXN_TIMEOUT_S, "capabilities": list(capabilities),
    }))
    path.chmod(0o600)  # it may hold the SCRAM password
    return path


class Compat:
    """The shared server: ``host``, the PLAINTEXT and SASL_SSL ports, the CA file."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        ca = trustme.CA()
        self.ca = tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        keystore = tmp / "server.pem"
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(keystore))
        self.data_dir = tmp / "data"
        added = subprocess.run([sys.executable, "-m", "pipeline.cli", "users", "add", USER, "--password-stdin",
                                "--mechanism", MECHANISM, "--data-dir", str(self.data_dir)],
                               input=PASSWORD + "\n", capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr
        # group.initial.rebalance.delay.ms=0: each client's groups have one member; the default 3 s
        # wait for more would only add to the matrix's time.
        self.server = ServerProcess(self.data_dir, "--listen", "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                                    "--ssl-keystore-location", str(keystore),
                                    "--group-initial-rebalance-delay-ms", "0")
        self.ports: dict[str, int] = {}

    def start(self) -> None:
        self.server.start()
        deadline = time.monotonic() + 60
        while "SASL_SSL" not in self.ports and time.monotonic() < deadline:
            text = self.server.log_path.read_text(errors="replace")
            self.ports = {name: int(port) for _h, port, name, _p in LISTENER_LINE.findall(text)}
            time.sleep(0.1)
        assert "SASL_SSL" in self.ports, self.server.log_text()

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    def driver_input(self, client: envs.Client) -> Path:
        return driver_input_file(self.tmp / f"{client.key}.json", client, plaintext=f"{self.host}:{self.port}",
                                 sasl_ssl=f"{self.host}:{self.ports['SASL_SSL']}", ca=self.ca,
                                 topics={c: topic(client, c) for c in CAPABILITIES}, group=f"compat-{client.key}",
                                 transactional_id=f"compat-{client.key}")


def build_envs() -> None:
    """Build whatever environment is missing (cached; ``.ci/run`` builds them before the suite)."""
    try:
        envs.build()
    except Exception as exc:  # no network, a registry down: say which command to run
        pytest.fail(f"the compatibility matrix's client environments could not be built ({exc}); "
                    f"run `{envs.BUILD_COMMAND}` in the work tree and see its logs under {envs.CACHE}")


@pytest.fixture(scope="module")
def compat(tmp_path_factory):
    """The module's one server (no other test needs two listeners and a SCRAM user of its own)."""
    build_envs()
    compat = Compat(tmp_path_factory.mktemp("compat"))
    compat.start()
    try:
        yield compat
    finally:
        assert compat.server.stop() == 0


def run_driver(compat: DriverInputs, client: envs.Client) -> tuple[dict[str, dict], str]:
    """The driver's lines by capability (``version`` included) and its stderr."""
    for program, install in (("kcat", "apt-get install kcat"), ("node", "apt-get install nodejs npm")):
        if program in (client.family, Path(client.command[0]).name) and shutil.which(program) is None:
            return {}, f"{program} is not installed ({install}; .ci/run installs it)"
    try:
        done = subprocess.run([*client.command, str(compat.driver_input(client))], capture_output=True, text=True,
                              timeout=DRIVER_TIMEOUT_S, stdin=subprocess.DEVNULL)
        stdout, stderr = done.stdout, f"exit {done.returncode}: {done.stderr}"
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = f"timed out after {DRIVER_TIMEOUT_S} s"
    lines = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            said = json.loads(line)
            lines[said["capability"]] = said
    return lines, stderr


def produce_for_groups(compat: Compat) -> None:
    """The records each client's group consumes, produced by this module's own producer."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"{compat.host}:{compat.port}", "acks": "all"})
    errors: list[str] = []
    for client in envs.CLIENTS:
        for value in expected_values(client, "group-consume"):
            producer.produce(topic(client, "group-consume"), value.encode(), partition=0,
                             on_delivery=lambda err, _m: err is not None and errors.append(str(err)))
    assert producer.flush(60) == 0 and errors == []


def committed(compat: Endpoint, group: str, name: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"{compat.host}:{compat.port}", "group.id": group})
    try:
        return consumer.committed([TopicPartition(name, 0)], timeout=30)[0].offset
    finally:
        consumer.close()


def check(compat: Endpoint, client: envs.Client, capability: str, said: dict | None, stderr: str,
          name: str | None = None) -> Cell:
    """The cell: the driver's claim, then this module's own read-back of what the claim is about
    (topic ``name``, by default ``topic(client, capability)``, read from ``compat``)."""
    if said is None:
        return Cell(False, f"driver reported nothing ({stderr.strip()[-200:]})")
    if not said["ok"]:
        return Cell(False, said["detail"])
    name = name or topic(client, capability)
    host, port = compat.host, compat.port
    if capability in ("produce", "idempotent", "scram-tls"):
        batches = read_partition(host, port, name)
        held = values(batches)
        if held != expected_values(client, capability):
            return Cell(False, f"the partition holds {len(held)} values, not the {N} acknowledged, in order")
        if capability == "idempotent" and not all(b.producer_id >= 0 and b.base_sequence >= 0 for b in batches):
            return Cell(False, "batches without a producer id and sequence: not idempotent")
        if capability == "produce" and any(b.producer_id >= 0 for b in batches):
            return Cell(False, "idempotence was on: the batches carry a producer id")
        if capability == "scram-tls" and said["values"] != expected_values(client, capability):
            return Cell(False, f"read back over SASL_SSL {len(said['values'] or [])} values, not the {N}")
    elif capability == "group-consume":
        if said["values"] != expected_values(client, capability):
            return Cell(False, f"consumed {len(said['values'] or [])} values, not the {N} in order")
        offset = committed(compat, f"compat-{client.key}", name)
        if offset != N:
            return Cell(False, f"the group's committed offset is {offset}, not {N}")
    elif capability == "create-topic":
        partitions = partition_count(host, port, name)
        if partitions != 3:
            return Cell(False, f"Metadata lists the topic with {partitions} partitions, not 3")
    elif capability == "transactions":
        committed_values = expected_values(client, "transactions-commit", 3)
        aborted = [] if client.key in COMMIT_ONLY else expected_values(client, "transactions-abort", 2)
        if said["values"] != committed_values:
            return Cell(False, f"read_committed read {said['values']}, not the 3 committed")
        if values(read_partition(host, port, name, isolation_level=1)) != committed_values:
            return Cell(False, "a read_committed Fetch does not return exactly the committed records")
        everything = read_partition(host, port, name)
        if values(everything) != committed_values + aborted or not all(
                b.transactional for b in everything):
            return Cell(False, "a read_uncommitted Fetch does not return the committed and aborted records")
        if client.key in COMMIT_ONLY:
            return Cell(True, "commit only: kcat cannot abort")
    return Cell(True)


def checked(compat: Endpoint, client: envs.Client, capability: str, said: dict | None, stderr: str,
            name: str | None = None) -> Cell:
    """``check``, with a failure of this module's own reader as the cell's reason."""
    try:
        return check(compat, client, capability, said, stderr, name)
    except Exception as exc:
        return Cell(False, f"the matrix's read-back failed: {type(exc).__name__}: {exc}"[:300])


def write_doc(rows: list[tuple[envs.Client, str, dict[str, Cell]]], transactions_served: bool) -> None:
    notes: list[str] = []
    lines = ["# Client compatibility", "",
             "Generated by `tests/compat/test_matrix.py` (part of `make test`); do not edit by hand.",
             "Each client release runs from its own environment (`python3 -m tests.compat.envs` builds them",
             "under `.cache/compat`) against one `pipeline serve` with a PLAINTEXT and a SASL_SSL listener.",
             "Every ✅ is a real attempt checked by reading back what it wrote (see the test module's",
             "docstring for what each column does and checks); every ❌ is the client's real outcome, its",
             "reason in the notes below.", ""]
    if not transactions_served:
        lines += ["Transactions are not served yet (issue 22, item 2): the broker does not advertise EndTxn,",
                  "answers FindCoordinator for a transactional id with COORDINATOR_NOT_AVAILABLE (\"transactions",
                  "are not supported\"), which clients retry until their own timeout, and refuses an InitProducerId",
                  "with a `transactional.id`. That column records what each client that has transactions reported",
                  f"when it tried, within {TXN_TIMEOUT_S} s.", ""]
    lines += ["| client | version | " + " | ".join(COLUMNS.values()) + " |",
              "| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |"]
    for client, version, cells in rows:
        row = []
        for capability in COLUMNS:
            cell = cells[capability]
            if cell.ok and not cell.reason:
                row.append("✅")
                continue
            notes.append(f"{client.name} {client.version}, {COLUMNS[capability]}: {cell.reason}")
            row.append(f"{'✅' if cell.ok else '❌'} ({len(notes)})")
        lines.append(f"| {client.name} | {version} | " + " | ".join(row) + " |")
    lines += ["", "Notes:", ""]
    # ports change from run to run; the committed file should not
    lines += [f"{i}. " + ADDRESS.sub("127.0.0.1:PORT", note).replace("|", "/") for i, note in enumerate(notes, start=1)]
    lines += ["", "The releases:", ""]
    lines += [f"- {c.name} {c.version}: {c.note}" for c in envs.CLIENTS]
    DOC.write_text("\n".join(lines) + "\n")


def test_every_client_generation(compat):
    transactions_served = END_TXN in advertised_apis(compat.host, compat.port)
    produce_for_groups(compat)
    with ThreadPoolExecutor(PARALLEL) as pool:
        outcomes = dict(zip(envs.CLIENTS, pool.map(lambda c: run_driver(compat, c), envs.CLIENTS)))
    rows, failures = [], []
    for client, (lines, stderr) in outcomes.items():
        version = lines.get("version", {}).get("detail", f"? ({stderr.strip()[-200:]})")
        cells = {capability: checked(compat, client, capability, lines.get(capability), stderr)
                 for capability in CAPABILITIES}
        rows.append((client, version, cells))
        if not version.startswith(client.version):
            failures.append(f"{client.key}: the environment runs {version}")
        for capability, cell in cells.items():
            limitation = EXPECTED_LIMITATIONS.get((client.key, capability))
            said = lines.get(capability) or {}
            if limitation is not None:
                if cell.ok or not cell.reason.startswith("limitation:"):
                    failures.append(f"{client.key} {capability}: expected the limitation '{limitation}', "
                                    f"got {cell}")
            elif cell.reason.startswith("limitation:"):
                failures.append(f"{client.key} {capability}: a limitation not in EXPECTED_LIMITATIONS: {cell.reason}")
            elif capability == "transactions" and not transactions_served and not cell.ok:
                assert cell.reason  # a real attempt and the client's own words for its failure
                name = topic(client, capability)  # and a refused transactional producer wrote nothing
                if partition_count(compat.host, compat.port, name) and values(
                        read_partition(compat.host, compat.port, name)):
                    failures.append(f"{client.key} transactions: refused, yet records are in {name}")
            elif not cell.ok:
                failures.append(f"{client.key} {capability}: {cell.reason} {said.get('trace', '')[-600:]}")
    write_doc(rows, transactions_served)
    log = compat.server.log_path.read_text(errors="replace")
    assert f"authenticated as User:{USER} ({MECHANISM}" in log
    assert PASSWORD not in log
    assert failures == [], "\n".join(failures)
