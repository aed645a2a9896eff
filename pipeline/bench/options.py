"""``pipeline bench`` options and presets (argparse only: importing this is cheap).

A bench invocation is a *plan*: the server configurations to start (one
server subprocess each), the load shapes to run against each, and the bounds
of every run. Presets:

* ``--smoke``: the CI size. Three servers (baseline, multiqueue with 2 queues,
  shared-unmuted), one shape (C=4, K=5, acks=-1), 1.5 s of load per run:
  proves the command end to end in ~1.5 minutes, most of it Spark start-ups.
* ``--quick`` (default): the shapes the targets are stated for (C=1 and C=64
  with K=5 and acks=-1; C=64, K=5, acks=0) against baseline, multiqueue with 4
  queues and the ablation, 2.5 s per run, except the headline C=1, K=5,
  acks=-1 comparison of baseline and multiqueue: 200 completed requests per
  model in 4 repeats of 50, interleaved between the models (``HEADLINE_SHAPE``;
  each of baseline's requests there waits a whole Spark flush).
* ``--hostile`` (not a preset of the sweep; see ``pipeline.bench.hostile_runner``):
  good producers at ``--rate`` alone, then beside every hostile client, each
  phase ``--duration`` seconds (default 270, ~10 minutes in all).
* ``--consume`` (not a preset of the sweep; see ``pipeline.bench.consume_bench``):
  produce, consume from the WAL and from the table, ack-to-consumer latency
  (``--smoke`` shrinks it to CI size).
* ``--security`` (not a preset of the sweep; see ``pipeline.bench.security_bench``):
  produce throughput and latency over PLAINTEXT, SSL and SASL_SSL listeners of
  one server (``--smoke`` shrinks it to CI size).
* ``--transactions`` (not a preset of the sweep; see ``pipeline.bench.transactions_bench``):
  transactional produce on one broker and on ``--brokers 3``, side by side (``--smoke`` shrinks
  it to CI size).
* ``--full``: every configuration and queue count 1, 2, 4, 8, connections
  1, 8, 64, in-flight 1 and 5, acks -1 and 0, 8 s per run (~15-20 minutes).

``--quick`` and ``--full`` end with the brokers phase (``pipeline.bench.brokers_bench``):
for each N of ``--brokers`` (quick 1,2 with 100,000 records per N, N=2 only on a
machine of ``QUICK_BROKERS_MIN_CORES`` cores or more; full 1,2,4
with 200,000), ``pipeline serve --brokers N --ack-on wal`` and librdkafka
producers at default settings writing 1 KiB records: records/s, MB/s,
p50/p99/p99.9, CPU s per million records and peak RSS of the brokers, into the
same results.json. ``--no-brokers`` skips it; ``--smoke`` runs it only when
``--brokers`` is given (it costs a Spark Connect start-up, ~30-60 s, per N).
``--brokers N,...`` *without* a preset flag runs that phase alone (its own
results in ``bench-results/brokers``, ``--record-bytes`` and ``--partitions``
then apply to it; in a preset run they are the sweep's and the phase keeps
1 KiB records and 4 partitions per producer topic).

Explicit options override the preset's value.
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_NAMES = ("baseline", "multiqueue", "shared-unmuted")

PRESETS: dict[str, dict] = {
    "smoke": dict(configs=["baseline", "multiqueue", "shared-unmuted"], queues=[2], connections=[4],
                  in_flight=[5], acks=[-1], duration=1.5, requests=20_000, brokers=[], brokers_records=6000,
                  headline_requests=0, headline_repeats=1, acks0_pairs=0),
    "quick": dict(configs=list(CONFIG_NAMES), queues=[4], connections=[1, 64], in_flight=[5],
                  acks=[-1, 0], duration=2.5, requests=120_000, brokers=[1, 2], brokers_records=100_000,
                  headline_requests=200, headline_repeats=4, acks0_pairs=3),
    "full": dict(configs=list(CONFIG_NAMES), queues=[1, 2, 4, 8], connections=[1, 8, 64],
                 in_flight=[1, 5], acks=[-1, 0], duration=8.0, requests=250_000, brokers=[1, 2, 4],
                 brokers_records=200_000, headline_requests=400, headline_repeats=5, acks0_pairs=3),
}
QUICK_BROKERS_MIN_CORES = 4
"""``--quick`` runs brokers N = 2 only on a machine with at least this many cores: below it the
N = 2 target cannot be judged (``report.TARGET_BROKERS_MIN_CORES``), and its minute of
Spark Connect start-up and load pays for the headline comparison's requests instead."""
HEADLINE_SHAPE = (1, 5, -1)
"""(C, K, acks) of the headline comparison (multiqueue against baseline at one connection):
sized by completed requests (``headline_requests`` per model over ``headline_repeats``
repeats) rather than by ``duration``, since each of baseline's requests waits a whole
Spark flush (0.5-2 s) there."""
HEADLINE_MAX_S = 120.0
"""Bound on the sending time of one headline repeat (a slow machine completes fewer requests;
the report says how many)."""
ACKS0_SHAPE = (64, 5, 0)
"""(C, K, acks) of the acks=0 target (a fraction of the framing ceiling). On a multiqueue server
every acks=0 shape runs ``acks0_pairs`` times, each right after an echo-ceiling run of the same
(C, K), and the fraction of the ceiling is taken pair by pair: with one ceiling run per bench,
minutes away from the run it divided, the ratio swung by +-25 %."""
QUICK_SHAPES = ((1, 5, -1), (64, 5, -1), (64, 5, 0))
"""(C, K, acks) that ``--quick`` runs: exactly the shapes the targets name."""


def int_list(text: str) -> list[int]:
    """``"1,8,64"`` -> [1, 8, 64] (argparse type)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def shape_list(text: str) -> list[tuple[int, int, int]]:
    """``"1:5:-1,64:5:0"`` -> [(1, 5, -1), (64, 5, 0)]: (C, K, acks) (argparse type)."""
    shapes = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        try:
            c, k, acks = (int(x) for x in item.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a shape is C:K:ACKS, e.g. 64:5:0; got {item!r}") from None
        shapes.append((c, k, acks))
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one shape")
    return shapes


def config_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in CONFIG_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"configurations are {', '.join(CONFIG_NAMES)}; got {text!r}")
    return names


BROKERS_CLIENTS = ("confluent", "kcat")
"""``--brokers-client`` choices (``pipeline.bench.brokers_bench``)."""


@dataclass(slots=True)
class BrokersBenchOptions:
    """The plan of the brokers phase. Sizes in bytes, times in seconds.

    Attributes:
        brokers: broker counts N, in run order.
        producers: producer processes per N.
        records: records per N, all producers together.
        record_bytes: value bytes per record.
        partitions: partitions of each producer's topic.
        timeout_s: bound on each producer's load (records not acknowledged by then count as undelivered).
        server_args: extra ``pipeline serve`` arguments.
        client: "confluent" (confluent-kafka producer processes, the producing loop in Python)
            or "kcat" (kcat processes: librdkafka from C, ``pipeline.bench.brokers_bench.KCAT_DOC``).
    """

    brokers: list[int] = field(default_factory=lambda: [1, 2])
    producers: int = 4
    records: int = 100_000
    record_bytes: int = 1024
    partitions: int = 4
    timeout_s: float = 300.0
    server_args: list[str] = field(default_factory=list)
    client: str = "confluent"

    def check(self) -> "BrokersBenchOptions":
        """Raises ValueError naming the option out of range."""
        if not self.brokers or any(not 1 <= n <= 32 for n in self.brokers):
            raise ValueError("--brokers values must be 1..32")
        if not 1 <= self.producers <= 64 or not self.producers <= self.records <= 10_000_000:
            raise ValueError("--producers must be 1..64 and --brokers-records producers..10,000,000")
        if not 1 <= self.record_bytes <= 1_000_000 or not 1 <= self.partitions <= 256:
            raise ValueError("--record-bytes must be 1..1,000,000 and --partitions 1..256 with --brokers")
        if self.client not in BROKERS_CLIENTS:
            raise ValueError(f"--brokers-client must be one of {', '.join(BROKERS_CLIENTS)}")
        if self.client == "kcat" and shutil.which("kcat") is None:
            raise ValueError("--brokers-client kcat: kcat is not installed (Debian: apt-get install kcat)")
        return self



SUSTAINED_RECORDS = 600_000
"""``--sustained``: records in all (2 x 300,000 x 1 KiB = 614 MB, over twice the default buffer.memory)."""
SUSTAINED_SMOKE_RECORDS = 10_000
DEFAULT_BUFFER_MEMORY = 256 * 2**20
"""The server's default ``buffer.memory`` (``pipeline.config.ServerConfig``), bytes."""


@dataclass(slots=True)
class SustainedBenchOptions:
    """The plan of ``pipeline bench --sustained`` (``pipeline.bench.sustained_bench``).
    Sizes in bytes, times in seconds.

    Attributes:
        out: output directory (results.json, summary.md, logs, the data directory).
        records: records in all producers together.
        record_bytes: value bytes per record (keys are ``P-SEQ``, a few bytes more).
        producers: confluent-kafka producer processes.
        partitions: partitions of the topic.
        naive_records_per_write: records per write of the naive Spark loop (at most ``records``).
        buffer_memory: the server's ``buffer.memory`` (to say whether the run exceeded it).
        timeout_s: bound on each producer's load, and on the naive loop.
        server_args: extra ``pipeline serve`` arguments.
        naive_with_server: start the naive loop's JVM beside the server's (``--smoke``: shorter;
            the server's time to ready then includes two JVM start-ups at once) rather than
            once the server is ready.
        value_format: ``"raw"``: the records table only; ``"avro"``: then, on the same server
            (started with its Schema Registry), the same load of registry-framed Avro values
            to a ``value.format=avro`` topic, measured into its typed table.
    """

    out: Path = Path("bench-results/sustained")
    records: int = SUSTAINED_RECORDS
    record_bytes: int = 1024
    producers: int = 2
    partitions: int = 4
    naive_records_per_write: int = 100_000
    buffer_memory: int = DEFAULT_BUFFER_MEMORY
    timeout_s: float = 900.0
    server_args: list[str] = field(default_factory=list)
    naive_with_server: bool = False
    value_format: str = "raw"

    def check(self) -> "SustainedBenchOptions":
        """Raises ValueError naming the option out of range."""
        if self.value_format not in ("raw", "avro"):
            raise ValueError(f"--value-format must be raw or avro, not {self.value_format!r}")
        if self.value_format == "avro" and not 600 <= self.record_bytes <= 8000:
            raise ValueError("--record-bytes must be 600..8,000 with --value-format avro")
        if not 1 <= self.producers <= 16 or not self.producers <= self.records <= 20_000_000:
            raise ValueError("--producers must be 1..16 and --sustained-records producers..20,000,000")
        if not 1 <= self.record_bytes <= 1_000_000 or not 1 <= self.partitions <= 256:
            raise ValueError("--record-bytes must be 1..1,000,000 and --partitions 1..256 with --sustained")
        return self


def resolve_sustained(args: argparse.Namespace) -> SustainedBenchOptions:
    """The ``--sustained`` plan from the parsed options (``--smoke``: 10,000 records, the naive loop's
    JVM started beside the server's).

    Raises:
        ValueError: an option out of range (the message names it).
    """
    d = SustainedBenchOptions()
    buffer_memory = d.buffer_memory
    for i, arg in enumerate(args.server_arg):  # --buffer-memory=N or --buffer-memory N among --server-arg
        if arg.startswith("--buffer-memory="):
            buffer_memory = int(arg.split("=", 1)[1])
        elif arg == "--buffer-memory" and i + 1 < len(args.server_arg):
            buffer_memory = int(args.server_arg[i + 1])
    records = args.sustained_records or (SUSTAINED_SMOKE_RECORDS if args.preset == "smoke" else d.records)
    return SustainedBenchOptions(
        out=args.out if args.out != Path("bench-results") else Path("bench-results") / "sustained",
        records=records, record_bytes=args.record_bytes or d.record_bytes,
        producers=getattr(args, "producers", None) or d.producers, partitions=args.partitions or d.partitions,
        buffer_memory=buffer_memory, server_args=list(args.server_arg), naive_with_server=args.preset == "smoke",
        value_format=getattr(args, "value_format", None) or d.value_format).check()


@dataclass(slots=True)
class BenchOptions:
    """A resolved plan. Sizes in bytes, times in seconds.

    Attributes:
        preset: "smoke", "quick" or "full".
        out: output directory (results.json, plots, server logs, data dirs).
        configs: configuration names, in run order.
        queues: multiqueue queue counts (one server per count).
        connections, in_flight, acks: the swept load shape values.
        shapes: explicit (C, K, acks) list, or None for the full cross product.
        records, record_bytes, partitions: R, S, P.
        requests: bound on requests per run (all connections).
        duration: bound on sending time per run.
        client: "raw" or "confluent".
        io_threads: handler pool of baseline and shared-unmuted.
        linger_ms, ack_on: passed to every server.
        ceiling: measure the echo framing ceiling.
        server_args: extra ``pipeline serve`` arguments.
        brokers: the brokers phase's broker counts N ([]: no brokers phase).
        producers: the brokers phase's producer processes.
        brokers_records: the brokers phase's records per N (1 KiB each).
        brokers_client: the brokers phase's producers, "confluent" or "kcat".
        headline_requests: completed requests per model (baseline, each multiqueue) of the
            ``HEADLINE_SHAPE`` runs, all repeats together (0: that shape is a plain
            ``duration``-bounded run like the others).
        headline_repeats: runs of ``HEADLINE_SHAPE`` per model, interleaved between the models.
        acks0_pairs: on each multiqueue server, runs of each acks=0 shape, each paired with an
            echo ceiling run of the same (C, K) just before it (0 or 1: one run, against the
            ceiling measured first, like the other shapes; ``ACKS0_SHAPE``).
    """

    preset: str
    out: Path
    configs: list[str]
    queues: list[int]
    connections: list[int]
    in_flight: list[int]
    acks: list[int]
    shapes: list[tuple[int, int, int]] | None
    records: int = 10
    record_bytes: int = 64
    partitions: int = 4
    requests: int = 200_000
    duration: float = 3.0
    client: str = "raw"
    io_threads: int = 8
    linger_ms: float = 50.0
    ack_on: str = "spark"
    ceiling: bool = True
    server_args: list[str] = field(default_factory=list)
    brokers: list[int] = field(default_factory=list)
    producers: int = 4
    brokers_records: int = 100_000
    brokers_client: str = "confluent"
    headline_requests: int = 0
    headline_repeats: int = 1
    acks0_pairs: int = 0

    def acks0_paired(self) -> bool:
        """True if acks=0 shapes run in ceiling pairs on multiqueue servers (``ACKS0_SHAPE``)."""
        return self.ceiling and self.acks0_pairs > 1 and any(a == 0 for _, _, a in self.all_shapes())

    def headline(self) -> bool:
        """True if ``HEADLINE_SHAPE`` is run sized by completed requests, before the other shapes."""
        return self.headline_requests > 0 and HEADLINE_SHAPE in self.all_shapes()

    def brokers_plan(self) -> BrokersBenchOptions | None:
        """The brokers phase's ``BrokersBenchOptions`` (None: no phase)."""
        if not self.brokers:
            return None
        return BrokersBenchOptions(brokers=list(self.brokers), producers=self.producers,
                                   records=self.brokers_records, server_args=list(self.server_args),
                                   client=self.brokers_client)

    def all_shapes(self) -> list[tuple[int, int, int]]:
        """(C, K, acks) of every run against every server, in run order."""
        if self.shapes is not None:
            return list(self.shapes)
        return [(c, k, a) for a in self.acks for k in self.in_flight for c in self.connections]


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The ``pipeline bench`` options; sets ``func`` to run the benchmark."""
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="preset", action="store_const", const="quick",
                      help="the target shapes against every configuration, 2.5 s per run (default)")
    size.add_argument("--full", dest="preset", action="store_const", const="full",
                      help="the whole sweep, 8 s per run")
    size.add_argument("--smoke", dest="preset", action="store_const", const="smoke",
                      help="tiny end-to-end check for CI (a few seconds of load)")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="output directory (default ./bench-results; with --hostile ./bench-results/hostile)")
    p.add_argument("--configs", type=config_list, default=None,
                   help="comma list of baseline,multiqueue,shared-unmuted")
    p.add_argument("--queues", type=int_list, default=None, help="multiqueue queue counts, e.g. 1,2,4,8")
    p.add_argument("--connections", type=int_list, default=None, help="connection counts C, e.g. 1,8,64")
    p.add_argument("--shapes", type=shape_list, default=None, metavar="C:K:ACKS,...",
                   help="exactly these load shapes, in this order, instead of the cross product of "
                        "--connections, --in-flight and --acks, e.g. 1:5:-1,64:5:0")
    p.add_argument("--in-flight", type=int_list, default=None, help="requests in flight per connection K, e.g. 1,5")
    p.add_argument("--acks", type=int_list, default=None,
                   help="acks values: --acks -1, or a list written --acks=-1,0")
    p.add_argument("--records-per-request", type=int, default=None, help="records per request R (default 10)")
    p.add_argument("--record-bytes", type=int, default=None, help="value bytes per record S (default 64)")
    p.add_argument("--partitions", type=int, default=None, help="partitions P of each run's topic (default 4)")
    p.add_argument("--requests", type=int, default=None, help="bound on requests per run")
    p.add_argument("--duration", type=float, default=None, help="bound on seconds of load per run")
    p.add_argument("--client", choices=["raw", "confluent"], default="raw",
                   help="raw: this package's socket load generator; confluent: confluent-kafka producers")
    p.add_argument("--io-threads", type=int, default=8, help="handler pool of baseline/shared-unmuted (default 8)")
    p.add_argument("--linger-ms", type=float, default=50.0, help="server --linger-ms (default 50)")
    p.add_argument("--ack-on", choices=["spark", "wal"], default=None,
                   help="server --ack-on: acks=-1 answered after the Spark write (default, as the "
                        "targets are stated) or after the WAL fsync (the default with --hostile, the "
                        "server's own default)")
    p.add_argument("--headline-requests", type=int, default=None,
                   help="completed requests per model (baseline, multiqueue) of the C=1, K=5, acks=-1 runs, "
                        "over all repeats; those runs are interleaved between the models, before the other "
                        "shapes, and not bounded by --duration (default: quick 200, full 400; 0: a plain run)")
    p.add_argument("--headline-repeats", type=int, default=None,
                   help="repeats of the C=1, K=5, acks=-1 runs per model, for the ratio's spread "
                        "(default: quick 4, full 5)")
    p.add_argument("--acks0-pairs", type=int, default=None,
                   help="multiqueue runs of each acks=0 shape, each right after an echo-ceiling run of its C and K: "
                        "the acks=0 target takes the median of the pairs' fractions (default: quick and full 3; "
                        "0 or 1: one run against the ceiling measured first)")
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                   help="skip the echo framing-ceiling measurement")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every `pipeline serve` (repeatable), e.g. --server-arg=--network-threads=2")
    table = p.add_argument_group("the table (--table)")
    table.add_argument("--table", action="store_true",
                       help="a steady confluent-kafka load over --hours simulated hours, then files per "
                            "partition-hour, mean file size, acknowledgement-to-queryable lag and query times "
                            "before and after compaction (pipeline.bench.table_bench; --rate records/s for "
                            "--duration s, default 200/s for 60 s)")
    table.add_argument("--hours", type=int, default=24, help="--table: simulated hours (default 24)")
    table.add_argument("--commit-interval-ms", type=int, default=None,
                       help="--table: server --table-commit-interval-ms (default: the server's)")
    table.add_argument("--repeats", type=int, default=5, help="--table: runs of each query, median (default 5)")
    consume = p.add_argument_group("consuming (--consume)")
    consume.add_argument("--consume", action="store_true",
                         help="produce --consume-records records (1 KiB values by default), consume them from the "
                              "WAL, restart the server with short log retention and consume them from the table, "
                              "and measure acknowledgement-to-consumer latency at --rate records/s for --duration s "
                              "(pipeline.bench.consume_bench; default 200,000 records, 1000/s for 20 s)")
    consume.add_argument("--consume-records", type=int, default=None,
                         help="--consume: records produced and consumed (default 200000; --smoke 3000)")
    consume.add_argument("--consumers", default=None,
                         help="--consume: comma list of consumer clients, confluent,kafka-python (default both)")
    consume.add_argument("--no-table-phase", dest="table_phase", action="store_false",
                         help="--consume: skip the restart with short retention and the reads from the table")
    security = p.add_argument_group("security protocols (--security)")
    security.add_argument("--security", action="store_true",
                          help="one server with a listener per security protocol; per protocol, a librdkafka "
                               "producer at default settings writes --security-records records (1 KiB) as fast as "
                               "acknowledged, then --rate records/s for --duration s: records/s, MB/s, p50/p99, "
                               "server CPU per record, median of --rounds interleaved rounds "
                               "(pipeline.bench.security_bench; default 100,000 records, 2000/s for 10 s, 3 rounds)")
    security.add_argument("--protocols", default=None,
                          help="--security: comma list of PLAINTEXT,SSL,SASL_PLAINTEXT,SASL_SSL, the first is the "
                               "reference (default PLAINTEXT,SSL,SASL_SSL)")
    security.add_argument("--sasl-mechanism", default=None,
                          help="--security: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default)")
    security.add_argument("--security-records", type=int, default=None,
                          help="--security: records per throughput phase (default 100000; --smoke 3000)")
    security.add_argument("--rounds", type=int, default=None, help="--security: rounds over the protocols (default 3)")
    brokers = p.add_argument_group("several brokers (--brokers; part of --quick and --full)")
    brokers.add_argument("--brokers", type=int_list, default=None, metavar="N,...",
                         help="for each N, `pipeline serve --brokers N --ack-on wal` on one shared Spark Connect "
                              "server and --producers librdkafka producer processes at default settings (acks=all) "
                              "writing --brokers-records 1 KiB records as fast as acknowledged: records/s, MB/s, "
                              "p50/p99/p99.9, CPU s per million records, RSS (pipeline.bench.brokers_bench). With "
                              "--quick/--full/--smoke: the N list of the run's brokers phase (default 1,2 quick, "
                              "1,2,4 full, none smoke); alone: only that phase, into bench-results/brokers; with "
                              "--transactions: the broker counts it compares (default 1,3)")
    brokers.add_argument("--no-brokers", action="store_true",
                         help="--quick/--full: skip the brokers phase")
    brokers.add_argument("--producers", type=int, default=None, help="--brokers: producer processes (default 4)")
    brokers.add_argument("--brokers-client", choices=("confluent", "kcat"), default="confluent",
                         help="--brokers: producer processes are confluent-kafka (default; latency figures) or kcat "
                              "(librdkafka without a Python call per record: the client costs the brokers' cores "
                              "less; no latency figures)")
    brokers.add_argument("--brokers-records", type=int, default=None,
                         help="--brokers: records per broker count, all producers (default 100000; full 200000; "
                              "smoke 6000)")
    sustained = p.add_argument_group("sustained ingest (--sustained)")
    sustained.add_argument("--sustained", action="store_true",
                           help="one server at defaults (--ack-on wal), --producers (default 2) confluent-kafka "
                                "producers at default settings writing --sustained-records records of --record-bytes "
                                "(default 600,000 x 1 KiB: more than buffer.memory) to a topic of --partitions (4): "
                                "acknowledged MB/s, lag to queryable, lost/duplicated against the table, CPU s per "
                                "million records of every process, time to listening and to ready, and a naive Spark "
                                "loop (createDataFrame(arrow).write.parquet, 100,000 records a write, local[*], its "
                                "own JVM) on the same records as the ratio's denominator "
                                "(pipeline.bench.sustained_bench; --smoke: 10,000 records)")
    sustained.add_argument("--sustained-records", type=int, default=None,
                           help=f"--sustained: records, all producers (default {SUSTAINED_RECORDS}; --smoke "
                                f"{SUSTAINED_SMOKE_RECORDS}); with --record-bytes 100 the default measures CPU per "
                                "record at 100 B (it then fits buffer.memory)")
    sustained.add_argument("--value-format", choices=("raw", "avro"), default=None,
                           help="--sustained: raw (default) measures the records table; avro then runs the same "
                                "load again on the same server, started with its Schema Registry: registry-framed "
                                "Avro values (16 fields, padded to --record-bytes) to a value.format=avro topic whose "
                                "table follows its registry subject; both MB/s, acknowledged and queryable, and "
                                "typed / raw")
    transactions = p.add_argument_group("transactions (--transactions)")
    transactions.add_argument("--transactions", action="store_true",
                              help="for each N of --brokers (default 1,3), `pipeline serve --brokers N --ack-on wal` "
                                   "on its own Spark Connect server and one confluent-kafka transactional producer: "
                                   f"--transactions-count transactions (default {TRANSACTIONS_DEFAULT_COUNT}), each "
                                   "one --record-bytes record (default 100) to each of --partitions partitions "
                                   "(default 3) then commit_transaction: transactions/s, commit p50/p99 side by side "
                                   "with the ratio to the first N, every record read back read_committed "
                                   "(pipeline.bench.transactions_bench; --smoke: "
                                   f"{TRANSACTIONS_SMOKE_COUNT} transactions)")
    transactions.add_argument("--transactions-count", type=int, default=None,
                              help="--transactions: measured transactions per N, after a few unmeasured ones "
                                   f"(default {TRANSACTIONS_DEFAULT_COUNT}; --smoke {TRANSACTIONS_SMOKE_COUNT})")
    freshness = p.add_argument_group("freshness (--freshness)")
    freshness.add_argument("--freshness", action="store_true",
                           help="one server at defaults (--ack-on wal, 10 s table commits), --producers (default 2) "
                                "confluent-kafka producers of --record-bytes (1 KiB) records at --rate records/s "
                                f"(default 1000) for --duration s (default {FRESHNESS_DEFAULT_DURATION:g}), and a probe record every 0.5 s: "
                                "acknowledgement-to-visible p50/p99/max through the live view pipeline.records_live "
                                "and through the table pipeline.records, files per partition-hour, every "
                                "acknowledged record checked through both (pipeline.bench.freshness_bench)")
    freshness.add_argument("--warmup", type=float, default=None,
                           help="--freshness: the first seconds of the load whose probes are not counted "
                                f"(default {FRESHNESS_DEFAULT_WARMUP:g}: the JVM compiling the query path)")
    hostile = p.add_argument_group("hostile clients (--hostile)")
    hostile.add_argument("--hostile", action="store_true",
                         help="good producers at a steady rate, alone and then beside every hostile client on "
                              "repeat; server RSS against the memory bound, acknowledged records lost, p99 "
                              "clean vs hostile (--duration = seconds of each phase, default "
                              f"{HOSTILE_DEFAULT_DURATION:g}: ~10 minutes in all)")
    hostile.add_argument("--rate", type=float, default=None,
                         help=f"--hostile: good producers' requests/s (default {HOSTILE_DEFAULT_RATE:g}); --table, "
                              "--consume, --security, --freshness: records/s")
    hostile.add_argument("--memory-attack-connections", type=int, default=40,
                         help="--hostile: connections per memory-attack round, each sending 40 MiB of a "
                              "declared 90 MiB frame and stalling (default 40)")
    hostile.add_argument("--burst-connections", type=int, default=10_000,
                         help="--hostile: connections of the first open-and-drop burst; later bursts are a "
                              "fifth of it (default 10000)")
    p.set_defaults(preset=None)


def resolve(args: argparse.Namespace) -> BenchOptions:
    """Preset values overridden by explicit options.

    Raises:
        ValueError: an option out of range (the message names it).
    """
    preset = args.preset or "quick"
    base = PRESETS[preset]

    def pick(name: str) -> Any:  # a preset's value: list[int], list[str], int or float by name
        value = getattr(args, name, None)
        return base[name] if value is None else value

    brokers = [] if getattr(args, "no_brokers", False) else pick("brokers")
    if preset == "quick" and getattr(args, "brokers", None) is None and (os.cpu_count() or 1) < QUICK_BROKERS_MIN_CORES:
        brokers = [n for n in brokers if n == 1]
    swept = any(getattr(args, n) is not None for n in ("connections", "in_flight", "acks"))
    shapes = list(QUICK_SHAPES) if preset == "quick" and not swept else None
    if getattr(args, "shapes", None) is not None:
        if swept:
            raise ValueError("--shapes replaces --connections, --in-flight and --acks")
        shapes = list(args.shapes)
    opts = BenchOptions(
        preset=preset, out=args.out, configs=pick("configs"), queues=pick("queues"),
        connections=pick("connections"), in_flight=pick("in_flight"), acks=pick("acks"), shapes=shapes,
        records=args.records_per_request or 10, record_bytes=args.record_bytes if args.record_bytes is not None else 64,
        partitions=args.partitions or 4, requests=pick("requests"), duration=pick("duration"),
        client=args.client, io_threads=args.io_threads, linger_ms=args.linger_ms, ack_on=args.ack_on or "spark",
        ceiling=args.ceiling, server_args=list(args.server_arg),
        brokers=brokers,
        producers=getattr(args, "producers", None) or 4, brokers_records=pick("brokers_records"),
        brokers_client=getattr(args, "brokers_client", "confluent"),
        headline_requests=pick("headline_requests"), headline_repeats=pick("headline_repeats"),
        acks0_pairs=pick("acks0_pairs"),
    )
    if any(c < 1 for c in opts.connections) or max(opts.connections) > 1000 or any(
            not 1 <= c <= 1000 for c, _, _ in opts.all_shapes()):
        raise ValueError("--connections must be 1..1000")
    if any(k < 1 or a not in (-1, 0, 1) for _, k, a in opts.all_shapes()):
        raise ValueError("a shape's K must be >= 1 and its acks -1, 0 or 1")
    if not 0 <= opts.acks0_pairs <= 20:
        raise ValueError("--acks0-pairs must be 0..20")
    if any(k < 1 for k in opts.in_flight) or any(q < 1 for q in opts.queues):
        raise ValueError("--in-flight and --queues must be >= 1")
    if any(a not in (-1, 0, 1) for a in opts.acks):
        raise ValueError("--acks values must be -1, 0 or 1")
    if opts.records < 1 or opts.record_bytes < 0 or opts.partitions < 1:
        raise ValueError("--records-per-request and --partitions must be >= 1, --record-bytes >= 0")
    if not 1 <= opts.requests <= 10_000_000 or not 0 < opts.duration <= 600:
        raise ValueError("--requests must be 1..10,000,000 and --duration in (0, 600] s")
    if not 0 <= opts.headline_requests <= 100_000 or not 1 <= opts.headline_repeats <= 50 or (
            opts.headline_requests and opts.headline_requests < opts.headline_repeats):
        raise ValueError("--headline-requests must be 0..100,000 and --headline-repeats 1..50 (at most "
                         "--headline-requests)")
    plan = opts.brokers_plan()
    if plan is not None:
        plan.check()
    return opts


FRESHNESS_DEFAULT_DURATION = 90.0
"""--freshness: seconds of load, the warm-up included."""
FRESHNESS_DEFAULT_WARMUP = 30.0
"""--freshness: the first seconds of the load whose probes are not counted (reported apart). They
are the first commits under load and the JVM compiling the query path: on the 2-core machine a
live query took up to 1.1-1.4 s in the first ~20 s of load, under 0.9 s after (three runs,
2026-11-29)."""
TRANSACTIONS_DEFAULT_COUNT = 300
"""--transactions: measured transactions per broker count."""
TRANSACTIONS_SMOKE_COUNT = 30
"""--transactions --smoke: measured transactions per broker count (the CI size)."""
HOSTILE_DEFAULT_DURATION = 270.0
"""--hostile: seconds of each phase (clean, hostile); with Spark start-up, shutdown and
verification the whole run takes about 10 minutes."""
HOSTILE_DEFAULT_RATE = 300.0
