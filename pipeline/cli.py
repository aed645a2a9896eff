"""The ``pipeline`` command: ``serve`` the front end, run ``sql`` over the table, or watch a server (``top``)."""

from __future__ import annotations

import argparse
import logging
import os
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
    t = p.add_argument_group("table (flags override --config)")
    t.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="TOML configuration file: table settings and per-topic [topic.\"NAME\"] tables "
                        "(see docs/table.md)")
    t.add_argument("--table-commit-interval-ms", type=positive_int, default=None,
                   help=f"with --ack-on wal: commit to the table this often, table.commit.interval.ms "
                        f"(default {d.table_commit_interval_ms}); with --ack-on spark --linger-ms applies")
    t.add_argument("--table-target-file-bytes", type=positive_int, default=None,
                   help=f"compaction merges small files up to this size, table.target.file.bytes "
                        f"(default {d.table.target_file_bytes})")
    t.add_argument("--table-compaction-interval-ms", type=int, default=None,
                   help=f"look for partitions to compact this often, table.compaction.interval.ms; 0: never "
                        f"(default {d.table_compaction_interval_ms})")
    t.add_argument("--table-compaction-min-files", type=int, default=None,
                   help=f"compact a partition once it has this many small files, table.compaction.min.files "
                        f"(default {d.table.compaction_min_files})")
    t.add_argument("--file-delete-delay-ms", type=int, default=None,
                   help=f"keep files a compaction or retention replaced this long for running queries, "
                        f"file.delete.delay.ms (default {d.table.file_delete_delay_ms})")
    t.add_argument("--metastore-uris", default=None, metavar="URIS",
                   help="external Hive metastore, hive.metastore.uris, e.g. thrift://127.0.0.1:9083 "
                        "(default: embedded, in DATA_DIR/_pipeline/metastore_db)")
    t.add_argument("--spark-connect-port", type=int, default=d.spark_connect_port,
                   help="serve Spark Connect on 127.0.0.1:PORT so other Spark sessions and `pipeline sql` "
                        "query the tables while the server runs; 0: off (default %(default)s)")
    t.add_argument("--thrift-port", type=int, default=d.thrift_port,
                   help="serve JDBC/ODBC (Spark Thrift Server, jdbc:hive2://127.0.0.1:PORT/) on 127.0.0.1; "
                        "0: off (default %(default)s)")


_PASSED_THROUGH = (
    "queues", "io_threads", "queued_max_requests", "queued_max_request_bytes",
    "max_in_flight_requests_per_connection", "network_threads", "socket_request_max_bytes",
    "max_connections", "max_connections_per_ip", "connections_max_idle_ms", "request_receive_timeout_ms",
    "response_buffer_max_bytes", "response_send_timeout_ms", "num_partitions", "batch_max_records",
    "batch_max_bytes", "linger_ms", "buffer_memory", "data_dir", "spark_master", "metrics_port",
    "spark_remote", "ack_on", "wal_segment_bytes", "wal_linger_ms", "spark_connect_port", "thrift_port",
)
"""ServerConfig fields that ``serve`` options set under the same name."""


_TABLE_FLAGS = {
    "table_commit_interval_ms": "table_commit_interval_ms",
    "table_compaction_interval_ms": "table_compaction_interval_ms",
    "metastore_uris": "metastore_uris",
}
"""Flags (default None: not given) over the config file, by ServerConfig field."""

_TABLE_CONFIG_FLAGS = {
    "table_target_file_bytes": "target_file_bytes",
    "table_compaction_min_files": "compaction_min_files",
    "file_delete_delay_ms": "file_delete_delay_ms",
}
"""Flags over the config file, by TableConfig field."""


def _config_from_args(args: argparse.Namespace):
    """The ServerConfig: defaults, then the ``--config`` file, then flags.

    Raises:
        pipeline.config.ConfigError: the file or a flag value is wrong.
    """
    from dataclasses import replace

    from pipeline.config import ConfigError, FileConfig, load_config
    from pipeline.server import Mode, ServerConfig

    file = load_config(args.config) if getattr(args, "config", None) else FileConfig()
    advertised = args.advertised_listener or (None, None)
    fields = {**file.server}
    for flag, name in _TABLE_FLAGS.items():
        if getattr(args, flag, None) is not None:
            fields[name] = getattr(args, flag)
    table = file.table
    table_fields = {name: getattr(args, flag) for flag, name in _TABLE_CONFIG_FLAGS.items()
                    if getattr(args, flag, None) is not None}
    if table_fields.get("compaction_min_files", 2) < 2:
        raise ConfigError("--table-compaction-min-files: expected an integer >= 2")
    if any(v < 0 for v in (table_fields.get("file_delete_delay_ms", 0), fields.get("table_compaction_interval_ms", 0))):
        raise ConfigError("--file-delete-delay-ms and --table-compaction-interval-ms must be >= 0")
    return ServerConfig(
        listen_host=args.listen[0],
        listen_port=args.listen[1],
        advertised_host=advertised[0],
        advertised_port=advertised[1],
        mode=Mode(args.mode),
        table=replace(table, **table_fields),
        **fields,
        **{name: getattr(args, name) for name in _PASSED_THROUGH},
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from pipeline.server import Server

    from pipeline.config import ConfigError

    try:
        config = _config_from_args(args)
    except ConfigError as exc:
        print(f"pipeline: configuration error: {exc}", file=sys.stderr)
        return 2
    lock = _lock_data_dir(config.data_dir)
    if lock is None:
        return 1
    endpoint = _metrics_endpoint(config)  # before Spark: /readyz answers 503 until serving
    # Until trio's signal receiver is open, a stop signal interrupts start-up
    # where it is (Spark can take a minute to start) and everything started
    # so far is stopped (pipeline/lifecycle.py).
    sink = _group_sink(config)
    signals = StartupSignals()
    signals.install()
    try:
        log.info("starting Spark (%s); data in %s", config.spark_remote or config.spark_master,
                 config.data_dir.resolve())
        sink.start()
        _write_endpoints(config)
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
        _endpoints_path(config.data_dir).unlink(missing_ok=True)
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


def _group_sink(config):
    from pipeline.persist.group_sink import SparkGroupSink

    return SparkGroupSink(config.data_dir, config.spark_master, config.spark_remote,
                          table_config=config.table, metastore_uris=config.metastore_uris,
                          connect_port=config.spark_connect_port or None if not config.spark_remote else None,
                          thrift_port=config.thrift_port or None if not config.spark_remote else None)


def _lock_data_dir(data_dir: Path):
    """Take ``DATA_DIR/_pipeline/lock`` (flock) for this process's lifetime; None (logged) if another holds it."""
    import fcntl

    state = Path(data_dir) / "_pipeline"
    state.mkdir(parents=True, exist_ok=True)
    f = open(state / "lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.error("%s is in use by another pipeline process (serve or compact); one process per data directory",
                  Path(data_dir).resolve())
        f.close()
        return None
    return f


def _endpoints_path(data_dir: Path) -> Path:
    return Path(data_dir) / "_pipeline" / "endpoints.json"


def _write_endpoints(config) -> None:
    """Tell ``pipeline sql`` (and users) where the running server serves SQL: ``DATA_DIR/_pipeline/endpoints.json``."""
    import json

    endpoints = {}
    if config.spark_connect_port and not config.spark_remote:
        endpoints["spark_connect"] = f"sc://127.0.0.1:{config.spark_connect_port}"
        log.info("tables queryable by name over Spark Connect at sc://127.0.0.1:%d (database %s)",
                 config.spark_connect_port, config.table.database)
    if config.thrift_port and not config.spark_remote:
        endpoints["jdbc"] = f"jdbc:hive2://127.0.0.1:{config.thrift_port}/{config.table.database}"
        log.info("JDBC (Spark Thrift Server) at %s", endpoints["jdbc"])
    _endpoints_path(config.data_dir).write_text(json.dumps(endpoints))


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


def table_session(data_dir: Path, spark_master: str = "local[*]", spark_remote: str | None = None,
                  metastore_uris: str | None = None, app_name: str = "pipeline-sql", locked: bool = False):
    """A Spark session that sees the pipeline's tables by name.

    ``spark_remote`` if given; else the running server's Spark Connect endpoint
    (``DATA_DIR/_pipeline/endpoints.json``) if it serves one; else a classic
    session on the data directory's metastore (the embedded one is free only
    while no server runs). ``locked``: the caller holds the data directory's lock.

    Raises:
        RuntimeError: a server runs on ``data_dir`` without a Spark Connect endpoint.
    """
    import json

    from pipeline.persist.spark_sink import build_spark_session
    from pipeline.table.catalog import catalog_conf

    if spark_remote is None and metastore_uris is None and not locked and _data_dir_in_use(data_dir):
        # (after a kill -9 the endpoints file outlives the server: only trust it while the server runs)
        try:
            spark_remote = json.loads(_endpoints_path(data_dir).read_text()).get("spark_connect")
        except (OSError, ValueError):
            spark_remote = None
        if spark_remote is None:
            raise RuntimeError(f"a pipeline server runs on {Path(data_dir).resolve()} without --spark-connect-port: "
                               "its embedded metastore is in use; query it over Spark Connect or JDBC")
    if spark_remote is not None:
        return build_spark_session(remote=spark_remote)
    return build_spark_session(spark_master, app_name=app_name, conf=catalog_conf(data_dir, metastore_uris))


def _data_dir_in_use(data_dir: Path) -> bool:
    lock = _lock_data_dir_quiet(data_dir)
    if lock is None:
        return True
    lock.close()
    return False


def _lock_data_dir_quiet(data_dir: Path):
    import fcntl

    path = Path(data_dir) / "_pipeline" / "lock"
    if not path.exists():
        return open(os.devnull)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def cmd_sql(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.persist.spark_sink import run_sql

    try:
        spark = table_session(args.data_dir, args.spark_master, args.spark_remote, args.metastore_uris)
    except RuntimeError as exc:
        print(f"pipeline sql: {exc}", file=sys.stderr)
        return 1
    try:
        columns, rows = run_sql(spark, args.query, args.database)
    finally:
        spark.stop()
    if args.format == "json":
        import json

        for row in rows[: args.max_rows]:
            print(json.dumps(dict(zip(columns, row)), default=_json_value))
        return 0
    table = Table(*columns, title=f"{len(rows)} row(s)")
    for row in rows[: args.max_rows]:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    Console().print(table)
    if len(rows) > args.max_rows:
        print(f"... {len(rows) - args.max_rows} more row(s) not shown (--max-rows)")
    return 0


def _json_value(value):
    import base64
    import datetime

    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return str(value)


def cmd_compact(args: argparse.Namespace) -> int:
    """Compact every partition that needs it and delete replaced files whose delay has passed (server stopped)."""
    from dataclasses import replace

    from pipeline.config import ConfigError, FileConfig, load_config
    from pipeline.table.catalog import TableCatalog

    try:
        file = load_config(args.config) if args.config else FileConfig()
    except ConfigError as exc:
        print(f"pipeline: configuration error: {exc}", file=sys.stderr)
        return 2
    lock = _lock_data_dir(args.data_dir)
    if lock is None:
        print("pipeline compact: a server runs on this data directory and compacts it in the background "
              "(--table-compaction-interval-ms); stop it to compact now", file=sys.stderr)
        return 1
    table = file.table
    if args.table_target_file_bytes:
        table = replace(table, target_file_bytes=args.table_target_file_bytes)
    if args.file_delete_delay_ms is not None:
        table = replace(table, file_delete_delay_ms=args.file_delete_delay_ms)
    spark = table_session(args.data_dir, args.spark_master, None, file.server.get("metastore_uris"),
                          app_name="pipeline-compact", locked=True)
    try:
        catalog = TableCatalog(spark, args.data_dir, table)
        catalog.ensure()
        result = catalog.compact()
    finally:
        spark.stop()
    print(f"compacted {result.compacted_partitions} partition(s): {result.files_before} files into "
          f"{result.files_after}; {result.dropped_partitions} dropped by retention; "
          f"{result.deleted_directories} replaced directories deleted, "
          f"{len(catalog.pending_deletions())} waiting for file.delete.delay.ms; {result.seconds:.1f} s")
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
    from pipeline.table.layout import DEFAULT_DATABASE

    sql = sub.add_parser("sql", help="run Spark SQL over the tables (the current database is `pipeline`)")
    sql.add_argument("query", help='e.g. "SELECT topic, count(*) FROM records GROUP BY topic"')
    sql.add_argument("--data-dir", type=Path, default=Path("data"))
    sql_spark = sql.add_mutually_exclusive_group()
    sql_spark.add_argument("--spark-master", default="local[*]")
    sql_spark.add_argument("--spark-remote", default=None, metavar="URL",
                           help="Spark Connect server (sc://...); default: the running server's, if any")
    sql.add_argument("--metastore-uris", default=None, help="external Hive metastore (hive.metastore.uris)")
    sql.add_argument("--database", default=DEFAULT_DATABASE, help="current database (default %(default)s)")
    sql.add_argument("--format", choices=["table", "json"], default="table",
                     help="table (default) or JSON lines (binary as base64)")
    sql.add_argument("--max-rows", type=positive_int, default=1000, help="rows to print (default 1000)")
    sql.set_defaults(func=cmd_sql)
    compact = sub.add_parser("compact", help="compact the table now (with the server stopped)")
    compact.add_argument("--data-dir", type=Path, default=Path("data"))
    compact.add_argument("--config", type=Path, default=None, metavar="FILE")
    compact.add_argument("--spark-master", default="local[*]")
    compact.add_argument("--table-target-file-bytes", type=positive_int, default=None)
    compact.add_argument("--file-delete-delay-ms", type=int, default=None)
    compact.set_defaults(func=cmd_compact)
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
