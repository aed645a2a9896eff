"""The ``pipeline`` command: ``serve`` the front end, run ``sql`` over the table, or watch a server (``top``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from pipeline.lifecycle import STOP_SIGNALS, StartupInterrupted, StartupSignals, stop_children

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
    """The ``serve`` options (also reused by ``pipeline bench`` for the servers it starts).

    Every default comes from ``ServerConfig`` (defined once there).
    """
    from pipeline.server import ServerConfig

    d = ServerConfig()
    p.add_argument("--listen", type=host_port, default=(d.listen_host, d.listen_port), metavar="HOST:PORT",
                   help=f"address to listen on (default {d.listen_host}:{d.listen_port}; port 0 picks a free one)")
    p.add_argument("--advertised-listener", type=host_port, default=None, metavar="HOST:PORT",
                   help="address given to clients in Metadata (default: the listen address)")
    p.add_argument("--mode", choices=["multiqueue", "baseline", "shared-unmuted"], default=d.mode.value,
                   help="multiqueue: N queues routed by crc32(connection id) %% N, one handler each "
                        "(AutoMQ); baseline: classic Kafka shared queue + handler pool + mute "
                        "until response; shared-unmuted: benchmark ablation that breaks "
                        "per-connection ordering on purpose (default %(default)s)")
    p.add_argument("--queues", type=positive_int, default=d.queues,
                   help="multiqueue: number of request queues = RequestHandlers (default %(default)s)")
    p.add_argument("--io-threads", type=positive_int, default=d.io_threads,
                   help="baseline: handler pool size, Kafka num.io.threads (default %(default)s)")
    p.add_argument("--queued-max-requests", type=positive_int, default=d.queued_max_requests,
                   help="requests that may wait in the RequestChannel, Kafka queued.max.requests; "
                        "multiqueue splits it evenly over its queues (default %(default)s)")
    p.add_argument("--queued-max-request-bytes", type=positive_int, default=d.queued_max_request_bytes,
                   help="MemoryPool: bytes all received requests may hold until handled, Kafka "
                        "queued.max.request.bytes; a connection whose next request does not fit is "
                        "muted until memory returns (default %(default)s)")
    p.add_argument("--max-in-flight-requests-per-connection", type=positive_int,
                   default=d.max_in_flight_requests_per_connection,
                   help="multiqueue: requests of one connection read but not yet answered before its "
                        "reading pauses; baseline is always 1 (default %(default)s)")
    p.add_argument("--network-threads", type=positive_int, default=d.network_threads,
                   help="Processors, Kafka num.network.threads (default %(default)s)")
    p.add_argument("--socket-request-max-bytes", type=positive_int, default=d.socket_request_max_bytes,
                   help="largest request frame in bytes, Kafka socket.request.max.bytes (default %(default)s)")
    p.add_argument("--max-connections", type=positive_int, default=d.max_connections,
                   help="open connections in all, Kafka max.connections; more are closed at accept "
                        "(default %(default)s)")
    p.add_argument("--max-connections-per-ip", type=positive_int, default=d.max_connections_per_ip,
                   help="open connections of one client address, Kafka max.connections.per.ip "
                        "(default: --max-connections)")
    p.add_argument("--connections-max-idle-ms", type=positive_int, default=d.connections_max_idle_ms,
                   help="close connections idle this long, Kafka connections.max.idle.ms (default %(default)s)")
    p.add_argument("--request-receive-timeout-ms", type=positive_int, default=d.request_receive_timeout_ms,
                   help="close a connection whose request frame is not complete this long after its first "
                        "byte (time muted excluded) (default %(default)s)")
    p.add_argument("--response-buffer-max-bytes", type=positive_int, default=d.response_buffer_max_bytes,
                   help="stop reading a connection while this many bytes of its responses are unsent "
                        "(default %(default)s)")
    p.add_argument("--response-send-timeout-ms", type=positive_int, default=d.response_send_timeout_ms,
                   help="close a connection that takes none of its responses for this long "
                        "(default %(default)s)")
    p.add_argument("--num-partitions", type=positive_int, default=d.num_partitions,
                   help="partitions of an auto-created topic, Kafka num.partitions (default %(default)s)")
    p.add_argument("--batch-max-records", type=positive_int, default=d.batch_max_records,
                   help="flush once a group holds this many records (default %(default)s)")
    p.add_argument("--batch-max-bytes", type=positive_int, default=d.batch_max_bytes,
                   help="flush once a group holds this many bytes of record batches (default %(default)s)")
    p.add_argument("--linger-ms", type=float, default=d.linger_ms,
                   help="flush a group this many ms after its first record (default %(default)s)")
    p.add_argument("--buffer-memory", type=positive_int, default=d.buffer_memory,
                   help="bytes buffered for persistence above which handlers wait (default %(default)s)")
    p.add_argument("--data-dir", type=Path, default=d.data_dir,
                   help="where the table lives: DATA_DIR/records (default ./%(default)s)")
    spark = p.add_mutually_exclusive_group()
    spark.add_argument("--spark-master", default=d.spark_master,
                       help="Spark master URL, e.g. spark://127.0.0.1:7077 (default %(default)s, embedded)")
    spark.add_argument("--spark-remote", default=None, metavar="URL",
                       help="Spark Connect server, e.g. sc://127.0.0.1:15002 (instead of --spark-master)")
    p.add_argument("--ack-on", choices=["wal", "spark"], default=d.ack_on,
                   help="acknowledge a produce once its records are fsynced in the write-ahead log "
                        "(wal, default) or once the Spark write holding them has committed (spark)")
    p.add_argument("--wal-segment-bytes", type=positive_int, default=d.wal_segment_bytes,
                   help="roll WAL segment files at this size (default %(default)s)")
    p.add_argument("--wal-linger-ms", type=float, default=d.wal_linger_ms,
                   help="wait this long to gather more requests into one WAL fsync (default %(default)s: "
                        "group whatever arrived during the previous fsync)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (0: a free port)")


_PASSED_THROUGH = (
    "queues", "io_threads", "queued_max_requests", "queued_max_request_bytes",
    "max_in_flight_requests_per_connection", "network_threads", "socket_request_max_bytes",
    "max_connections", "max_connections_per_ip", "connections_max_idle_ms", "request_receive_timeout_ms",
    "response_buffer_max_bytes", "response_send_timeout_ms", "num_partitions", "batch_max_records",
    "batch_max_bytes", "linger_ms", "buffer_memory", "data_dir", "spark_master", "metrics_port",
    "spark_remote", "ack_on", "wal_segment_bytes", "wal_linger_ms",
)
"""ServerConfig fields that ``serve`` options set under the same name."""


def _config_from_args(args: argparse.Namespace):
    from pipeline.server import Mode, ServerConfig

    advertised = args.advertised_listener or (None, None)
    return ServerConfig(
        listen_host=args.listen[0],
        listen_port=args.listen[1],
        advertised_host=advertised[0],
        advertised_port=advertised[1],
        mode=Mode(args.mode),
        **{name: getattr(args, name) for name in _PASSED_THROUGH},
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.server import Server

    config = _config_from_args(args)
    endpoint = _metrics_endpoint(config)  # before Spark: /readyz answers 503 until serving
    # Until trio's signal receiver is open, a stop signal interrupts start-up
    # where it is (Spark can take a minute to start) and everything started
    # so far is stopped (pipeline/lifecycle.py).
    sink = SparkGroupSink(config.data_dir, config.spark_master, config.spark_remote)
    signals = StartupSignals()
    signals.install()
    try:
        log.info("starting Spark (%s); data in %s", config.spark_remote or config.spark_master,
                 config.data_dir.resolve() / "records")
        sink.start()
        server = Server(config, sink)
        _set_phase(endpoint, "RECOVERING", server)
        recovered = server.recover()
        log.info("recovered: %d partitions, %d producer batches, %d records replayed from the WAL",
                 len(recovered.checkpoint.end_offsets), len(recovered.checkpoint.producers),
                 recovered.replayed_records)
        _set_phase(endpoint, "STARTING_LISTENER")
        signals.defer()
    except StartupInterrupted as exc:
        _set_phase(endpoint, "STOPPING")
        log.warning("%s: stopping what was started", exc)
        _stop_bounded(sink)
        log.info("stopped before serving")
        return 0
    except BaseException:
        _set_phase(endpoint, "STOPPING")
        _stop_bounded(sink)
        raise

    async def main() -> None:
        with trio.open_signal_receiver(*STOP_SIGNALS) as received:
            if signals.pending is not None:  # came between recovery and this receiver
                log.warning("received %s during start-up: not serving", signal.Signals(signals.pending).name)
                return
            async with trio.open_nursery() as nursery:

                async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    await server.serve(task_status=task_status)
                    nursery.cancel_scope.cancel()  # served and drained: stop watching signals

                async def watch_signals() -> None:
                    async for signum in received:
                        name = signal.Signals(signum).name
                        if server.shutting_down:
                            log.warning("second %s: stopping at once", name)
                            nursery.cancel_scope.cancel()
                            return
                        log.info("%s received: shutting down", name)
                        server.shutdown()

                host, port = await nursery.start(run_server)
                _set_phase(endpoint, "SERVING")
                print(f"pipeline {config.mode.value}: listening on {host}:{port}", flush=True)
                nursery.start_soon(watch_signals)

    try:
        trio.run(main)
    finally:
        _set_phase(endpoint, "STOPPING")
        log.info("stopping Spark")
        _stop_bounded(sink)
        signals.restore()
        if endpoint is not None:
            endpoint.close()
    return 0


def _metrics_endpoint(config):
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on 127.0.0.1:``--metrics-port``; None if not asked for.

    Prints ``metrics on URL`` (``pipeline bench`` and tests read it) at once,
    before Spark starts, so a probe sees start-up.
    """
    if config.metrics_port is None:
        return None
    from pipeline.metrics import MetricsEndpoint

    endpoint = MetricsEndpoint()
    port = endpoint.start(config.metrics_port)
    log.info("metrics on http://127.0.0.1:%d/metrics, health on /healthz and /readyz", port)
    print(f"metrics on http://127.0.0.1:{port}/metrics", flush=True)
    return endpoint


def _set_phase(endpoint, phase: str, server=None) -> None:
    """Tell ``/readyz`` where start-up or shutdown is (a ``pipeline.metrics.Phase`` name);
    ``server``: export its metrics from now on."""
    if endpoint is None:
        return
    from pipeline.metrics import Phase

    if server is not None:
        endpoint.attach(server)
    endpoint.readiness.phase = Phase[phase]


STOP_TIMEOUT_S = 60.0
"""How long stopping Spark and the decode worker may take before the process exits anyway (s)."""


def _stop_bounded(sink, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """``sink.stop()``, given at most ``timeout_s`` (a Spark call cut short
    by a signal can leave py4j unable to answer), then every child process
    still running is terminated (``stop_children``)."""
    import threading

    stopper = threading.Thread(target=sink.stop, name="stop-spark", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    if stopper.is_alive():
        log.warning("Spark did not stop within %.0f s; exiting without it", timeout_s)
    for child in stop_children():
        # After an ordered stop this is Spark's gateway JVM (pyspark keeps it
        # until this process exits): expected, so not a warning.
        log.info("stopped child process: %s", child)


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


def cmd_top(args: argparse.Namespace) -> int:
    from pipeline.top import run

    return run(args.metrics_url, args.interval, once=args.once)


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
    top = sub.add_parser("top", help="live view of a running server, from its metrics endpoint")
    top.add_argument("--metrics-url", default="http://127.0.0.1:9464/metrics", metavar="URL",
                     help="the server's /metrics (serve --metrics-port; default %(default)s)")
    top.add_argument("--interval", type=float, default=2.0, metavar="S",
                     help="seconds between scrapes; rates and percentiles are over this window "
                          "(default %(default)s)")
    top.add_argument("--once", action="store_true",
                     help="scrape twice, --interval apart, print one screen and exit (1 if unreachable)")
    top.set_defaults(func=cmd_top)
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
