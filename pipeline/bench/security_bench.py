"""``pipeline bench --security``: produce throughput and latency over PLAINTEXT, SSL and SASL_SSL (issue 9).

One server, one listener per security protocol (``--listen
PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0``), so every
protocol is measured against the same process, Spark and data directory, in
one run. Certificates are made for the run by ``trustme`` (a throw-away CA and
a server certificate for 127.0.0.1, in ``out/certs``); the SASL user is added
to the server's users store (``pipeline users add``) before the start, with
``--sasl-mechanism`` (SCRAM-SHA-512 by default: the costliest handshake).

For each of ``rounds`` rounds, each protocol in turn (interleaved, so a change
in machine load hits every protocol alike):

1. **throughput**: one confluent-kafka (librdkafka) producer at default
   settings (``acks=all``, librdkafka's default) plus the protocol's security
   settings writes ``records`` records of ``record_bytes`` value bytes to a
   fresh topic, as fast as acknowledged. Records/s and MB/s of acknowledged
   records, from the first ``produce()`` to the last delivery report;
   ``produce()`` -> acknowledgement p50/p99 under that load (librdkafka's own
   per-message latency, ``Message.latency()``); the server process tree's CPU
   seconds over the phase, per record.
2. **latency**: a new producer (so its connection set-up is timed too: TCP,
   TLS handshake, SASL exchange, metadata, first produce: "first ack ms")
   writes ``rate`` records/s for ``latency_s`` s, paced; ``produce()`` ->
   acknowledgement p50/p99/p99.9 at that steady rate.

Every figure is reported per protocol as the median over the rounds, with the
ratio to PLAINTEXT. Every acknowledged record's offset is checked: per
partition, exactly offsets 0..n-1 of its topic. Output in ``out``:
``results.json``, ``summary.md``, ``logs/``; a rich table on the terminal.
The server runs with ``--ack-on wal`` (its default): a produce is acknowledged
once in the write-ahead log, and the Spark table catches up behind it within
``buffer.memory`` (256 MiB). Before each phase the bench waits until the
server's persister is empty (``pipeline_buffered_bytes`` 0), and a phase's
default 100,000 x 1 KiB fits in that buffer, so the phases measure the front
end (TLS, SASL, framing, WAL) and not how fast Spark drains a backlog the
previous phase left. Every loop is bounded in count and time, and the server is stopped (killed after 60 s) however the
bench ends. Needs the dev extras (confluent-kafka, trustme).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

    from pipeline.bench.processes import ManagedProcess

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
USER = "bench"
LISTENER_LINE = re.compile(r"listening on (\S+):(\d+) \((\w+), (\w+)\)")
"""The server log's line for each listener after the first ("listening on HOST:PORT (NAME, PROTOCOL)")."""


@dataclass(slots=True)
class SecurityBenchOptions:
    """The plan of one ``--security`` run. Sizes in bytes, times in seconds, rates in records/s.

    Attributes:
        out: output directory.
        protocols: security protocols measured, each on its own listener (PLAINTEXT first: the reference).
        mechanism: the SASL mechanism of the SASL_* listeners.
        records: records per throughput phase.
        record_bytes: value bytes per record.
        partitions: partitions of the auto-created topics (server ``--num-partitions``).
        rounds: rounds over all protocols; figures are medians over rounds.
        rate: the latency phase's steady produce rate.
        latency_s: the latency phase's length.
        timeout_s: bound on each phase (records not acknowledged by then are reported, and fail the run).
        server_args: extra ``pipeline serve`` arguments.
    """

    out: Path = Path("bench-results") / "security"
    protocols: list[str] = field(default_factory=lambda: list(DEFAULT_PROTOCOLS))
    mechanism: str = "SCRAM-SHA-512"
    records: int = 100_000
    record_bytes: int = 1024
    partitions: int = 4
    rounds: int = 3
    rate: float = 2000.0
    latency_s: float = 10.0
    timeout_s: float = 180.0
    server_args: list[str] = field(default_factory=list)


SMOKE: dict[str, Any] = dict(records=3000, rounds=1, rate=300.0, latency_s=2.0, timeout_s=60.0)
"""``--security --smoke``: seconds per phase (the CI size, tests/bench/test_security_smoke.py)."""


def resolve_security(args: Any) -> SecurityBenchOptions:
    """The ``--security`` plan from ``pipeline bench`` arguments (``--smoke`` shrinks every phase).

    Raises:
        ValueError: an option out of range (the message names it).
    """
    base = SecurityBenchOptions(**(SMOKE if args.preset == "smoke" else {}))
    out = args.out if args.out != Path("bench-results") else base.out
    protocols = base.protocols
    if args.protocols:
        protocols = [p.strip().upper() for p in args.protocols.split(",") if p.strip()]
    opts = SecurityBenchOptions(
        out=out, protocols=protocols, mechanism=args.sasl_mechanism or base.mechanism,
        records=args.security_records or base.records,
        record_bytes=base.record_bytes if args.record_bytes is None else args.record_bytes,
        partitions=args.partitions or base.partitions, rounds=args.rounds or base.rounds,
        rate=args.rate or base.rate, latency_s=args.duration or base.latency_s, timeout_s=base.timeout_s,
        server_args=list(args.server_arg))
    if not protocols or any(p not in PROTOCOLS for p in protocols) or len(set(protocols)) != len(protocols):
        raise ValueError(f"--protocols are distinct names of {', '.join(PROTOCOLS)}; got {args.protocols!r}")
    if opts.mechanism not in MECHANISMS:
        raise ValueError(f"--sasl-mechanism is one of {', '.join(MECHANISMS)}; got {opts.mechanism!r}")
    if not 1 <= opts.records <= 10_000_000 or not 1 <= opts.record_bytes <= 1_000_000:
        raise ValueError("--security-records must be 1..10,000,000 and --record-bytes 1..1,000,000")
    if not 1 <= opts.partitions <= 64 or not 1 <= opts.rounds <= 20:
        raise ValueError("--security needs --partitions 1..64 and --rounds 1..20")
    if not 1 <= opts.rate <= 100_000 or not 1 <= opts.latency_s <= 600:
        raise ValueError("--security needs --rate 1..100,000 records/s and --duration 1..600 s")
    return opts


# ------------------------------------------------------------------- producing


def client_config(protocol: str, port: int, ca: Path, mechanism: str, password: str) -> dict[str, str]:
    """librdkafka settings for ``protocol``: its defaults plus the security ones (as a user would write them)."""
    config = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        config["ssl.ca.location"] = str(ca)
    if protocol.startswith("SASL_"):
        config.update({"sasl.mechanisms": mechanism, "sasl.username": USER, "sasl.password": password})
    return config


class _Acks:
    """Delivery reports of one producer: counts and largest offset per partition, latencies, errors."""

    def __init__(self) -> None:
        from hdrh.histogram import HdrHistogram

        self.per_partition: dict[int, int] = {}
        self.max_offset: dict[int, int] = {}
        self.latency_us = HdrHistogram(1, 600_000_000, 3)
        self.errors: list[str] = []
        self.key_bytes = 0
        self.first_ack: float | None = None
        self.last_ack = 0.0

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        p, offset = msg.partition(), msg.offset()
        if err is not None or p is None or offset is None:  # librdkafka sets both on a delivered message
            if len(self.errors) < 20:
                self.errors.append(str(err) if err is not None else f"delivered without a partition or offset: {msg}")
            return
        now = time.perf_counter()
        if self.first_ack is None:
            self.first_ack = now
        self.last_ack = now
        self.per_partition[p] = self.per_partition.get(p, 0) + 1
        self.max_offset[p] = max(self.max_offset.get(p, -1), offset)
        self.key_bytes += len(msg.key() or b"")
        latency = msg.latency()
        if latency is not None:
            self.latency_us.record_value(max(1, int(latency * 1e6)))

    @property
    def acked(self) -> int:
        return sum(self.per_partition.values())

    def offsets_ok(self) -> list[str]:
        """Problems with the acknowledged offsets: each partition must hold exactly 0..n-1 (a fresh topic)."""
        return [f"partition {p}: {n} acknowledged but the largest offset is {self.max_offset[p]}"
                for p, n in sorted(self.per_partition.items()) if self.max_offset[p] != n - 1]

    def percentiles_ms(self) -> dict[str, float]:
        h = self.latency_us
        if h.get_total_count() == 0:
            return {}
        return {name: h.get_value_at_percentile(q) / 1000 for name, q in
                (("p50", 50), ("p99", 99), ("p99.9", 99.9))} | {"max": h.get_max_value() / 1000}


def produce(config: dict[str, str], topic: str, records: int, record_bytes: int, timeout_s: float,
            rate: float | None = None, go: Callable[[], object] | None = None) -> dict:
    """Produce ``records`` values of ``record_bytes`` bytes with one new librdkafka producer.

    ``rate`` None: as fast as acknowledged; else paced at ``rate`` records/s.
    ``go``: called once the producer exists, before the first produce() (e.g. a
    barrier shared by several producer processes); the timings start after it.
    Returns figures: ``acked`` (partition -> records acknowledged; offsets 0..n-1 on a
    fresh topic, checked), ``records`` (acknowledged), ``bytes`` (value bytes
    acknowledged), ``key_bytes``, ``seconds`` (first produce() to last
    acknowledgement), ``t_start``/``t_last_ack`` (those two instants on
    ``time.perf_counter``, CLOCK_MONOTONIC on Linux: comparable between
    processes), ``records_per_s``, ``mb_per_s`` (value MB, 10^6 bytes),
    ``latency_ms`` (produce() -> acknowledgement percentiles), ``latency_hdr``
    (the same latencies in us, an encoded ``hdrh`` histogram: add several with
    ``HdrHistogram.decode``), ``first_ack_ms`` (producer creation -> first
    acknowledgement: connection set-up included), ``errors``, ``timed_out``.
    """
    from confluent_kafka import Producer

    acks = _Acks()
    created = time.perf_counter()
    producer = Producer(config)
    value = os.urandom(record_bytes)
    if go is not None:
        go()
    started = time.perf_counter()
    deadline = started + timeout_s
    sent = 0
    while sent < records and time.perf_counter() < deadline:
        if rate is not None:
            due = started + sent / rate
            wait = due - time.perf_counter()
            if wait > 0:
                producer.poll(min(wait, 0.05))
                continue
        try:
            producer.produce(topic, key=b"%d" % sent, value=value, on_delivery=acks)
            sent += 1
        except BufferError:  # librdkafka's queue is full: serve delivery reports until it drains a little
            producer.poll(0.05)
            continue
        if sent % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(max(1.0, deadline - time.perf_counter()))
    n = acks.acked
    seconds = max(1e-9, (acks.last_ack or time.perf_counter()) - started)
    return {"acked": dict(acks.per_partition), "records": n, "bytes": n * record_bytes, "key_bytes": acks.key_bytes,
            "seconds": seconds, "t_start": started, "t_last_ack": started + seconds, "records_per_s": n / seconds,
            "mb_per_s": n * record_bytes / seconds / 1e6, "latency_ms": acks.percentiles_ms(),
            "latency_hdr": acks.latency_us.encode().decode("ascii"),
            "first_ack_ms": (acks.first_ack - created) * 1000 if acks.first_ack is not None else None,
            "errors": acks.errors + acks.offsets_ok(), "timed_out": sent < records or remaining > 0}


# ---------------------------------------------------------------------- summary


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[dict], protocols: list[str]) -> list[dict]:
    """Per protocol, the median over rounds of every figure, and ratios to the first protocol (PLAINTEXT).

    ``runs``: dicts with ``protocol``, ``throughput`` and ``latency`` (``produce`` figures) and
    ``server_cpu_s`` (of the throughput phase). Pure.
    """
    rows: list[dict[str, Any]] = []
    for protocol in protocols:
        mine = [r for r in runs if r["protocol"] == protocol]
        t = [r["throughput"] for r in mine]
        lat = [r["latency"] for r in mine]
        rows.append({
            "protocol": protocol, "rounds": len(mine),
            "records_per_s": _median([x["records_per_s"] for x in t]),
            "mb_per_s": _median([x["mb_per_s"] for x in t]),
            "loaded_p50_ms": _median([x["latency_ms"].get("p50") for x in t]),
            "loaded_p99_ms": _median([x["latency_ms"].get("p99") for x in t]),
            "server_cpu_us_per_record": _median([r["server_cpu_s"] / x["records"] * 1e6 if x["records"] else None
                                                 for r, x in zip(mine, t)]),
            "p50_ms": _median([x["latency_ms"].get("p50") for x in lat]),
            "p99_ms": _median([x["latency_ms"].get("p99") for x in lat]),
            "p99_9_ms": _median([x["latency_ms"].get("p99.9") for x in lat]),
            "first_ack_ms": _median([x["first_ack_ms"] for x in lat]),
            "ok": all(not x["errors"] and not x["timed_out"] for x in t + lat),
        })
    base = rows[0] if rows else None
    for row in rows:
        for key in ("records_per_s", "p99_ms"):
            b: float | None = (base or {}).get(key)
            v: float | None = row[key]
            row[f"{key}_vs_{protocols[0].lower()}"] = v / b if b and v is not None else None
    return rows


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


COLUMNS = ("protocol", "records/s", "MB/s", "x PLAINTEXT", "loaded p50 ms", "loaded p99 ms", "srv CPU us/rec",
           "p50 ms", "p99 ms", "p99.9 ms", "p99 x PLAINTEXT", "first ack ms", "check")


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The summary as strings, in ``COLUMNS`` order."""
    out: list[tuple[str, ...]] = []
    for r in rows:
        ratio = next((v for k, v in r.items() if k.startswith("records_per_s_vs_")), None)
        p99_ratio = next((v for k, v in r.items() if k.startswith("p99_ms_vs_")), None)
        out.append((r["protocol"], _fmt(r["records_per_s"], ",.0f"), _fmt(r["mb_per_s"], ".1f"), _fmt(ratio, ".2f"),
                    _fmt(r["loaded_p50_ms"], ".1f"), _fmt(r["loaded_p99_ms"], ".1f"),
                    _fmt(r["server_cpu_us_per_record"], ".1f"), _fmt(r["p50_ms"], ".2f"), _fmt(r["p99_ms"], ".2f"),
                    _fmt(r["p99_9_ms"], ".2f"), _fmt(p99_ratio, ".2f"), _fmt(r["first_ack_ms"], ".0f"),
                    "OK" if r["ok"] else "INCOMPLETE"))
    return out


def _summary_md(result: dict) -> str:
    m, o = result["machine"], result["options"]
    lines = ["# pipeline bench --security", "", f"`{result['command']}`", "",
             f"{result['started_utc']}, {m['cpus']} CPUs, {m['memory_gb']} GB, Python {m['python']}, "
             f"Linux {m['kernel']}, load average {m['load_average'][0]:.1f} at start; "
             f"{o['records']:,} records of {o['record_bytes']} B per throughput phase over {o['partitions']} "
             f"partitions, {o['rate']:g} records/s for {o['latency_s']:g} s per latency phase, "
             f"SASL {o['mechanism']}, median of {o['rounds']} round(s).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(result["summary"])]
    lines += ["", "records/s, MB/s, loaded p50/p99 and server CPU: the throughput phase (as fast as acknowledged); "
                  "p50/p99/p99.9: produce() -> acknowledgement at the steady rate; first ack: a new producer's "
                  "connection set-up plus its first produce."]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- main


def _make_certs(cert_dir: Path) -> tuple[Path, Path]:
    """(CA bundle, server key+chain PEM) for 127.0.0.1, made by trustme for this run."""
    import trustme

    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_path, keystore = cert_dir / "ca.pem", cert_dir / "server.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(keystore))
    keystore.chmod(0o600)
    return ca_path, keystore


def _listener_ports(server: ManagedProcess, log_path: Path, protocols: list[str],
                    timeout_s: float = 30.0) -> dict[str, int]:
    """Port of every listener: the first from the server's ready line, the others from its log."""
    deadline = time.monotonic() + timeout_s
    ports = {protocols[0]: server.port}
    while True:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        ports.update({name: int(port) for _h, port, name, _p in LISTENER_LINE.findall(text)})
        if set(protocols) <= ports.keys():
            return ports
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not log a port for {sorted(set(protocols) - ports.keys())}")
        time.sleep(0.1)


def wait_for_table(metrics_ports: Sequence[int | None], timeout_s: float) -> float | None:
    """Wait until the persister of every server (one ``/metrics`` port each) holds nothing
    (``pipeline_buffered_bytes`` 0: everything acknowledged is in the table), so the next
    phase starts with an empty ``buffer.memory``.

    Returns the seconds waited, or None if a /metrics was unreachable or they did not drain in ``timeout_s``.
    """
    from pipeline.bench.processes import counter, scrape_metrics

    ports = [port for port in metrics_ports if port is not None]
    if len(ports) < len(metrics_ports):  # a server printed no metrics port
        return None
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            buffered = sum(counter(scrape_metrics(port), "pipeline_buffered_bytes") or 0.0 for port in ports)
        except OSError:
            return None
        if not buffered:
            return time.monotonic() - started
        time.sleep(0.25)
    return None


def main(opts: SecurityBenchOptions, argv: list[str] | None = None) -> int:
    """Run the rounds; exit code 1 if a phase missed records, got errors or the server failed."""
    from rich.console import Console
    from rich.table import Table

    from pipeline.bench.processes import ManagedProcess, cpu_since, machine_and_kernel, server_cpu
    from pipeline.security.users import UserStore

    console = Console(width=None if Console().is_terminal else 180)
    out = opts.out
    data_dir = out / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    command = "pipeline bench " + " ".join(argv or ["--security"])
    result: dict[str, Any] = {"command": command, "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "machine": machine_and_kernel(),
                              "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
                              "runs": []}
    ca, keystore = _make_certs(out / "certs")
    password = os.urandom(12).hex()  # this run's only; never printed or written
    data_dir.mkdir(parents=True)
    UserStore.for_data_dir(data_dir).add(USER, password)
    listen = ",".join(f"{p}://127.0.0.1:0" for p in opts.protocols)
    log_path = out / "logs" / "server.log"
    log_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pipeline.cli", "serve", "--listen", listen, "--data-dir", str(data_dir),
           "--ssl-keystore-location", str(keystore), "--metrics-port", "0", "--spark-connect-port", "0",
           "--num-partitions", str(opts.partitions), "--ack-on", "wal", *opts.server_args]
    server = ManagedProcess("server", cmd, log_path)
    failed = False
    try:
        console.print(f"starting `pipeline {' '.join(cmd[3:])}`")
        server.start()
        result["server"] = {"command": "pipeline " + " ".join(cmd[3:]), "startup_s": round(server.startup_s, 1),
                            "listening_s": round(server.listening_s or 0.0, 1)}
        ports = _listener_ports(server, log_path, opts.protocols)
        for r in range(opts.rounds):
            for protocol in opts.protocols:
                config = client_config(protocol, ports[protocol], ca, opts.mechanism, password)
                topic = f"bench-security-{protocol.lower()}-{r}"
                console.print(f"round {r + 1}/{opts.rounds} {protocol}: {opts.records:,} records as fast as acked, "
                              f"then {opts.rate:g}/s for {opts.latency_s:g} s")
                drained = wait_for_table([server.metrics_port], opts.timeout_s)
                cpu0 = server_cpu(server)
                throughput = produce(config, topic, opts.records, opts.record_bytes, opts.timeout_s)
                cpu = cpu_since(cpu0, server_cpu(server))
                wait_for_table([server.metrics_port], opts.timeout_s)
                steady = produce(config, topic + "-latency", max(1, int(opts.rate * opts.latency_s)),
                                 opts.record_bytes, opts.latency_s + opts.timeout_s, rate=opts.rate)
                result["runs"].append({"round": r, "protocol": protocol, "throughput": throughput,
                                       "latency": steady, "server_cpu_s": cpu, "table_wait_s": drained})
                for phase in (throughput, steady):
                    failed |= bool(phase["errors"]) or phase["timed_out"]
        code = server.stop()
        result["server"]["exit_code"] = code
        failed |= code != 0
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        console.print(f"[red]security bench failed: {result['error']}[/red]")
        failed = True
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
    result["summary"] = summarize(result["runs"], opts.protocols)
    result["failed"] = failed
    (out / "results.json").write_text(json.dumps(result, indent=1))
    if not result["runs"]:
        return 1
    (out / "summary.md").write_text(_summary_md(result))
    table = Table(title=f"{command}  ({opts.records:,} x {opts.record_bytes} B, {opts.partitions} partitions, "
                        f"SASL {opts.mechanism}, median of {opts.rounds})")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("protocol", "check") else "right")
    for row in table_rows(result["summary"]):
        table.add_row(*row)
    console.print(table)
    console.print(f"results: {out / 'results.json'}, {out / 'summary.md'}")
    return 1 if failed else 0
