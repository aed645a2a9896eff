"""The ``pipeline`` command: ``serve`` the front end, or run ``sql`` over the table."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from pipeline.network.framing import DEFAULT_MAX_RECEIVE_BYTES

log = logging.getLogger("pipeline")


def host_port(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (argparse type)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` options (also reused by ``pipeline bench`` for the servers it starts)."""
    p.add_argument("--listen", type=host_port, default=("127.0.0.1", 9092), metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:9092; port 0 picks a free one)")
    p.add_argument("--advertised-listener", type=host_port, default=None, metavar="HOST:PORT",
                   help="address given to clients in Metadata (default: the listen address)")
    p.add_argument("--mode", choices=["multiqueue", "baseline", "shared-unmuted"], default="multiqueue",
                   help="multiqueue: N queues routed by crc32(connection id) %% N, one handler each "
                        "(AutoMQ); baseline: classic Kafka shared queue + handler pool + mute "
                        "until response; shared-unmuted: benchmark ablation that breaks "
                        "per-connection ordering on purpose (default multiqueue)")
    p.add_argument("--queues", type=positive_int, default=4,
                   help="multiqueue: number of request queues = RequestHandlers (default 4)")
    p.add_argument("--io-threads", type=positive_int, default=8,
                   help="baseline: handler pool size, Kafka num.io.threads (default 8)")
    p.add_argument("--queued-max-requests", type=positive_int, default=500,
                   help="requests that may wait in the RequestChannel, Kafka queued.max.requests; "
                        "multiqueue splits it evenly over its queues (default 500)")
    p.add_argument("--network-threads", type=positive_int, default=3,
                   help="Processors, Kafka num.network.threads (default 3)")
    p.add_argument("--socket-request-max-bytes", type=positive_int, default=DEFAULT_MAX_RECEIVE_BYTES,
                   help="largest request frame in bytes, Kafka socket.request.max.bytes (default 104857600)")
    p.add_argument("--num-partitions", type=positive_int, default=1,
                   help="partitions of an auto-created topic, Kafka num.partitions (default 1)")
    p.add_argument("--batch-max-records", type=positive_int, default=200_000,
                   help="flush once a group holds this many records (default 200000)")
    p.add_argument("--batch-max-bytes", type=positive_int, default=64 * 1024 * 1024,
                   help="flush once a group holds this many bytes of record batches (default 64 MiB)")
    p.add_argument("--linger-ms", type=float, default=50.0,
                   help="flush a group this many ms after its first record (default 50)")
    p.add_argument("--buffer-memory", type=positive_int, default=256 * 1024 * 1024,
                   help="bytes buffered for persistence above which handlers wait (default 256 MiB)")
    p.add_argument("--data-dir", type=Path, default=Path("data"),
                   help="where the table lives: DATA_DIR/records (default ./data)")
    spark = p.add_mutually_exclusive_group()
    spark.add_argument("--spark-master", default="local[*]",
                       help="Spark master URL, e.g. spark://127.0.0.1:7077 (default local[*], embedded)")
    spark.add_argument("--spark-remote", default=None, metavar="URL",
                       help="Spark Connect server, e.g. sc://127.0.0.1:15002 (instead of --spark-master)")
    p.add_argument("--ack-on", choices=["wal", "spark"], default="wal",
                   help="acknowledge a produce once its records are fsynced in the write-ahead log "
                        "(wal, default) or once the Spark write holding them has committed (spark)")
    p.add_argument("--wal-segment-bytes", type=positive_int, default=64 * 1024 * 1024,
                   help="roll WAL segment files at this size (default 64 MiB)")
    p.add_argument("--wal-linger-ms", type=float, default=0.0,
                   help="wait this long to gather more requests into one WAL fsync (default 0: "
                        "group whatever arrived during the previous fsync)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: a free port)")


def _config_from_args(args: argparse.Namespace):
    from pipeline.server import Mode, ServerConfig

    advertised = args.advertised_listener or (None, None)
    return ServerConfig(
        listen_host=args.listen[0],
        listen_port=args.listen[1],
        advertised_host=advertised[0],
        advertised_port=advertised[1],
        mode=Mode(args.mode),
        queues=args.queues,
        io_threads=args.io_threads,
        queued_max_requests=args.queued_max_requests,
        network_threads=args.network_threads,
        socket_request_max_bytes=args.socket_request_max_bytes,
        num_partitions=args.num_partitions,
        batch_max_records=args.batch_max_records,
        batch_max_bytes=args.batch_max_bytes,
        linger_ms=args.linger_ms,
        buffer_memory=args.buffer_memory,
        data_dir=args.data_dir,
        spark_master=args.spark_master,
        metrics_port=args.metrics_port,
        spark_remote=args.spark_remote,
        ack_on=args.ack_on,
        wal_segment_bytes=args.wal_segment_bytes,
        wal_linger_ms=args.wal_linger_ms,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.server import Server

    config = _config_from_args(args)
    log.info("starting Spark (%s); data in %s", config.spark_remote or config.spark_master,
             config.data_dir.resolve() / "records")
    sink = SparkGroupSink(config.data_dir, config.spark_master, config.spark_remote)
    sink.start()
    server = Server(config, sink)
    try:
        recovered = server.recover()
    except BaseException:
        sink.stop()
        raise
    log.info("recovered: %d partitions, %d producer batches, %d records replayed from the WAL",
             len(recovered.checkpoint.end_offsets), len(recovered.checkpoint.producers),
             recovered.replayed_records)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    await server.serve(task_status=task_status)
                    nursery.cancel_scope.cancel()  # served and drained: stop watching signals

                async def watch_signals() -> None:
                    async for signum in signals:
                        name = signal.Signals(signum).name
                        if server.shutting_down:
                            log.warning("second %s: stopping at once", name)
                            nursery.cancel_scope.cancel()
                            return
                        log.info("%s received: shutting down", name)
                        server.shutdown()

                host, port = await nursery.start(run_server)
                if server.metrics_port is not None:
                    print(f"metrics on http://127.0.0.1:{server.metrics_port}/metrics", flush=True)
                print(f"pipeline {config.mode.value}: listening on {host}:{port}", flush=True)
                nursery.start_soon(watch_signals)

    try:
        trio.run(main)
    finally:
        log.info("stopping Spark")
        sink.stop()
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.persist.spark_sink import build_spark_session, run_sql

    spark = build_spark_session(None if args.spark_remote else args.spark_master, app_name="pipeline-sql",
                                remote=args.spark_remote)
    try:
        columns, rows = run_sql(spark, args.data_dir, args.query)
    finally:
        spark.stop()
    table = Table(*columns, title=f"{len(rows)} row(s)")
    for row in rows[: args.max_rows]:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    Console().print(table)
    if len(rows) > args.max_rows:
        print(f"... {len(rows) - args.max_rows} more row(s) not shown (--max-rows)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING... (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the Kafka-compatible front end")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    sql = sub.add_parser("sql", help="run Spark SQL over the table (registered as `records`)")
    sql.add_argument("query", help='e.g. "SELECT topic, count(*) FROM records GROUP BY topic"')
    sql.add_argument("--data-dir", type=Path, default=Path("data"))
    sql_spark = sql.add_mutually_exclusive_group()
    sql_spark.add_argument("--spark-master", default="local[*]")
    sql_spark.add_argument("--spark-remote", default=None, metavar="URL", help="Spark Connect server (sc://...)")
    sql.add_argument("--max-rows", type=positive_int, default=1000, help="rows to print (default 1000)")
    sql.set_defaults(func=cmd_sql)
    from pipeline.bench.options import add_bench_arguments  # argparse only; the benchmark loads lazily

    add_bench_arguments(sub.add_parser("bench", help="benchmark serve modes (see docs/benchmarks.md)"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
