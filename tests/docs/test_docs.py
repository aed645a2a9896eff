"""The documentation runs: its commands and code blocks, as a user types them (issue 21, item 2).

One real server for the module, started the README's way (``make serve
ARGS=...``), stopped with SIGINT (Ctrl-C) before the tests that need it
stopped (``pipeline sql`` on its own session, ``pipeline compact``). Every
command goes through the installed console script (the venv's
``bin/pipeline``, next to ``sys.executable``); Python blocks are executed as
written. The tests run in file order: the server's tests, then the stop, then
what needs it stopped.

The one server is also the security walkthrough's server (docs/security.md):
its ``--config`` file *is* the walkthrough's configuration block (a PLAINTEXT
listener on the loopback plus a SASL_SSL one, SCRAM, the ACL authorizer) with
docs/table.md's typed-topic block appended, so the README's snippets and the
walkthrough's clients meet one JVM, not two.

The README's quickstart is the newcomer's path, run as written: `make serve` (the fixture; make's
command is `.venv/bin/pipeline serve`), the produce and consume blocks (`.venv/bin/python -
<<'EOF' ...` in bash from the repository root), `.venv/bin/pipeline sql`, Ctrl-C, and the bench
command line (parsed by `pipeline bench`'s parser: it takes minutes).

``test_every_block_is_run_or_marked`` fails when a block of README.md,
docs/*.md or deploy/README.md is neither in ``RUN`` nor marked
``<!-- not run: REASON -->`` in the doc (tests/docs/blocks.py). Blocks that cannot run here
but can be checked cheaply are in ``CHECKED``: the cluster command lines (resolved by
`pipeline config show`), every `pipeline bench` line of the docs (its argparse parser), the
PromQL queries' metric names (a live scrape).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.e2e.server_process import free_port

from tests.docs.blocks import ROOT, Block, all_blocks, commands, find

PIPELINE = Path(sys.executable).parent / "pipeline"
"""The installed console script (what ``.venv/bin/pipeline`` is when the suite runs from the repo's venv)."""

RUN: dict[tuple[str, str], str] = {
    # (doc, a text that names the block) -> the test that runs it
    ("README.md", "make serve   # creates .venv"): "server fixture: make serve ARGS=... (make test: the suite itself)",
    ("README.md", "from confluent_kafka import Producer"): "test_readme_producer_and_consumer",
    ("README.md", "from confluent_kafka import Consumer"): "test_readme_producer_and_consumer",
    ("README.md", 'make serve ARGS="--mode multiqueue --queues 8"'): "test_serve_command_lines",
    ("docs/clusters.md", "pipeline serve --brokers 2"): "test_serve_command_lines",
    ("README.md", "FROM records GROUP BY"): "test_sql_while_serving, test_sql_after_stop",
    ("README.md", 'make serve ARGS="--schema-registry-listeners'): "test_readme_avro_producer",
    ("README.md", "AvroSerializer"): "test_readme_avro_producer",
    ("README.md", "FROM sales"): "test_readme_avro_producer",
    ("docs/operations.md", "pipeline config show --config /etc/pipeline.toml"): "test_config_show",
    ("docs/operations.md", 'advertised.listeners = "SSL://broker.example.com:9093"'): "test_config_blocks",
    ("docs/operations.md", "pipeline top --metrics-url"): "test_top",
    ("docs/operations.md", "def abort_hanging(admin"):
        "tests/e2e/test_transaction_admin.py (on the e2e tests' shared server, with a transaction left open)",
    ("docs/security.md", "openssl req -x509"): "tls fixture",
    ("docs/security.md", "# /etc/pipeline.toml"): "server fixture (its --config file)",
    ("docs/security.md", 'listeners = "EXTERNAL://0.0.0.0:9093'): "test_config_blocks",
    ("docs/security.md", "pipeline users add admin"): "test_users_walkthrough",
    ("docs/security.md", "admin.alter_user_scram_credentials"): "test_security_clients",
    ("docs/security.md", "admin.create_acls"): "test_security_clients",
    ("docs/security.md", '"security.protocol": "SASL_SSL"'): "test_security_clients",
    ("docs/security.md", "KafkaProducer(bootstrap_servers"): "test_security_clients",
    ("docs/table.md", "SELECT count(*) FROM records"): "test_sql_while_serving",
    ("docs/table.md", "FROM records_live GROUP BY topic"): "test_sql_while_serving",
    ("docs/table.md", '[topic."payments"]'): "server fixture (its --config file)",
    ("docs/schema-registry.md", 'make serve ARGS="--schema-registry-listeners'): "test_schema_registry_walkthrough",
    ("docs/schema-registry.md", "from confluent_kafka.schema_registry import Schema"):
        "test_schema_registry_walkthrough",
    ("docs/schema-registry.md", "SELECT sensor, celsius FROM readings"): "test_schema_registry_walkthrough",
    ("docs/schema-registry.md", "incremental_alter_configs"): "test_topic_config_walkthrough",
    ("docs/schema-registry.md", "JSONSerializer(json.dumps(v1), registry)"): "test_json_schema_walkthrough",
    ("docs/schema-registry.md", "SELECT meter, kwh FROM meters"): "test_json_schema_walkthrough",
    ("docs/schema-registry.md", "ProtobufSerializer(V1, registry)"): "test_protobuf_walkthrough",
    ("docs/schema-registry.md", "SELECT sku, qty, coupon FROM carts"): "test_protobuf_walkthrough",
}


CHECKED: dict[tuple[str, str], str] = {
    # (doc, a text that names the block) -> the test that checks it: blocks marked
    # <!-- not run --> (they need a PostgreSQL server, other hosts, minutes of benchmark or a
    # Prometheus) whose command lines or names are still checked here by the real parts
    ("README.md", ".venv/bin/pipeline bench --quick --no-brokers"): "test_bench_command_lines",
    ("docs/clusters.md", "--brokers 3 --cluster-leadership database"): "test_cluster_command_lines",
    ("docs/clusters.md", "--node-id 1 --listen 10.0.0.11:9092"): "test_cluster_command_lines",
    ("docs/operations.md", "sum by (request) (rate(kafka_network_requestmetrics_requests_total"): "test_promql_names",
}


def block(path: str, contains: str) -> Block:
    """The block ``RUN`` or ``CHECKED`` names; a block a test runs or checks must be listed there
    (so the coverage check knows)."""
    assert (path, contains) in RUN or (path, contains) in CHECKED, f"add ({path!r}, {contains!r}) to RUN"
    return find(path, contains)


# --- How the docs' commands are adapted to run here: the one place -------------------------------
#
# The docs use the default ports (9092, 9093, 9464), /etc/pipeline and /var/lib/pipeline, and a
# server certificate for broker.example.com. Here the server gets free ports and temporary
# directories (other servers may run on this machine), and the certificate names localhost
# (resolving to 127.0.0.1), so every block's text goes through ``DocsEnv.here``; nothing else of a
# block is changed. Commands run from the repository root with the venv's bin first on PATH (the
# docs write both `.venv/bin/pipeline` and `pipeline`), and `pipeline sql` / `pipeline compact`,
# which default to ./data as the README's server does, get the data directory the documented way
# for a key: its environment variable, PIPELINE_PIPELINE_DATA_DIR.
#
# One addition to the security walkthrough's configuration: User:ANONYMOUS is a super user, as
# security.md advises for a loopback PLAINTEXT listener "on a machine only operators use", so the
# README's snippets (PLAINTEXT, no credentials) run on the same server.




@dataclass
class DocsEnv:
    tmp: Path
    kafka_port: int = field(default_factory=free_port)
    sasl_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    connect_port: int = field(default_factory=free_port)
    registry_port: int = field(default_factory=free_port)
    passwords: dict[str, str] = field(default_factory=lambda: {"admin": "admin-secret-1", "alice": "alice-secret-1",
                                                               "bob": "bob-secret-1"})

    @property
    def etc(self) -> Path:
        return self.tmp / "etc" / "pipeline"

    @property
    def data_dir(self) -> Path:
        return self.tmp / "var-lib-pipeline"

    @property
    def config_file(self) -> Path:
        return self.tmp / "etc" / "pipeline.toml"

    def here(self, text: str) -> str:
        """A doc block's text with the addresses and paths of this machine (see above)."""
        for doc, local in (
            ("127.0.0.1:9092", f"127.0.0.1:{self.kafka_port}"),
            ("0.0.0.0:9093", f"127.0.0.1:{self.sasl_port}"),
            ("broker.example.com:9093", f"localhost:{self.sasl_port}"),
            ("broker.example.com", "localhost"),
            ("127.0.0.1:9464", f"127.0.0.1:{self.metrics_port}"),
            ("127.0.0.1:8081", f"127.0.0.1:{self.registry_port}"),
            ("/etc/pipeline", str(self.etc)),  # also /etc/pipeline.toml -> <tmp>/etc/pipeline.toml
            ("/var/lib/pipeline", str(self.data_dir)),
            ('super.users = "User:admin"', 'super.users = "User:admin;User:ANONYMOUS"'),
        ):
            text = text.replace(doc, local)
        return text

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
        env.update(PATH=f"{PIPELINE.parent}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200",
                   ALICE_PASSWORD=self.passwords["alice"], **extra)
        return env

    def shell(self, command: str, *, stdin: str | None = None, timeout: float = 300, check: bool = True,
              **env: str) -> subprocess.CompletedProcess:
        """Run a doc's shell command (after ``here``) with bash from the repository root."""
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", self.here(command)], cwd=ROOT,
                                env=self.environ(**env), input=stdin, capture_output=True, text=True,
                                timeout=timeout, start_new_session=True)
        if check:
            assert result.returncode == 0, f"{command!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        return result

    def table_env(self) -> dict[str, str]:
        return {"PIPELINE_PIPELINE_DATA_DIR": str(self.data_dir)}


@dataclass
class Server:
    """``make serve ARGS=...``: the make process (its own session) and what it printed."""

    env: DocsEnv
    make: subprocess.Popen
    log: Path
    stdout: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    """set at "table side ready": the server listens before Spark is up, and the docs' blocks query the table"""
    produced: Counter = field(default_factory=Counter)
    """records acknowledged per (topic, partition) by the tests' producers"""

    def read_stdout(self) -> None:
        for line in self.make.stdout:
            self.stdout.append(line)
            if "table side ready" in line:
                self.ready.set()
        self.ready.set()  # make exited: wake the waiter

    def diagnostics(self) -> str:
        tail = self.log.read_text(errors="replace").splitlines()[-40:] if self.log.exists() else []
        return "stdout:\n" + "".join(self.stdout[-20:]) + "\nstderr (tail):\n" + "\n".join(tail)

    def session_processes(self) -> list[psutil.Process]:
        """Every live process of the make's session (make, the server, Spark's JVM, ...)."""
        out = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == self.make.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except (ProcessLookupError, psutil.Error, OSError):
                pass
        return out

    def stop(self, timeout: float = 240) -> int:
        """Ctrl-C to `pipeline serve` (make's child), as a terminal would deliver it; make's exit status."""
        if self.make.poll() is None:
            def is_serve(proc: psutil.Process) -> bool:
                try:
                    return any(part.endswith("bin/pipeline") for part in proc.cmdline()[:2])
                except psutil.Error:  # gone, or a zombie not reaped yet
                    return False

            servers = [p for p in psutil.Process(self.make.pid).children(recursive=True)
                       if is_serve(p) and not is_serve(p.parent())]  # not its children (e.g. a decode worker)
            assert servers, f"no `pipeline serve` under make:\n{self.diagnostics()}"
            servers[0].send_signal(signal.SIGINT)
            try:
                self.make.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"the server did not stop within {timeout} s:\n{self.diagnostics()}") from None
        return self.make.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.make.pid, signal.SIGKILL)
        self.make.wait(30)
        for proc in self.session_processes():  # e.g. a JVM that left the process group
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(self.session_processes(), timeout=30)


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory) -> DocsEnv:
    return DocsEnv(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def tls(docs_env) -> Path:
    """docs/security.md's step 1, the openssl commands, run as written (in a work directory)."""
    work = docs_env.tmp / "tls-work"
    work.mkdir()
    text = block("docs/security.md", "openssl req -x509").text
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", docs_env.here(text)], cwd=work,
                            env=docs_env.environ(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (docs_env.etc / "server.pem").stat().st_mode & 0o777 == 0o600
    return docs_env.etc / "ca.pem"


@pytest.fixture(scope="module")
def server_config(docs_env, tls) -> Path:
    """The server's --config: security.md's configuration block, then table.md's typed topics."""
    text = "\n".join((block("docs/security.md", "# /etc/pipeline.toml").text,
                      block("docs/table.md", '[topic."payments"]').text))
    docs_env.config_file.write_text(docs_env.here(text))
    return docs_env.config_file


@pytest.fixture(scope="module")
def server(docs_env, server_config) -> Server:
    """`make serve ARGS=...` once for the module (README, "The two commands"): ports and data
    directory of its own, tables committed every second so queries need not wait 10 s."""
    assert "make serve" in block("README.md", "make serve   # creates .venv").text
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "-o", ".venv/.installed", "serve"], capture_output=True,
                         text=True, check=True, env=docs_env.environ())
    assert ".venv/bin/pipeline serve" in dry.stdout, dry.stdout  # what the README says make serve runs
    args = (f"--config {server_config} --listen PLAINTEXT://127.0.0.1:{docs_env.kafka_port},"
            f"SASL_SSL://127.0.0.1:{docs_env.sasl_port} --data-dir {docs_env.data_dir} "
            f"--spark-connect-port {docs_env.connect_port} --metrics-port {docs_env.metrics_port} "
            f"--schema-registry-listeners http://127.0.0.1:{docs_env.registry_port} "
            "--table-commit-interval-ms 1000")
    log = docs_env.tmp / "serve.log"
    # -o: never reinstall the venv this test runs from (make test has just brought it up to date).
    make = subprocess.Popen(["make", "-C", str(ROOT), "-o", ".venv/.installed", "serve", f"ARGS={args}"],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=docs_env.environ(),
                            start_new_session=True)
    server = Server(docs_env, make, log)
    threading.Thread(target=server.read_stdout, daemon=True).start()
    try:
        assert server.ready.wait(420) and make.poll() is None, \
            f"make serve did not get ready:\n{server.diagnostics()}"
        yield server
    finally:
        try:
            if make.poll() is None:  # test_stop_with_ctrl_c did not run (deselected, or failed before it)
                server.stop()  # Ctrl-C as well; SIGKILL to the session if it does not end in time
        finally:
            if make.poll() is None:  # stop() itself failed: no orphans either way
                server.kill()
        _, left = psutil.wait_procs(server.session_processes(), timeout=30)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        assert not left, f"processes outlived the server: {left}"


def parse_table(output: str) -> list[list[str]]:
    """The rows of a rich table printed by `pipeline sql` (header first), cells stripped."""
    rows = []
    for line in output.splitlines():
        line = line.strip().replace("┃", "│")  # the header row's rule is heavy
        if line.count("│") >= 2:
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def sql_rows(docs_env: DocsEnv, command: str) -> list[list[str]]:
    result = docs_env.shell(command, **docs_env.table_env())
    rows = parse_table(result.stdout)
    assert rows, result.stdout
    return rows


def expected_rows(produced: Counter) -> list[list[str]]:
    """README query's rows (topic, partition, count(1), max(offset)) for what the tests produced:
    offsets 0..n-1 with no gap."""
    return sorted([topic, str(partition), str(n), str(n - 1)] for (topic, partition), n in produced.items())


def deliver(producer, topic: str, value: bytes, server: Server) -> None:
    """Produce one record with a confluent-kafka producer and count it once acknowledged."""
    acks = []
    producer.produce(topic, value=value, on_delivery=lambda err, msg: acks.append((err, msg)))
    assert producer.flush(60) == 0
    [(err, msg)] = acks
    assert err is None, err
    server.produced[msg.topic(), msg.partition()] += 1


# --- tests ------------------------------------------------------------------------------------------


README_MAX_LINES = 180
"""Issue 36: the README is a front page a newcomer reads whole; the reference lives in docs/."""


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference material to docs/"


def test_every_block_is_run_or_marked():
    found = all_blocks()
    problems = []
    for name, run_by in RUN.items():
        try:
            b = find(*name)
        except LookupError as exc:
            problems.append(f"RUN {name} ({run_by}): {exc}")
            continue
        if b.not_run is not None:
            problems.append(f"{b} is run by {run_by} but marked not run")
    for name, checked_by in CHECKED.items():
        try:
            find(*name)
        except LookupError as exc:
            problems.append(f"CHECKED {name} ({checked_by}): {exc}")
    for b in found:
        run = [name for name in RUN if name[0] == b.path and name[1] in b.text]
        if not run and not b.not_run:
            problems.append(f"{b}: neither run by tests/docs nor marked <!-- not run: REASON -->")
    assert not problems, "\n".join(problems)
    assert len(found) > len(RUN)


def test_configuration_reference_is_generated(docs_env):
    """docs/configuration.md is what `pipeline config docs` prints, through the console script:
    every key of pipeline.config.KEYS with its flag and its default as the dataclasses define it
    (a renamed key, flag or changed default fails here until the file is regenerated)."""
    from pipeline.config import KEYS, REFERENCE_COMMAND, default_value

    generated = docs_env.shell(f"{PIPELINE} config docs").stdout
    on_disk = (ROOT / "docs" / "configuration.md").read_text()
    assert on_disk == generated, f"docs/configuration.md is stale: run `{REFERENCE_COMMAND}`"
    rows = dict(re.findall(r"^\| `([a-z0-9.]+)` \| `(--[a-z0-9-]+)", on_disk, re.M))
    assert rows == {name: key.flag for name, key in KEYS.items()}
    assert "| `queued.max.requests` | `--queued-max-requests N` | `500` |" in on_disk
    assert default_value(KEYS["queued.max.requests"]) == 500


def bench_lines(text: str) -> list[list[str]]:
    """The `pipeline bench ...` command lines of a block's text, as argv after `pipeline`
    (comments dropped, `\\` continuations joined)."""
    out = []
    for line in commands(Block("", 0, "", text, None)):
        if "pipeline bench" not in line:  # e.g. prose or Python in a block that names no bench
            continue
        argv = shlex.split(line, comments=True)
        if argv and argv[0] in ("pipeline", ".venv/bin/pipeline") and argv[1:2] == ["bench"]:
            out.append(argv[1:])
    return out


def test_bench_command_lines():
    """Every `pipeline bench` command line of README.md and docs/ (run or not: they take minutes)
    parses with `pipeline bench`'s own argparse parser and resolves to a plan
    (pipeline.bench.options.resolve: the ranges and the presets)."""
    from pipeline.bench.options import resolve
    from pipeline.cli import build_parser

    parser = build_parser()
    lines = [(b, argv) for b in all_blocks() for argv in bench_lines(b.text)]
    readme = block("README.md", ".venv/bin/pipeline bench --quick --no-brokers")
    assert bench_lines(readme.text) == [["bench", "--quick", "--no-brokers"]]
    assert len(lines) > 10
    for b, argv in lines:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            raise AssertionError(f"{b}: `pipeline {shlex.join(argv)}` does not parse") from None
        needs_kcat = getattr(args, "brokers_client", None) == "kcat" and shutil.which("kcat") is None
        if not (args.hostile or args.consume or args.security or args.table or args.sustained or needs_kcat):
            resolve(args)  # (resolve checks kcat is installed: the parse above is the check without it)


def test_cluster_command_lines(docs_env):
    """docs/clusters.md's PostgreSQL and several-hosts command lines, resolved by `pipeline config
    show` with the same arguments (it opens no database): each key they set, with its source."""
    [three] = commands(block("docs/clusters.md", "--brokers 3 --cluster-leadership database"))
    [host] = commands(block("docs/clusters.md", "--node-id 1 --listen 10.0.0.11:9092"))
    show = " config show --format json "
    shown = json.loads(docs_env.shell(three.replace(" serve ", show, 1)).stdout)
    assert shown["pipeline.brokers"] == {"value": 3, "source": "flag:--brokers"}
    assert shown["pipeline.cluster.leadership"] == {"value": "database", "source": "flag:--cluster-leadership"}
    assert shown["pipeline.metadata.url"]["source"] == "flag:--metadata-url"
    assert shown["pipeline.ack.on"] == {"value": "wal", "source": "default"}  # failover needs no --ack-on spark
    shown = json.loads(docs_env.shell(host.replace(" serve ", show, 1)).stdout)
    assert shown["node.id"] == {"value": 1, "source": "flag:--node-id"}
    assert shown["listeners"]["value"] == "PLAINTEXT://10.0.0.11:9092"
    assert shown["spark.remote"] == {"value": "sc://spark:15002", "source": "flag:--spark-remote"}
    assert shown["pipeline.data.dir"] == {"value": "/shared/pipeline", "source": "flag:--data-dir"}


def test_config_show(docs_env, server_config):
    """docs/operations.md's two `pipeline config show` commands, on the walkthrough's file."""
    first, second = commands(block("docs/operations.md", "pipeline config show --config /etc/pipeline.toml"))
    table = docs_env.shell(first).stdout
    rows = {row[0]: row[1:] for row in parse_table(table)}
    assert rows["pipeline.queues"] == ["8", "flag:--queues"]
    assert rows["authorizer.class.name"] == ["kafka.security.authorizer.AclAuthorizer",
                                             f"file:{docs_env.config_file}"]
    shown = json.loads(docs_env.shell(second).stdout)
    assert shown["num.io.threads"] == {"value": 16, "source": "env:PIPELINE_NUM_IO_THREADS"}


def test_config_blocks(docs_env, tmp_path):
    """Configuration blocks for listeners this machine has not (10.0.0.5, 0.0.0.0 with other
    certificates): loaded and checked by `pipeline config show --config`, as a server would at start."""
    for doc, name, expect in (
        ("docs/security.md", 'listeners = "EXTERNAL://0.0.0.0:9093', "listener.name.internal.ssl.client.auth"),
        ("docs/operations.md", 'advertised.listeners = "SSL://broker.example.com:9093"', "ssl.client.auth"),
    ):
        path = tmp_path / f"{Path(doc).stem}.toml"
        path.write_text(docs_env.here(block(doc, name).text))
        shown = json.loads(docs_env.shell(f"pipeline config show --format json --config {path}").stdout)
        assert shown[expect] == {"value": "required", "source": f"file:{path}"}, shown.get(expect)


def test_serve_command_lines(docs_env):
    """README's `make serve ARGS=...` comparisons and docs/clusters.md's `--brokers 2` command: the command
    line make would run (`make -n`), resolved by `pipeline config show` with the same arguments
    (each would start a server of its own; the module's server is started through make serve)."""
    lines = commands(block("README.md", 'make serve ARGS="--mode multiqueue --queues 8"'))
    assert len(lines) == 2
    expected = [{"pipeline.mode": "multiqueue", "pipeline.queues": 8},
                {"pipeline.mode": "baseline", "num.io.threads": 8}]
    for line, want in zip(lines, expected):
        argv = shlex.split(line)
        assert argv[:2] == ["make", "serve"]
        dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", *argv[1:]], cwd=ROOT, capture_output=True,
                             text=True, check=True, env=docs_env.environ())
        [serve_line] = [x for x in dry.stdout.splitlines() if "bin/pipeline serve" in x]
        shown = json.loads(docs_env.shell(serve_line.replace(" serve ", " config show --format json ", 1)).stdout)
        for key, value in want.items():
            assert shown[key]["value"] == value and shown[key]["source"].startswith("flag:"), (key, shown[key])
    [brokers] = commands(block("docs/clusters.md", "pipeline serve --brokers 2"))
    shown = json.loads(docs_env.shell(brokers.replace("pipeline serve", "pipeline config show --format json")).stdout)
    assert shown["pipeline.brokers"]["value"] == 2
    assert shown["pipeline.data.dir"] == {"value": "data", "source": "flag:--data-dir"}


def test_bench_help(docs_env):
    out = docs_env.shell(f"{PIPELINE} bench --help").stdout
    for flag in ("--quick", "--full", "--hostile", "--consume", "--security", "--table", "--brokers", "--sustained",
                 "--transactions"):
        assert flag in out


@pytest.mark.slow
def test_readme_producer_and_consumer(server, docs_env):
    """The README's quickstart steps 3 and 4 as a newcomer runs them: each block's shell command
    (`.venv/bin/python - <<'EOF' ...`) from the repository root, against the make serve server."""
    docs_env.shell(block("README.md", "from confluent_kafka import Producer").text, timeout=120)
    server.produced["orders", 0] += 1  # p.flush() returned: acknowledged (the consumer reads it back)
    result = docs_env.shell(block("README.md", "from confluent_kafka import Consumer").text, timeout=120)
    assert result.stdout.strip() == "b'hello'", result.stdout + result.stderr


def check_registry_serve_line(docs_env: DocsEnv, doc: str) -> None:
    """``doc``'s `make serve ARGS="--schema-registry-listeners ..."` resolves (make -n) to a serve line whose
    configuration has the registry listener (the module's server has one, on a free port: ``here()``)."""
    [serve] = commands(block(doc, 'make serve ARGS="--schema-registry-listeners'))
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", *shlex.split(serve)[1:]], cwd=ROOT,
                         capture_output=True, text=True, check=True, env=docs_env.environ())
    [serve_line] = [x for x in dry.stdout.splitlines() if "bin/pipeline serve" in x]
    shown = json.loads(docs_env.shell(serve_line.replace(" serve ", " config show --format json ", 1)).stdout)
    assert shown["schema.registry.listeners"] == {"value": f"http://127.0.0.1:{docs_env.registry_port}",  # here()
                                                  "source": "flag:--schema-registry-listeners"}


def poll_rows(docs_env: DocsEnv, query: str, want: list[list[str]], timeout: float = 240) -> list[list[str]]:
    """``query``'s rows (header first) once its body is ``want`` or ``timeout`` s have passed (no table
    before the first commit: no rows)."""
    deadline = time.monotonic() + timeout
    while True:
        result = docs_env.shell(query, check=False, **docs_env.table_env())
        rows = parse_table(result.stdout) if result.returncode == 0 else []
        if rows[1:] == want or time.monotonic() > deadline:
            return rows
        time.sleep(1)


@pytest.mark.slow
def test_readme_avro_producer(server, docs_env):
    """README quickstart steps 2, 5 and 6: the serve line has the registry; the Avro producer block (run
    twice: a newcomer's second run finds the topic there) lands its records as the `sales` table's
    columns; no dead letters."""
    check_registry_serve_line(docs_env, "README.md")
    produce = block("README.md", "AvroSerializer").text
    for _ in range(2):
        result = docs_env.shell(docs_env.here(produce), timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
    [query] = commands(block("README.md", "FROM sales"))
    want = [["s-1", "9.5"], ["s-2", "12.0"]] * 2  # in offset order: both runs' records
    rows = poll_rows(docs_env, query, want)
    assert rows and rows[0] == ["id", "amount"] and rows[1:] == want, rows
    dead = poll_rows(docs_env, """.venv/bin/pipeline sql "SELECT count(*) FROM dead_letters WHERE topic = 'sales'" """,
                     [["0"]], timeout=0)
    assert dead[1:] in ([["0"]], []), dead  # [] : no dead letter was ever written, so no table


@pytest.mark.slow
def test_schema_registry_walkthrough(server, docs_env):
    """docs/schema-registry.md: its serve line resolves to the registry listener (the module's server has
    one, on a free port); the evolving Avro producer (confluent-kafka's serializers against the server's
    registry) prints what the page says; both records are rows of the registry topic's table, which
    gained version 2's column without a restart."""
    check_registry_serve_line(docs_env, "docs/schema-registry.md")
    result = docs_env.shell(docs_env.here(block("docs/schema-registry.md",
                                                "from confluent_kafka.schema_registry import Schema").text),
                            timeout=120)
    assert result.stdout.splitlines() == ["versions: [1, 2]", "v3 refused: 409"], result.stdout + result.stderr
    [query] = commands(block("docs/schema-registry.md", "SELECT sensor, celsius FROM readings"))
    want = [["s-1", "NULL"], ["s-2", "21.5"]]
    rows = poll_rows(docs_env, query, want)
    assert rows and rows[0] == ["sensor", "celsius"] and rows[1:] == want, rows
    # The typed table's live view (docs/table.md, "Typed topics"), its tail decoding each value with
    # its writer's schema from the server's registry store: the same rows, each once.
    live = poll_rows(docs_env, query.replace("FROM readings", "FROM readings_live"), want, timeout=60)
    assert live[1:] == want, live


@pytest.mark.slow
def test_topic_config_walkthrough(server, docs_env):
    """docs/schema-registry.md, "Make a topic typed without a restart": a raw record of `clicks` lands in the
    records table; the page's AdminClient block sets value.format=avro (IncrementalAlterConfigs) and reads
    it back; a registry-framed Avro record produced after that lands in the `clicks` table, no restart."""
    import json as json_

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    bootstrap = f"127.0.0.1:{docs_env.kafka_port}"
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("clicks", b"raw bytes, before the change")
    assert producer.flush(30) == 0
    server.produced["clicks", 0] += 1  # in the records table (the README's query counts it)

    def rows(query: str) -> list[list[str]]:
        result = docs_env.shell(f'.venv/bin/pipeline sql "{query}"', check=False, **docs_env.table_env())
        return parse_table(result.stdout)[1:] if result.returncode == 0 else []

    deadline = time.monotonic() + 240
    while rows("SELECT count(*) FROM records WHERE topic = 'clicks'") != [["1"]]:
        assert time.monotonic() < deadline, "the raw record never reached the records table"
        time.sleep(1)
    result = docs_env.shell(block("docs/schema-registry.md", "incremental_alter_configs").text, timeout=120)
    assert result.stdout.strip() == "value.format: avro", result.stdout + result.stderr
    registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{docs_env.registry_port}"})
    schema = {"type": "record", "name": "Click", "fields": [{"name": "page", "type": "string"}]}
    value = AvroSerializer(registry, json_.dumps(schema))({"page": "/home"},
                                                          SerializationContext("clicks", MessageField.VALUE))
    producer.produce("clicks", value)
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 240
    while rows("SELECT page FROM clicks") != [["/home"]]:
        assert time.monotonic() < deadline, "the Avro record never reached the clicks table"
        time.sleep(1)
    assert rows("SELECT count(*) FROM records WHERE topic = 'clicks'") == [["1"]]  # only the raw one


@pytest.mark.slow
def test_json_schema_walkthrough(server, docs_env):
    """docs/schema-registry.md, "JSON Schema" (issue 32): the page's block creates `meters` typed json
    (CreateTopics config) and produces with confluent-kafka's JSONSerializer against the server's
    registry, v1 then v2, one record with the id in a `__value_schema_id` header; v3 is refused. The
    page's query shows every record, v1's null in v2's column, and none is a dead letter. Then a
    version 4 adds a property: the live table gains its column (ALTER TABLE), the older rows null in it."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    result = docs_env.shell(docs_env.here(block("docs/schema-registry.md",
                                                "JSONSerializer(json.dumps(v1), registry)").text), timeout=120)
    assert result.stdout.splitlines() == ["versions: [1, 2]", "v3 refused: 409"], result.stdout + result.stderr

    [query] = commands(block("docs/schema-registry.md", "SELECT meter, kwh FROM meters"))
    want = [["m-1", "NULL"], ["m-2", "2.5"], ["m-3", "0.5"]]
    found = poll_rows(docs_env, query, want)
    assert found and found[0] == ["meter", "kwh"] and found[1:] == want, found

    registry = SchemaRegistryClient({"url": f"http://127.0.0.1:{docs_env.registry_port}"})
    v4 = {"type": "object", "additionalProperties": False, "properties": {
        "meter": {"type": "string"}, "kwh": {"type": "number"}, "site": {"type": "string"}}}
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{docs_env.kafka_port}"})
    producer.produce("meters", JSONSerializer(json.dumps(v4), registry)(
        {"meter": "m-4", "kwh": 1.0, "site": "north"}, SerializationContext("meters", MessageField.VALUE)))
    assert producer.flush(30) == 0
    want = [["m-1", "NULL"], ["m-2", "NULL"], ["m-3", "NULL"], ["m-4", "north"]]
    found = poll_rows(docs_env, '.venv/bin/pipeline sql "SELECT meter, site FROM meters ORDER BY offset"', want)
    assert found[1:] == want, found
    dead = docs_env.shell(".venv/bin/pipeline sql \"SELECT count(*) FROM dead_letters WHERE topic = 'meters'\"",
                          check=False, **docs_env.table_env())
    assert parse_table(dead.stdout)[1:] == [["0"]] or "TABLE_OR_VIEW_NOT_FOUND" in dead.stdout + dead.stderr, \
        dead.stdout + dead.stderr


@pytest.mark.slow
def test_protobuf_walkthrough(server, docs_env):
    """docs/schema-registry.md, "Protobuf": the page's block creates `carts` with value.format=protobuf
    (CreateTopics), produces with confluent-kafka's ProtobufSerializer against the server's registry (v1, v2,
    v2 with the schema's GUID in a header) and has v3 refused; every record is a row of the `carts` table,
    the v1 one null in v2's column, none a dead letter, no restart."""
    result = docs_env.shell(block("docs/schema-registry.md", "ProtobufSerializer(V1, registry)").text, timeout=120)
    assert result.stdout.splitlines() == ["versions: [1, 2]", "v3 refused: 409"], result.stdout + result.stderr
    [query] = commands(block("docs/schema-registry.md", "SELECT sku, qty, coupon FROM carts"))
    want = [["a-1", "2", "NULL"], ["a-2", "1", "SPRING"], ["a-3", "5", "FALL"]]
    rows = poll_rows(docs_env, query, want)
    assert rows and rows[0] == ["sku", "qty", "coupon"] and rows[1:] == want, rows
    dead = docs_env.shell('.venv/bin/pipeline sql "SELECT count(*) FROM dead_letters WHERE topic = \'carts\'"',
                          check=False, **docs_env.table_env())
    if dead.returncode == 0:
        assert parse_table(dead.stdout)[1:] == [["0"]], dead.stdout
    else:  # no dead letter yet on this server: no such table
        assert "dead_letters" in dead.stdout + dead.stderr, dead.stdout + dead.stderr


@pytest.mark.slow
def test_promql_names(server, docs_env):
    """Every metric docs/operations.md's Prometheus queries name is one the running server exports:
    a live scrape after a produce of its own (a Produce request's histograms, and a table commit's:
    the flush and the queryable lag), so it holds run alone too."""
    import urllib.request

    from confluent_kafka import Producer
    from prometheus_client.parser import text_string_to_metric_families

    queries = block("docs/operations.md", "sum by (request) (rate(kafka_network_requestmetrics_requests_total").text
    named = {m.group(1) for line in queries.splitlines() if not line.startswith("#")
             for m in re.finditer(r"\b([a-z_][a-z0-9_]*)\s*[{\[]", line)}
    assert len(named) >= 6, named
    # counted in server.produced: the README's query over the table, in the tests after, counts it
    deliver(Producer({"bootstrap.servers": f"127.0.0.1:{docs_env.kafka_port}", "acks": "all"}), "promql-names",
            b"one record", server)
    deadline = time.monotonic() + 60  # the table commit comes within table.commit.interval.ms (10 s)
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{docs_env.metrics_port}/metrics", timeout=30) as response:
            scraped = response.read().decode()
        exported = {sample.name for family in text_string_to_metric_families(scraped) for sample in family.samples}
        if named <= exported or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert named <= exported, sorted(named - exported)


@pytest.mark.slow
def test_users_walkthrough(server, docs_env):
    """docs/security.md's `pipeline users` block, one command at a time (those that prompt read
    the password twice from stdin: no terminal here)."""
    lines = commands(block("docs/security.md", "pipeline users add admin"))
    assert len(lines) == 5
    for line in lines:
        user = line.split("pipeline users ")[1].split()[1] if " add " in line else None
        prompts = user is not None and "--password-stdin" not in line
        stdin = f"{docs_env.passwords[user]}\n{docs_env.passwords[user]}\n" if prompts else None
        result = docs_env.shell(line, stdin=stdin)
        if " list " in line:
            listed = dict(row.split(" ", 1) for row in result.stdout.strip().splitlines())
            assert listed == {"admin": "SCRAM-SHA-256(iterations=8192) SCRAM-SHA-512(iterations=8192)",
                              "alice": "SCRAM-SHA-256(iterations=8192) SCRAM-SHA-512(iterations=8192)",
                              "bob": "SCRAM-SHA-512(iterations=16384)"}
        elif " remove " in line:
            assert result.stdout.strip() == "removed 1 credential(s) of bob"
        else:
            assert result.stdout.strip() == f"added {user}"
            assert docs_env.passwords[user] not in result.stdout + result.stderr
    listed = docs_env.shell("pipeline users list --config /etc/pipeline.toml").stdout
    assert [row.split()[0] for row in listed.strip().splitlines()] == ["admin", "alice"]


@pytest.mark.slow
def test_security_clients(server, docs_env, tls):
    """docs/security.md's client configurations against the SASL_SSL listener: AdminClient as
    admin (SCRAM credentials, ACLs), then alice with the ACL the doc grants, from confluent-kafka
    and kafka-python."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
        ScramMechanism,
    )
    from kafka import KafkaProducer

    namespace: dict = {"os": os}
    os.environ["ALICE_PASSWORD"] = docs_env.passwords["alice"]  # the blocks read it from the environment
    try:
        exec(compile(docs_env.here(block("docs/security.md", '"security.protocol": "SASL_SSL"').text),
                     "security.md confluent-kafka config", "exec"), namespace)
        config = namespace["config"]
        # "the SASL_SSL client config below, as admin"
        namespace["admin_config"] = dict(config, **{"sasl.username": "admin",
                                                    "sasl.password": docs_env.passwords["admin"]})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(docs_env.here(block("docs/security.md", "admin.alter_user_scram_credentials").text),
                         "security.md AdminClient", "exec"), namespace)
        assert "UserScramCredentialsDescription" in out.getvalue(), out.getvalue()
        [info] = namespace["admin"].describe_user_scram_credentials(["carol"])["carol"].result().scram_credential_infos
        assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_512, 8192)
        exec(compile(docs_env.here(block("docs/security.md", "admin.create_acls").text),
                     "security.md ACL", "exec"), namespace)
        admin: AdminClient = namespace["admin"]
        wanted = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                                  AclOperation.WRITE, AclPermissionType.ALLOW)
        deadline = time.monotonic() + 60
        while not admin.describe_acls(wanted).result(timeout=30):  # create_acls' futures are not awaited
            assert time.monotonic() < deadline, "the ACL of security.md did not appear"
            time.sleep(0.2)

        producer = Producer(config)
        deliver(producer, "orders", b"from alice, confluent-kafka", server)
        kafka_python = eval(compile(docs_env.here(block("docs/security.md", "KafkaProducer(bootstrap_servers").text),
                                    "security.md kafka-python", "eval"), {"os": os, "KafkaProducer": KafkaProducer})
        try:
            metadata = kafka_python.send("orders", b"from alice, kafka-python").get(timeout=60)
            server.produced[metadata.topic, metadata.partition] += 1
        finally:
            kafka_python.close(timeout=30)
        # alice may write orders only: the ACLs are on
        denied = []
        try:
            producer.produce("not-granted", value=b"x", on_delivery=lambda err, msg: denied.append(err))
        except KafkaException as exc:  # librdkafka refuses at once when its metadata already says so
            denied.append(exc.args[0])
        producer.flush(60)
        assert denied and denied[0] is not None and "AUTHORIZATION" in denied[0].name(), denied
    finally:
        os.environ.pop("ALICE_PASSWORD", None)


@pytest.mark.slow
def test_top(server, docs_env):
    """docs/operations.md's `pipeline top` lines: the live view until Ctrl-C, and `--once`."""
    live_line, once_line = commands(block("docs/operations.md", "pipeline top --metrics-url"))
    live = subprocess.Popen(["bash", "-c", f"exec {docs_env.here(live_line)}"], cwd=ROOT, env=docs_env.environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # --once takes two scrapes, --interval apart: the live view, started first, has scraped by its end
        once = docs_env.shell(once_line).stdout
        assert "Requests (latency p50 / p99 per stage)" in once and "orders" in once, once
        live.send_signal(signal.SIGINT)
        out, err = live.communicate(timeout=60)
    finally:
        if live.poll() is None:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
    assert live.returncode == 0, err
    assert "Requests (latency p50 / p99 per stage)" in out, out + err


@pytest.mark.slow
def test_sql_while_serving(server, docs_env):
    """The README's query through the running server's Spark Connect endpoint (endpoints.json): the
    live view holds what the tests produced at the first query, acknowledged or not committed yet
    (the README says "at once"); then docs/table.md's partition-pruned query."""
    endpoints = json.loads((docs_env.data_dir / "_pipeline" / "endpoints.json").read_text())
    assert endpoints["spark_connect"] == f"sc://127.0.0.1:{docs_env.connect_port}"
    [command] = commands(block("README.md", "FROM records GROUP BY"))
    assert server.produced, "the producing tests ran first"
    want = expected_rows(server.produced)
    header, *rows = sql_rows(docs_env, command)
    assert header == ["topic", "partition", "count(1)", "max(offset)"]
    assert sorted(rows) == want
    query = " ".join(block("docs/table.md", "SELECT count(*) FROM records").text.split())
    header, *rows = sql_rows(docs_env, f'.venv/bin/pipeline sql "{query}"')
    assert rows == [["0"]]
    # docs/table.md's live view by its name: a row per topic produced, each record once
    [command] = commands(block("docs/table.md", "FROM records_live GROUP BY topic"))
    header, *rows = sql_rows(docs_env, command)
    per_topic: Counter = Counter()
    for (topic, _partition), n in server.produced.items():
        per_topic[topic] += n
    assert header == ["topic", "count(1)"]
    assert sorted(rows) == sorted([topic, str(n)] for topic, n in per_topic.items())


@pytest.mark.slow
def test_stop_with_ctrl_c(server):
    """SIGINT ends `pipeline serve` with 0 (so make's is 0 too), with nothing of its left (the
    multiprocessing resource tracker exits by itself on EOF of its pipe once the server has
    exited: allowed a few seconds, as tests/e2e/test_lifecycle.py allows a killed server's children)."""
    assert server.stop() == 0, server.diagnostics()
    deadline = time.monotonic() + 15
    while server.session_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not server.session_processes()
    # The walkthroughs' `pipeline sql` calls and Spark sessions closed their Connect sessions here
    # (114 releaseExecute lines in this log on 2026-12-01, ERRORs with stack traces among them,
    # before pipeline/persist/log4j2.properties left them out): a closed session is not an error.
    log = server.log.read_text(errors="replace")
    assert "releaseExecute" not in log and "SESSION_CLOSED" not in log, server.diagnostics()


@pytest.mark.slow
def test_compact_after_stop(server, docs_env):
    """`pipeline compact` with the server stopped (README, "Where the data lands")."""
    assert server.make.poll() is not None, "test_stop_with_ctrl_c runs first"
    out = docs_env.shell(f"{PIPELINE} compact", **docs_env.table_env()).stdout
    assert re.match(r"compacted \d+ partition\(s\): \d+ files into \d+;", out), out


@pytest.mark.slow
def test_sql_after_stop(server, docs_env):
    """The same README query with the server stopped (and compacted): a session of its own on the
    data directory's metastore, the same rows."""
    assert server.make.poll() is not None, "test_stop_with_ctrl_c runs first"
    [command] = commands(block("README.md", "FROM records GROUP BY"))
    header, *rows = sql_rows(docs_env, command)
    assert sorted(rows) == expected_rows(server.produced)
