"""``python -m pipeline.bench [options]``: the same as ``pipeline bench [options]``."""

from __future__ import annotations

import argparse
import sys

from pipeline.bench.dispatch import run
from pipeline.bench.options import add_bench_arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline bench", description="Benchmark pipeline serve; see docs/benchmarks.md.")
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
