"""The server without Spark: the front end's per-request cost alone (issue 13 diagnostics).

usage: ``python -m pipeline.bench.frontend_server DATA_DIR [--mode multiqueue] [--queues 4]``;
prints ``PORT <port>`` once listening, then serves until interrupted.

A real ``pipeline.server.Server`` (Processors, RequestChannel, handlers,
KafkaApis, the persister with its WAL group commit and fsync, the LogManager)
whose table side is ``NullSink``: ``to_table`` pickles the appends as the
real sink of the same tree does to hand them to its decode worker (that
cost is on the server's process), and ``write`` sleeps 50 ms per flush instead of a Spark
append. Nothing reaches a table, so the bench's verifier cannot run against
it: use it with ``python -m pipeline.bench.request_cost PORT PID`` to compare
CPU per request and requests/s of two code trees without the Spark JVM's CPU
and its 50-60 s start (``PYTHONPATH=TREE``). Serving tunes the garbage
collector as ``pipeline serve`` does.
"""

from __future__ import annotations

import argparse
import pickle
import time
from typing import TYPE_CHECKING, Collection, Sequence

import trio

from pipeline.log.batch import PartitionAppend
from pipeline.config import Mode, ServerConfig
from pipeline.server import Server

if TYPE_CHECKING:
    from pipeline.table.catalog import MaintenanceResult


class NullSink:
    """A GroupSink that stores nothing; see the module docstring."""

    WRITE_S = 0.05
    """Time one flush's ``write`` takes (s)."""

    def to_table(self, appends: Sequence[PartitionAppend]) -> int:
        # The decode worker hand-off's cost: what the real sink pickles in this tree.
        try:
            from pipeline.log.batch import to_columns
        except ImportError:  # a tree from before issue 13 pickled the appends themselves
            payload: object = list(appends)
        else:
            payload = to_columns(appends)
        pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        return len(appends)

    def write(self, table: int, exclude: set[tuple[str, int, int]] | None = None) -> None:
        time.sleep(self.WRITE_S)

    def present_offsets(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
        return set()

    def end_offsets(self, topics: Collection[str] | None = None) -> dict[tuple[str, int], int]:
        return {}

    def drop_topic(self, topic: str) -> int:
        return 0

    def maintain(self) -> MaintenanceResult:
        from pipeline.table.catalog import MaintenanceResult

        return MaintenanceResult()  # no table, nothing to compact


async def _serve(config: ServerConfig) -> None:
    server = Server(config, sink=NullSink())
    server.recover()
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(server.serve)
        try:
            from pipeline.process.lifecycle import tune_gc_for_serving
        except ImportError:  # a tree from before issue 13
            pass
        else:
            tune_gc_for_serving()
        print("PORT", port, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.frontend_server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("--mode", default="multiqueue", choices=[m.value for m in Mode])
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--ack-on", default="spark", choices=["spark", "wal"])
    args = parser.parse_args(argv)
    config = ServerConfig(data_dir=args.data_dir, mode=Mode(args.mode), queues=args.queues, num_partitions=4,
                          ack_on=args.ack_on, linger_ms=50, listen_port=0)
    try:
        trio.run(_serve, config)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
