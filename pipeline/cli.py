"""The ``pipeline`` command: ``serve`` the front end, run ``sql`` over the table, or watch a server (``top``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection

from pipeline.process.datadir import endpoints_path, lock_data_dir, table_session, write_endpoints
from pipeline.process.lifecycle import (STOP_SIGNALS, StartupInterrupted, StartupSignals, launch_reaper,
                                        skip_unused_imports, stop_children, tune_gc_for_serving)

if TYPE_CHECKING:  # the commands import these lazily: `pipeline --help` and `top` stay light
    from pipeline.config import Resolved, ServerConfig
    from pipeline.metadata.locks import LeaseLock
    from pipeline.observe.metrics import MetricsEndpoint
    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.server import Server
    from pipeline.table.table_config import TableConfig

log = logging.getLogger("pipeline")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_key_arguments(p: argparse.ArgumentParser, names: Collection[str] | None = None,
                      flags: dict[str, str] | None = None) -> None:
    """One flag per configuration key of ``names`` (default: every key but the top-level
    ones), with its metavar and help from ``pipeline.config.KEYS``.

    Flags store the raw text (default None: not given); ``flag_values`` parses them,
    so a bad value is a ``ConfigError`` like a bad file or environment value.
    ``flags`` renames a key's flag (``{"table.database": "--database"}``).
    """
    from pipeline.config import KEYS, default_value

    groups: dict[str, argparse._ArgumentGroup] = {}
    for key in KEYS.values():
        if (names is None and key.top_level) or (names is not None and key.name not in names):
            continue
        flag = (flags or {}).get(key.name, key.flag)
        group = groups.get(key.group)
        if group is None:
            group = groups[key.group] = p.add_argument_group(key.group)
        default = default_value(key)
        shown = key.unset if default is None else key.show(default)
        group.add_argument(flag, dest=key.dest, default=None, metavar=key.metavar,
                           help=f"{key.help} [{key.name}, env {key.env}; default {shown}]".replace("%", "%%"))


def _add_log_arguments(p: argparse.ArgumentParser, default: str | None) -> None:
    """``--log-level`` and ``--log-format`` (keys ``log.level``, ``log.format``)."""
    from pipeline.config import KEYS, default_value

    for name in ("log.level", "log.format"):
        key = KEYS[name]
        p.add_argument(key.flag, dest=key.dest, default=default, metavar=key.metavar,
                       help=f"{key.help} [{key.name}, env {key.env}; default {default_value(key)}]")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` options (also ``config show``'s): ``--config FILE`` and one flag per key."""
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="TOML configuration file: keys as in `pipeline config show`, per-topic "
                        "[topic.\"NAME\"] tables (docs/table.md); PIPELINE_* environment variables "
                        "override it, flags override both")
    add_key_arguments(p)
    _add_log_arguments(p, argparse.SUPPRESS)


def flag_values(args: argparse.Namespace, flags: dict[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """key -> (parsed value, ``flag:--name``) for every key flag given in ``args``.

    Raises:
        pipeline.config.ConfigError: a flag's value is wrong (named with its key).
    """
    from pipeline.config import KEYS, parse_value

    out: dict[str, tuple[Any, str]] = {}
    for key in KEYS.values():
        raw = getattr(args, key.dest, None)
        if raw is not None:
            source = f"flag:{(flags or {}).get(key.name, key.flag)}"
            out[key.name] = (parse_value(key, raw, source, text=True), source)
    return out


def _resolve(args: argparse.Namespace, flags: dict[str, str] | None = None) -> Resolved:
    """``pipeline.config.resolve`` of ``--config`` (if the command has it), the environment and the flags."""
    from pipeline.config import resolve

    return resolve(getattr(args, "config", None), os.environ, flag_values(args, flags))


def _check_listeners(config: ServerConfig) -> None:
    """Build every listener's TLS context once before anything starts (bad ssl.* files exit 2).

    Raises:
        pipeline.config.ConfigError: a TLS listener's keystore or truststore cannot be loaded, or a
            listener has no security protocol.
    """
    from pipeline.config import ConfigError
    from pipeline.server import build_listeners

    try:
        build_listeners(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _warm_up_protocol() -> None:
    """``pipeline.protocol.apis.warm_up``, logged; a failure only leaves the work to first use."""
    from pipeline.protocol.apis import warm_up

    started = time.monotonic()
    try:
        warm_up()
    except Exception:
        log.exception("protocol warm-up failed; request schemas load on first use")
    else:
        log.debug("protocol schemas built in %.2f s", time.monotonic() - started)


def cmd_serve(args: argparse.Namespace) -> int:
    import trio

    from pipeline.observe.structured_logs import children_stderr_to_log, setup_logging
    from pipeline.server import Server, can_recover_without_table, state_dir
    from pipeline.table.catalog import TableConfigError

    resolved = _resolve(args)  # a ConfigError exits 2 in main(), before anything starts
    setup_logging(resolved.log)  # the file or the environment may set log.*
    config = resolved.server
    _check_listeners(config)
    log.info("configuration: %s", _sources_summary(resolved.sources))
    if config.brokers > 1:
        return _supervise(args, config, prefix_log=resolved.log.format == "plain")
    config = _check_ports(config)  # every port free before anything starts; a free Spark Connect port if unset
    lock = lock_data_dir(config.data_dir, state_dir(config))  # a broker of a cluster: its own state dir
    if lock is None:
        return 1
    if config.cluster_brokers is None:  # a kill -9 left it: it names the last run's ports until Spark is up
        endpoints_path(config.data_dir).unlink(missing_ok=True)
    endpoint = _metrics_endpoint(config)  # before Spark: /readyz answers 503 until serving
    # With acknowledgements at the WAL the server listens before Spark is up: recovery of the
    # WAL and the checkpoint needs no JVM, and the table side catches up once Spark is ready.
    # With --ack-on spark (or a table but no checkpoint to start from), Spark comes first.
    early = config.ack_on == "wal" and can_recover_without_table(config)
    sink = _group_sink(config)
    exit_code = 0
    # Until trio's signal receiver is open, a stop signal interrupts start-up
    # where it is (Spark can take a minute to start) and everything started
    # so far is stopped (pipeline/process/lifecycle.py).
    signals = StartupSignals()
    signals.install()
    try:
        # Imports beside Spark's start, not on the first requests. Not a daemon: the interpreter joins it
        # before it finalizes (a stop during start-up returns while it may still import), since a daemon
        # thread that wants the GIL once finalization began is ended with pthread_exit, which aborts
        # the process when an extension's C++ frame is on its stack (CI: a SIGTERM 0.9 s into the
        # start ended with "FATAL: exception not rethrown", status -6; CPython gh-87135).
        warm = threading.Thread(target=_warm_up_protocol, name="protocol-warm-up")
        warm.start()
        if early:
            with children_stderr_to_log():
                sink.start_decoder()  # from this (the main) thread: it dies with the process
            server = Server(config, sink, table_ready=False)
        else:
            _start_spark(sink, config)
            warm.join()
            server = Server(config, sink)
        _set_phase(endpoint, "RECOVERING", server)
        started = time.monotonic()
        recovered = server.recover_log() if early else server.recover()
        took = time.monotonic() - started
        # The phase first: a /readyz answered after this line is logged no longer says "recovering".
        _set_phase(endpoint, "STARTING_LISTENER")
        log.info("recovery done in %.2f s (recovered: %d partitions, %d producer batches, %d records "
                 "%s)", took, len(recovered.checkpoint.end_offsets), len(recovered.checkpoint.producers),
                 recovered.backlog_records if early else recovered.replayed_records,
                 "in the WAL after the checkpoint, for the table once Spark is up" if early
                 else "replayed from the WAL", extra={"stage": "recovery", "seconds": round(took, 3)})
        signals.defer()
    except StartupInterrupted as exc:
        _set_phase(endpoint, "STOPPING")
        log.warning("%s: stopping what was started", exc)
        _stop_bounded(sink)
        log.info("stopped before serving")
        return 0
    except TableConfigError as exc:
        _set_phase(endpoint, "STOPPING")
        log.error("configuration error: %s", exc)
        _stop_bounded(sink)
        return 2
    except BaseException:
        _set_phase(endpoint, "STOPPING")
        _stop_bounded(sink)
        raise

    async def start_table_side() -> None:
        """Start Spark beside the running server; a failure stops the server (status 2 for a
        table configuration error, 1 otherwise)."""
        nonlocal exit_code
        try:
            await trio.to_thread.run_sync(_start_spark, sink, config, abandon_on_cancel=True)
        except TableConfigError as exc:
            log.error("configuration error: %s", exc)
            exit_code = 2
            server.table_failed()
            server.shutdown()
            return
        except Exception as exc:  # Spark raises many types: all mean the table side cannot run
            log.error("Spark did not start, stopping (the WAL keeps every acknowledged record): %s",
                      str(exc).splitlines()[0] if str(exc) else repr(exc))
            exit_code = 1
            server.table_failed()
            server.shutdown()
            return
        server.table_started()
        _set_table_ready(endpoint)
        persister = server.persister
        backlog = persister.backlog_records if persister is not None else 0
        log.info("table side ready: Spark writes the table%s", f" ({backlog} WAL records to write first)"
                 if backlog else "", extra={"stage": "table", "seconds": round(_since_process_start(), 3)})
        print(f"pipeline {config.mode.value}: table side ready", flush=True)

    async def main() -> None:
        nonlocal exit_code
        with trio.open_signal_receiver(*STOP_SIGNALS) as received:
            if signals.pending is not None:  # came between recovery and this receiver
                log.warning("received %s during start-up: not serving", signal.Signals(signals.pending).name)
                return
            async with trio.open_nursery() as nursery:

                async def run_server(task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
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

                try:
                    host, port = await nursery.start(run_server)
                except OSError as exc:  # a listener's address was taken after _check_ports
                    log.error("configuration error: a listener cannot bind: %s", exc)
                    exit_code = 2
                    nursery.cancel_scope.cancel()
                    return
                tune_gc_for_serving()
                _set_phase(endpoint, "SERVING")
                if early:
                    _set_table_ready(endpoint, False)
                ready = _since_process_start()
                log.info("listening on %s:%d (ready in %.1f s%s)", host, port, ready,
                         "; produce acknowledged at the WAL, Spark starting" if early else "",
                         extra={"stage": "listener", "seconds": round(ready, 3)})
                print(f"pipeline {config.mode.value}: listening on {host}:{port}", flush=True)
                for name, protocol, other_host, other_port in server.listener_addresses[1:]:
                    log.info("listening on %s:%d (%s, %s)", other_host, other_port, name, protocol)
                    print(f"pipeline {config.mode.value}: listening on {other_host}:{other_port} ({name})",
                          flush=True)
                if server.registry_url is not None:
                    print(f"pipeline {config.mode.value}: schema registry on {server.registry_url}", flush=True)
                nursery.start_soon(watch_signals)
                if early:
                    nursery.start_soon(start_table_side)
                else:
                    print(f"pipeline {config.mode.value}: table side ready", flush=True)

    try:
        trio.run(main)
    finally:
        _set_phase(endpoint, "STOPPING")
        if config.cluster_brokers is None:
            endpoints_path(config.data_dir).unlink(missing_ok=True)
        log.info("stopping Spark")
        _stop_bounded(sink)
        signals.restore()
        if endpoint is not None:
            endpoint.close()
    return exit_code


def _start_spark(sink: SparkGroupSink, config: ServerConfig) -> None:
    """Start the sink (Spark, the tables, the decode worker; blocking), log where it is, and
    publish the endpoints ``pipeline sql`` uses (``DATA_DIR/_pipeline/endpoints.json``).

    Raises:
        pipeline.table.catalog.TableConfigError: the tables do not match the configuration.
        Whatever Spark raises when it cannot start.
    """
    from pipeline.observe.structured_logs import children_stderr_to_log

    log.info("starting Spark (%s); data in %s", config.spark_remote or config.spark_master,
             config.data_dir.resolve())
    started = time.monotonic()
    with children_stderr_to_log():  # the JVM's and the decode worker's stderr into this log
        if config.spark_remote is None:
            with launch_reaper():  # the JVM reads nothing of ours until its gateway is up
                sink.start()
        else:
            sink.start()
    took = time.monotonic() - started
    log.info("Spark ready in %.1f s: %s", took, _spark_whereabouts(sink, config),
             extra={"stage": "spark", "seconds": round(took, 3)})
    if config.cluster_brokers is None:  # a cluster's supervisor writes it
        write_endpoints(config)


def _check_ports(config: ServerConfig) -> ServerConfig:
    """Every port the server opens is free, checked before any JVM starts: the listeners, the
    metrics endpoint, Spark Connect and the Thrift server (ports 0 pick a free one and are not
    checked). ``spark.connect.grpc.binding.port`` unset takes a free port now (published in
    ``DATA_DIR/_pipeline/endpoints.json`` once Spark is up).

    Returns:
        ``config``, with the Spark Connect port chosen.

    Raises:
        pipeline.config.ConfigError: a port is in use, naming its key (exit 2).
    """
    import dataclasses

    from pipeline.config import ConfigError
    from pipeline.server import listener_endpoints

    probes: list[tuple[str, str, int]] = [
        (f"listeners ({e.name})", e.host, e.port) for e in listener_endpoints(config) if e.port]
    if config.metrics_port:
        probes.append(("pipeline.metrics.port", "127.0.0.1", config.metrics_port))
    if not config.spark_remote:
        if config.spark_connect_port:
            probes.append(("spark.connect.grpc.binding.port", "127.0.0.1", config.spark_connect_port))
        if config.thrift_port:
            probes.append(("hive.server2.thrift.port", "127.0.0.1", config.thrift_port))
    for key, host, port in probes:
        problem = _port_taken(host, port)
        if problem:
            raise ConfigError(f"{key}: {host or '0.0.0.0'}:{port} cannot be bound ({problem}); another server "
                              "may be running: choose another port")
    if config.spark_connect_port is None and not config.spark_remote:
        from pipeline.network.listeners import free_listen_port

        config = dataclasses.replace(config, spark_connect_port=free_listen_port("127.0.0.1"))
    return config


def _port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound for listening now (None: it can). SO_REUSEADDR as
    servers set it, so a port left in TIME_WAIT by a stopped server counts as free."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return str(exc)
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                probe.listen(1)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def _supervise(args: argparse.Namespace, config: ServerConfig, prefix_log: bool = True) -> int:
    """``serve --brokers N``: run N brokers under a supervisor (``pipeline.process.supervisor``)."""
    from pipeline.process.supervisor import Supervisor

    lock = lock_data_dir(config.data_dir)
    if lock is None:
        return 1
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    at = argv.index("serve") if "serve" in argv else len(argv)
    return Supervisor(config, argv[:at], argv[at + 1:], prefix_log=prefix_log).run()


def _metrics_endpoint(config: ServerConfig) -> MetricsEndpoint | None:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on 127.0.0.1:``--metrics-port``; None if not asked for.

    Prints ``metrics on URL`` (``pipeline bench`` and tests read it) at once,
    before Spark starts, so a probe sees start-up.
    """
    if config.metrics_port is None:
        return None
    from pipeline.observe.metrics import MetricsEndpoint

    started = time.monotonic()
    endpoint = MetricsEndpoint()
    port = endpoint.start(config.metrics_port)
    took = time.monotonic() - started
    log.info("metrics endpoint ready in %.2f s: http://127.0.0.1:%d/metrics, health on /healthz and /readyz",
             took, port, extra={"stage": "metrics", "seconds": round(took, 3)})
    print(f"metrics on http://127.0.0.1:{port}/metrics", flush=True)
    return endpoint


def _sources_summary(sources: dict[str, str]) -> str:
    """``"defaults; file:x.toml sets 3 keys; env:PIPELINE_A, flag:--b"`` for the start-up log."""
    from pipeline.config import DEFAULT_SOURCE

    files: dict[str, int] = {}
    named = []
    for source in sources.values():
        if source.startswith("file:"):
            files[source] = files.get(source, 0) + 1
        elif source != DEFAULT_SOURCE:
            named.append(source)
    parts = ["defaults"] + [f"{f} sets {n} key(s)" for f, n in files.items()]
    if named:
        parts.append(", ".join(named))
    return "; ".join(parts) + " (`pipeline config show` with the same arguments lists every key)"


def _since_process_start() -> float:
    """Seconds since this process started (its start time as the kernel has it)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


def _spark_whereabouts(sink: SparkGroupSink, config: ServerConfig) -> str:
    """Where Spark's UI and logs are, in one phrase (for the "Spark ready" line)."""
    from pipeline.persist.spark_sink import LOG4J2_PROPERTIES

    if config.spark_remote:
        return (f"Spark Connect at {config.spark_remote}: the UI and the logs are the Connect server's, "
                "its driver writes the table")
    sc = sink.catalog.spark.sparkContext
    ui = sc.uiWebUrl
    where = f"application {sc.applicationId} on {sc.master}; " + (
        f"UI at {ui}" if ui else "UI off (spark.ui.enabled=false)")
    where += f"; driver log: WARN and up, in this log as loggers spark.* (log4j2: {LOG4J2_PROPERTIES})"
    if (sc.master or "").startswith("spark://"):
        where += "; executor logs in each worker's work directory, app-ID/N/stderr"
    return where


def _set_table_ready(endpoint: MetricsEndpoint | None, ready: bool = True) -> None:
    """Tell ``/readyz`` whether the table side (Spark) is up."""
    if endpoint is not None:
        endpoint.set_table_ready(ready)


def _set_phase(endpoint: MetricsEndpoint | None, phase: str, server: Server | None = None) -> None:
    """Tell ``/readyz`` where start-up or shutdown is (a ``pipeline.observe.metrics.Phase`` name);
    ``server``: export its metrics from now on."""
    if endpoint is None:
        return
    from pipeline.observe.metrics import Phase

    if server is not None:
        endpoint.attach(server)
    endpoint.set_phase(Phase[phase])


DECODE_NICENESS_WITH_WAL_ACKS = 10
"""Nice value added to the decode worker when produce is acknowledged at the WAL: the table
side then yields the CPU to the front end (issue 13); with ``--ack-on spark`` decoding is on
every acknowledgement's path and keeps the server's priority."""


TABLE_LOCK_NAME = "table"
"""The ``LeaseLock`` every table change of a broker with leadership through the database holds."""

LIVE_LOCK_NAME = "live"
"""The ``LeaseLock`` a broker with leadership through the database holds while it publishes the
live view's boundary (``SparkGroupSink.publish_live``)."""


def _table_lock(config: ServerConfig, name: str = TABLE_LOCK_NAME) -> LeaseLock | None:
    """With leadership through the database (brokers maybe on several hosts): the tables' lock
    (``name``: or the live view's, ``LIVE_LOCK_NAME``) in the metadata database, leased for
    ``broker.session.timeout.ms`` and renewed every ``broker.heartbeat.interval.ms``; else None (a
    supervisor's brokers share one host's ``flock``)."""
    if config.cluster_leadership != "database":
        return None
    import uuid

    from pipeline.metadata.database import store_target
    from pipeline.metadata.locks import LeaseLock
    from pipeline.server import CLUSTER_STORE_FILE

    return LeaseLock(store_target(config.metadata_url, config.data_dir, CLUSTER_STORE_FILE), name,
                     f"broker-{config.node_id}/{uuid.uuid4()}", lease_ms=config.broker_session_timeout_ms,
                     renew_ms=config.broker_heartbeat_interval_ms)


def _table_config(config: ServerConfig) -> TableConfig:
    """``config.table``, its writer schemas looked up in pipeline's own registry's store when it serves
    one and no external ``schema.registry.url`` is set."""
    if config.table.schema_registry is not None or config.schema_registry_listener is None:
        return config.table
    import dataclasses

    from pipeline.metadata.database import store_target
    from pipeline.registry.store import REGISTRY_FILE

    return dataclasses.replace(config.table, schema_registry=str(store_target(config.metadata_url, config.data_dir,
                                                                  REGISTRY_FILE)))


def _group_sink(config: ServerConfig) -> SparkGroupSink:
    from pipeline.metadata.database import store_target
    from pipeline.metadata.topics import FILE as TOPICS_FILE
    from pipeline.persist.group_sink import SparkGroupSink
    from pipeline.server import state_dir

    lock, live_lock = _table_lock(config), _table_lock(config, LIVE_LOCK_NAME)
    return SparkGroupSink(config.data_dir, config.spark_master, config.spark_remote,
                          # A broker of a cluster shares the tables: a supervisor's (cluster_brokers set), or
                          # one started alone with leadership through the database (another host's broker,
                          # or one per network namespace in tests/e2e/test_failover.py, on one shared volume).
                          state_dir=state_dir(config),
                          shared_table=config.cluster_brokers is not None or config.cluster_leadership == "database",
                          table_config=_table_config(config), metastore_uris=config.metastore_uris,
                          connect_port=config.spark_connect_port or None if not config.spark_remote else None,
                          thrift_port=config.thrift_port or None if not config.spark_remote else None,
                          decode_niceness=DECODE_NICENESS_WITH_WAL_ACKS if config.ack_on == "wal" else 0,
                          lock=lock.hold if lock is not None else None,
                          live_lock=live_lock.hold if live_lock is not None else None,
                          # value.format / value.schema / value.wire.format set as topic configs
                          topic_store=store_target(config.metadata_url, config.data_dir, TOPICS_FILE))


STOP_TIMEOUT_S = 60.0
"""How long stopping Spark and the decode worker may take before the process exits anyway (s)."""


def _stop_bounded(sink: SparkGroupSink, timeout_s: float = STOP_TIMEOUT_S) -> None:
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

    from pipeline.observe.structured_logs import children_stderr_to_log
    from pipeline.persist.spark_sink import run_sql

    from pyspark.errors import PySparkException

    config = _resolve(args, SQL_FLAGS).server
    database = config.table.database
    if config.spark_remote is None and config.metastore_uris is None \
            and not (Path(config.data_dir) / "_pipeline").is_dir():
        # No server ever ran here: say so at once, rather than start Spark and create an empty metastore.
        print(f"pipeline sql: no pipeline data in {Path(config.data_dir).resolve()} (no server has written "
              "there; give the server's --data-dir or --config)", file=sys.stderr)
        return 1
    try:
        with children_stderr_to_log():
            spark = table_session(config.data_dir, config.spark_master, config.spark_remote, config.metastore_uris)
    except (RuntimeError, PySparkException) as exc:
        print(f"pipeline sql: {exc}", file=sys.stderr)
        return 1
    try:
        columns, rows = run_sql(spark, args.query, database, live=not args.committed)
    except PySparkException as exc:  # a bad query, a missing table or database: Spark's own message
        if exc.getCondition() == "SCHEMA_NOT_FOUND" and f"`{database}`" in str(exc):
            print(f"pipeline sql: no database `{database}` yet (nothing has been written to the tables)",
                  file=sys.stderr)
        else:
            print(f"pipeline sql: {str(exc).strip()}", file=sys.stderr)
        return 1
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
    from pipeline.observe.structured_logs import children_stderr_to_log
    from pipeline.table.catalog import TableCatalog

    config = _resolve(args).server
    lock = lock_data_dir(config.data_dir)
    if lock is None:
        print("pipeline compact: a server runs on this data directory and compacts it in the background "
              "(--table-compaction-interval-ms); stop it to compact now", file=sys.stderr)
        return 1
    with children_stderr_to_log():
        spark = table_session(config.data_dir, config.spark_master, None, config.metastore_uris,
                              app_name="pipeline-compact", locked=True)
    try:
        catalog = TableCatalog(spark, config.data_dir, config.table)
        catalog.ensure()
        result = catalog.compact()
    finally:
        spark.stop()
    print(f"compacted {result.compacted_partitions} partition(s): {result.files_before} files into "
          f"{result.files_after}; {result.dropped_partitions} dropped by retention; "
          f"{result.deleted_directories} replaced directories deleted, "
          f"{len(catalog.pending_deletions())} waiting for file.delete.delay.ms; {result.seconds:.1f} s")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    """Print the effective configuration: every key, its value and where it came from."""
    import json

    resolved = _resolve(args)

    rows = resolved.rows()
    if args.format == "json":
        print(json.dumps({r["key"]: {"value": r["value"], "source": r["source"]} for r in rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from pipeline.config import DEFAULT_SOURCE, KEYS

    table = Table(title="pipeline configuration (defaults < file < env < flags)")
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")  # long values wrap; nothing is cut off with "…"
    table.add_column("source", overflow="fold")
    for r in rows:
        key = KEYS.get(r["key"])
        value = r["value"]
        if value is None:
            shown = f"({key.unset})" if key is not None and key.unset else "none"
        else:
            shown = json.dumps(value) if isinstance(value, bool) else str(value)
        style = None if r["source"] == DEFAULT_SOURCE else "bold"
        table.add_row(r["key"], shown, r["source"], style=style)
    Console(width=max(120, Console().width)).print(table)
    return 0


def cmd_config_docs(args: argparse.Namespace) -> int:
    """Print docs/configuration.md (``pipeline.config.reference_markdown``)."""
    from pipeline.config import reference_markdown

    sys.stdout.write(reference_markdown())
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from pipeline.observe.top import run

    return run(args.metrics_url, args.interval, once=args.once)


SQL_FLAGS = {"table.database": "--database"}
"""``pipeline sql`` names the key ``table.database`` ``--database``."""
SQL_KEYS = ("pipeline.data.dir", "spark.master", "spark.remote", "hive.metastore.uris", "table.database")
def cmd_users(args: argparse.Namespace) -> int:
    """``pipeline users add|remove|list``: SCRAM credentials in DATA_DIR/_pipeline/users.db
    (pipeline.security.users); a running server sees changes at its next authentication."""
    import getpass

    from pipeline.security.users import CredentialError, UserStore

    config = _resolve(args).server
    store = UserStore.for_data_dir(config.data_dir, config.metadata_url)
    if args.users_command == "list":
        for user, mechanisms in store.users().items():
            print(user, " ".join(f"{m}(iterations={i})" for m, i in mechanisms.items()))
        return 0
    if args.users_command == "remove":
        removed = store.remove(args.user, args.mechanism)
        print(f"removed {removed} credential(s) of {args.user}")
        return 0 if removed else 1
    # add: the password never comes from a flag (shell history, ps); stdin only when asked.
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
        if password != getpass.getpass("again: "):
            print("pipeline users: passwords differ", file=sys.stderr)
            return 2
    try:
        store.add(args.user, password, tuple(args.mechanism or ("SCRAM-SHA-256", "SCRAM-SHA-512")), args.iterations)
    except CredentialError as exc:
        print(f"pipeline users: {exc}", file=sys.stderr)
        return 2
    print(f"added {args.user}")
    return 0


COMPACT_KEYS = ("pipeline.data.dir", "spark.master", "hive.metastore.uris", "table.database",
                "table.target.file.bytes", "table.compaction.min.files", "file.delete.delay.ms")


def cmd_bench(args: argparse.Namespace) -> int:
    """``pipeline bench``: the benchmark the options ask for (``pipeline.bench.dispatch``)."""
    from pipeline.bench.dispatch import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__)
    _add_log_arguments(parser, None)
    sub = parser.add_subparsers(dest="command", required=True)
    # No abbreviated flags: --network-thread must be an unknown option, not --network-threads.
    serve = sub.add_parser("serve", help="run the Kafka-compatible front end", allow_abbrev=False,
                           description="Every option is also a key of the --config file and a PIPELINE_* "
                                       "environment variable: defaults < file < environment < flags.")
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    config = sub.add_parser("config", help="the configuration (`pipeline config show`)")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", allow_abbrev=False, help="print the effective configuration of `pipeline serve` with these "
                                              "arguments: every key, its value and its source")
    add_serve_arguments(show)
    show.add_argument("--format", choices=["table", "json"], default="table",
                      help="a table (default) or JSON: {key: {value, source}}")
    show.set_defaults(func=cmd_config_show)
    docs = config_sub.add_parser("docs", help="print docs/configuration.md, the reference of every key "
                                              "(generated from pipeline.config.KEYS and its defaults)")
    docs.set_defaults(func=cmd_config_docs)

    sql = sub.add_parser("sql", help="run Spark SQL over the tables (the current database is `pipeline`)",
                         description="Without --spark-remote, the running server's Spark Connect endpoint "
                                     "if it serves one, else a session of its own on the data directory.")
    sql.add_argument("query", help='e.g. "SELECT topic, count(*) FROM records GROUP BY topic"')
    sql.add_argument("--config", type=Path, default=None, metavar="FILE",
                     help="the server's TOML configuration file (its data dir, Spark and metastore keys)")
    add_key_arguments(sql, SQL_KEYS, SQL_FLAGS)
    sql.add_argument("--format", choices=["table", "json"], default="table",
                     help="table (default) or JSON lines (binary as base64)")
    sql.add_argument("--max-rows", type=positive_int, default=1000, help="rows to print (default 1000)")
    sql.add_argument("--committed", action="store_true",
                     help="each table is the committed table alone; by default a table with a live view is "
                          "that view (records_live, <typed table>_live, dead_letters_live: the table plus the "
                          "records acknowledged and not committed yet, each once)")
    sql.set_defaults(func=cmd_sql)
    compact = sub.add_parser("compact", help="compact the table now (with the server stopped)")
    compact.add_argument("--config", type=Path, default=None, metavar="FILE",
                         help="the server's TOML configuration file (per-topic retention, table keys)")
    add_key_arguments(compact, COMPACT_KEYS)
    compact.set_defaults(func=cmd_compact)
    users = sub.add_parser("users", help="SASL users: SCRAM credentials in DATA_DIR/_pipeline/users.db")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    for name, help_text in (("add", "add a user or change its password (prompted, or --password-stdin)"),
                            ("remove", "remove a user's credentials"), ("list", "list users and mechanisms")):
        command = users_sub.add_parser(name, help=help_text)
        command.add_argument("--config", type=Path, default=None, metavar="FILE",
                             help="the server's TOML configuration file (for pipeline.data.dir, "
                                  "pipeline.metadata.url)")
        add_key_arguments(command, ("pipeline.data.dir", "pipeline.metadata.url"))
        if name != "list":
            command.add_argument("user")
            command.add_argument("--mechanism", action="append" if name == "add" else "store",
                                 choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
                                 help="SCRAM mechanism (add: repeatable, default both; remove: default all)")
        if name == "add":
            from pipeline.security.users import DEFAULT_ITERATIONS, MAX_ITERATIONS, MIN_ITERATIONS

            command.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                                 help=f"PBKDF2 iterations, {MIN_ITERATIONS}..{MAX_ITERATIONS} (default %(default)s)")
            command.add_argument("--password-stdin", action="store_true",
                                 help="read the password from the first line of stdin instead of a prompt")
        command.set_defaults(func=cmd_users)
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

    bench = sub.add_parser("bench", help="benchmark serve modes (see docs/benchmarks.md)")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    skip_unused_imports()  # before any command imports kio
    from pipeline.config import KEYS, ConfigError, environment_values, parse_value
    from pipeline.observe.structured_logs import LogConfig, setup_logging

    args = build_parser().parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])  # `serve --brokers N` passes them on
    # Logging before the command runs: log.* from the environment and the flags
    # (`serve` reconfigures it once its --config file is read).
    try:
        log_keys = {name: KEYS[name] for name in ("log.level", "log.format")}
        values = {name: value for name, (value, _source) in environment_values(os.environ, log_keys).items()}
        for name, key in log_keys.items():
            if getattr(args, key.dest, None) is not None:
                values[name] = parse_value(key, getattr(args, key.dest), f"flag:{key.flag}", text=True)
        setup_logging(LogConfig(**{name.removeprefix("log."): value for name, value in values.items()}))
        return args.func(args)
    except ConfigError as exc:  # from any command's configuration, before it starts anything
        print(f"pipeline: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
