"""``pipeline bench``: runs the benchmark its options ask for (``pipeline.bench.options`` parses them).

The options module stays cheap to import (argparse and dataclasses); this one
imports the chosen benchmark, lazily.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.bench.options import HOSTILE_DEFAULT_DURATION, HOSTILE_DEFAULT_RATE, resolve

if TYPE_CHECKING:
    from pipeline.bench.hostile_runner import HostileOptions


BENCH_MODULES = {"matplotlib": "matplotlib", "confluent_kafka": "confluent-kafka"}
"""What only the benchmarks import, module name: distribution name. They are pyproject's ``bench``
extra, not dependencies of ``pipeline serve`` (tests/bench/test_bench_extra.py holds the two lists
equal)."""


def missing_bench_modules() -> list[str]:
    """The distributions of ``BENCH_MODULES`` that do not import here (``[]``: all do). Imports them,
    as the benchmark would (matplotlib ~0.1 s)."""
    missing = []
    for module, distribution in BENCH_MODULES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    return missing


def resolve_hostile(args: argparse.Namespace) -> HostileOptions:
    """The ``--hostile`` plan (``pipeline.bench.hostile_runner.HostileOptions``).

    Raises:
        ValueError: an option out of range (the message names it).
    """
    from pipeline.bench.hostile_runner import HostileOptions

    out = args.out if args.out != Path("bench-results") else Path("bench-results") / "hostile"
    opts = HostileOptions(
        out=out, duration=HOSTILE_DEFAULT_DURATION if args.duration is None else args.duration,
        rate=HOSTILE_DEFAULT_RATE if args.rate is None else args.rate,
        memory_attack_connections=args.memory_attack_connections, burst_connections=args.burst_connections,
        ack_on=args.ack_on or "wal", linger_ms=args.linger_ms,
        server_args=list(args.server_arg))
    if not 5 <= opts.duration <= 600:
        raise ValueError("--duration must be in [5, 600] s with --hostile")
    if not 1 <= opts.rate <= 5000:
        raise ValueError("--rate must be in [1, 5000] requests/s")
    if not 1 <= opts.memory_attack_connections <= 200 or not 1 <= opts.burst_connections <= 20_000:
        raise ValueError("--memory-attack-connections must be 1..200 and --burst-connections 1..20,000")
    return opts


def _bench_argv() -> list[str]:
    """This invocation's bench options, for the reproducing command a report prints: ``sys.argv``
    after ``pipeline bench`` or ``python -m pipeline.bench``."""
    import sys

    return sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` (parsed by ``add_bench_arguments``) ask for; the exit status.

    Raises:
        SystemExit: the ``bench`` extra is not installed (``missing_bench_modules``), or an option
            is out of range; the message says which.
    """
    missing = missing_bench_modules()
    if missing:
        raise SystemExit(f"pipeline bench: {', '.join(missing)} missing; the benchmarks need the bench extra: "
                         "pip install 'pipeline[bench]' (make installs it)")
    if getattr(args, "consume", False):
        from pipeline.bench.consume_bench import main as consume_main, resolve_consume

        try:
            consume_opts = resolve_consume(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return consume_main(consume_opts, _bench_argv())
    if getattr(args, "sustained", False):
        from pipeline.bench.options import resolve_sustained
        from pipeline.bench.sustained_bench import main as sustained_main

        try:
            sustained_opts = resolve_sustained(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return sustained_main(sustained_opts, _bench_argv())
    if getattr(args, "freshness", False):
        from pipeline.bench.freshness_bench import main as freshness_main, resolve_freshness

        try:
            freshness_opts = resolve_freshness(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return freshness_main(freshness_opts, _bench_argv())
    if getattr(args, "security", False):
        from pipeline.bench.security_bench import main as security_main, resolve_security

        try:
            security_opts = resolve_security(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return security_main(security_opts, _bench_argv())
    if getattr(args, "transactions", False):  # before --brokers alone: it takes --brokers as its N list
        from pipeline.bench.transactions_bench import main as transactions_main, resolve_transactions

        try:
            transactions_opts = resolve_transactions(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return transactions_main(transactions_opts, _bench_argv())
    if getattr(args, "brokers", None) and args.preset is None:
        from pipeline.bench.brokers_bench import main as brokers_main

        out = args.out if args.out != Path("bench-results") else Path("bench-results") / "brokers"
        argv = ["--brokers", ",".join(str(n) for n in args.brokers), "--out", str(out)]
        for flag, value in (("--producers", args.producers), ("--records", args.brokers_records),
                            ("--record-bytes", args.record_bytes), ("--partitions", args.partitions),
                            ("--client", args.brokers_client)):
            if value is not None:
                argv += [flag, str(value)]
        return brokers_main(argv + [f"--server-arg={a}" for a in args.server_arg])
    if getattr(args, "table", False):
        from pipeline.bench.table_bench import TableBenchOptions, main as table_main

        out = args.out if args.out != Path("bench-results") else Path("bench-results") / "table"
        d = TableBenchOptions()
        table_opts = TableBenchOptions(out=out, rate=args.rate or d.rate, duration=args.duration or d.duration,
                                       record_bytes=args.record_bytes or d.record_bytes, hours=args.hours,
                                       commit_interval_ms=(args.commit_interval_ms if args.commit_interval_ms is not None
                                                           else d.commit_interval_ms),
                                       repeats=args.repeats)
        if not (1 <= table_opts.hours <= 24 * 31 and table_opts.duration <= 3600 and table_opts.rate > 0):
            raise SystemExit("pipeline bench: --table needs 1 <= --hours <= 744, --duration <= 3600, --rate > 0")
        return table_main(table_opts, _bench_argv())
    if getattr(args, "hostile", False):
        from pipeline.bench.hostile_runner import main as hostile_main

        try:
            hostile_opts = resolve_hostile(args)
        except ValueError as exc:
            raise SystemExit(f"pipeline bench: {exc}") from None
        return hostile_main(hostile_opts)

    from pipeline.bench.runner import main

    try:
        opts = resolve(args)
    except ValueError as exc:
        raise SystemExit(f"pipeline bench: {exc}") from None
    return main(opts)
