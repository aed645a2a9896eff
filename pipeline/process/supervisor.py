"""``pipeline serve --brokers N``: N broker processes on one machine under one supervisor.

The supervisor serves nothing itself. It

1. takes the data directory's lock (``DATA_DIR/_pipeline/lock``: no other
   ``serve`` or ``compact`` on it meanwhile);
2. starts one Spark Connect server (``pipeline.persist.spark_cluster.ConnectServer``,
   with the data directory's catalog) that every broker writes through, unless
   ``--spark-remote`` names one already running, and records it in
   ``DATA_DIR/_pipeline/endpoints.json`` for ``pipeline sql``;
3. starts brokers 0..N-1 (``pipeline serve --brokers 1 --node-id i``) on the
   ``--listen`` port and the next N-1 (port 0: N free ports picked first),
   each told the whole cluster (``--cluster-brokers 0@HOST:P0,1@HOST:P1,...``,
   ``pipeline.cluster.membership``) and the shared Spark (``--spark-remote``), with every
   other option the supervisor was given; their output lines are printed
   prefixed ``broker I:``, so each broker's ``listening on`` line shows;
4. restarts a broker that exits (logged, with a back-off that doubles from
   1 s up to 30 s, reset once a broker stayed up a minute); its WAL recovery
   makes the restart lose nothing acknowledged; a broker that exits with a
   configuration error (status 2) is not restarted: the cluster stops, status 2;
5. on SIGTERM/SIGINT stops every broker (SIGTERM, each drains and flushes;
   SIGKILL after ``BROKER_STOP_TIMEOUT_S``), then the Connect server.

No orphans: brokers and the Connect server JVM are started with
``PR_SET_PDEATHSIG`` = SIGKILL (prctl(2), set between fork and exec, kept by
exec), so a supervisor killed with SIGKILL takes them with it. Each is the
leader of its own session, so a terminal's Ctrl-C reaches the supervisor
only, which stops them in order.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, TextIO

from pipeline.cluster.membership import ClusterBroker, format_brokers
from pipeline.process.lifecycle import set_parent_death_signal

if TYPE_CHECKING:
    from pipeline.config import ServerConfig
    from pipeline.persist.spark_cluster import ConnectServer

log = logging.getLogger("pipeline.supervisor")

BROKER_STOP_TIMEOUT_S = 90.0
"""How long a broker may take to drain and flush after SIGTERM before it is killed (s)."""
RESTART_BACKOFF_S = (1.0, 30.0)
"""First and longest wait before restarting a broker that died (s); doubles per quick death."""
CONFIG_ERROR_STATUS = 2
"""``pipeline serve``'s exit status for a configuration error: such a broker is not restarted."""
STABLE_AFTER_S = 60.0
"""A broker up this long is healthy again: its next restart waits the first back-off."""

# Flags the supervisor sets per broker, removed from what it passes on.
_OWN_FLAGS = ("--brokers", "--node-id", "--listen", "--advertised-listener", "--cluster-brokers",
              "--spark-master", "--spark-remote", "--metrics-port", "--spark-connect-port", "--thrift-port")


def create_shared_stores(config: ServerConfig) -> None:
    """Create the SQLite stores the brokers share (topics, groups, users, ACLs) before any
    broker starts: two processes creating one at the same moment can fail with "database
    is locked" (switching a new file to WAL journal mode takes an exclusive lock, and SQLite
    does not wait for it); once created, the mode is the file's and opening it just reads it."""
    from pipeline.metadata.topics import FILE as TOPICS, TopicStore
    from pipeline.coordinator.offset_store import STORE_FILE as GROUPS, OffsetStore
    from pipeline.security.acl_store import ACL_STORE_FILE, AclStore
    from pipeline.security.users import UserStore
    from pipeline.metadata.database import store_target

    url = config.metadata_url  # PostgreSQL: the schemas are migrated here once, before any broker

    TopicStore(store_target(url, config.data_dir, TOPICS)).close()
    OffsetStore(store_target(url, config.data_dir, GROUPS)).close()
    UserStore.for_data_dir(config.data_dir, url).close()
    if config.authorizer_class_name:
        AclStore(store_target(url, config.data_dir, ACL_STORE_FILE)).close()


def strip_flags(argv: list[str], flags: tuple[str, ...] = _OWN_FLAGS) -> list[str]:
    """``argv`` without ``flags`` and their values (``--flag VALUE`` and ``--flag=VALUE``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def broker_ports(host: str, first: int, n: int) -> list[int]:
    """The N brokers' ports: ``first`` and the next N-1; ``first`` 0: N distinct ports free now,
    picked below the kernel's ephemeral range (``pipeline.network.listeners.free_listen_port``).

    The brokers bind them only once started (tens of seconds later on a loaded machine). A port-0
    pick would come from the ephemeral range, where any outgoing connection meanwhile (Spark
    Connect's, PostgreSQL's, a client's) can take it and the broker's bind then fails with
    "Address already in use" (seen in CI); below that range no kernel pick lands.

    Raises:
        OSError: no free port was found (``free_listen_port``).
    """
    from pipeline.network.listeners import free_listen_port

    if first:
        return [first + i for i in range(n)]
    bind_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    ports: list[int] = []
    for _ in range(n):
        ports.append(free_listen_port(bind_host, avoid=ports))
    return ports


@dataclass(slots=True)
class Broker:
    """One broker process the supervisor runs."""

    node_id: int
    cmd: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = RESTART_BACKOFF_S[0]
    restart_at: float | None = None
    pumps: list[threading.Thread] = field(default_factory=list)
    prefix_log: bool = True
    """Prefix the broker's log lines (its stderr) with ``[broker I]``; False (JSON logs): passed as they are."""

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE if self.prefix_log else None,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True, preexec_fn=set_parent_death_signal)
        self.started_at = time.monotonic()
        self.restart_at = None
        self.pumps = [p for p in self.pumps if p.is_alive()]
        streams = [(self.proc.stdout, sys.stdout, f"broker {self.node_id}: ")]
        if self.prefix_log:
            streams.append((self.proc.stderr, sys.stderr, f"[broker {self.node_id}] "))
        for stream, out, prefix in streams:
            pump = threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True,
                                    name=f"broker-{self.node_id}-output")
            pump.start()
            self.pumps.append(pump)
        log.info("broker %d started: pid %d", self.node_id, self.proc.pid)


def _pump(stream: IO[bytes], out: TextIO, prefix: str) -> None:
    """Copy a broker's output lines to ``out``, each prefixed with ``prefix``."""
    for raw in iter(stream.readline, b""):
        out.write(prefix + raw.decode(errors="replace"))
        out.flush()
    stream.close()


def broker_registry_listener(listener: str, node_id: int) -> str:
    """Broker ``node_id``'s Schema Registry listener under ``--brokers N``: ``listener``'s
    (``http[s]://HOST:PORT``, ``pipeline.config.registry_listener``) port + ``node_id``, as the Kafka
    listeners and the metrics port go; port 0 stays 0 (a free port each)."""
    scheme, _, address = listener.partition("://")
    host, _, port = address.rpartition(":")
    return f"{scheme}://{host}:{int(port) + node_id if int(port) else 0}"


class Supervisor:
    """Runs the cluster of ``config.brokers`` brokers (see the module docstring).

    Args:
        config: the resolved ``ServerConfig`` (``brokers`` > 1).
        top_args: ``pipeline`` options before ``serve`` (``--log-level``...), passed on.
        serve_args: the ``serve`` options as given, passed on minus the ones set per broker.
        prefix_log: prefix each broker's log lines with ``[broker I]`` (plain logs).
    """

    def __init__(self, config: ServerConfig, top_args: list[str], serve_args: list[str],
                 prefix_log: bool = True) -> None:
        self.config = config
        self.prefix_log = prefix_log
        self.top_args = top_args
        self.serve_args = strip_flags(serve_args)
        self.brokers: list[Broker] = []
        self.connect: ConnectServer | None = None
        self.spark_remote: str | None = config.spark_remote
        self._stop = threading.Event()
        self._starting = True

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        from pipeline.process.lifecycle import StartupInterrupted

        self._stop.set()
        if self._starting:  # interrupt the Connect server's start where it is (it stops itself)
            self._starting = False
            raise StartupInterrupted(signum)

    def cluster(self) -> tuple[ClusterBroker, ...]:
        c = self.config
        ports = broker_ports(c.listen_host, c.listen_port, c.brokers)
        host = c.advertised_host or c.listen_host
        return tuple(ClusterBroker(i, host, port) for i, port in enumerate(ports))

    def _broker_cmd(self, member: ClusterBroker, members: tuple[ClusterBroker, ...]) -> list[str]:
        c = self.config
        cmd = [sys.executable, "-m", "pipeline.cli", *self.top_args, "serve", *self.serve_args,
               "--brokers", "1", "--node-id", str(member.node_id),
               "--listen", f"{c.listen_host}:{member.port}",
               "--cluster-brokers", format_brokers(members),
               "--spark-remote", self.spark_remote or ""]
        if c.advertised_host:
            cmd += ["--advertised-listener", f"{member.host}:{member.port}"]
        if c.metrics_port is not None:
            cmd += ["--metrics-port", str(c.metrics_port + member.node_id if c.metrics_port else 0)]
        if c.schema_registry_listener is not None:  # each broker serves the one registry on a port of its own
            cmd += ["--schema-registry-listeners", broker_registry_listener(c.schema_registry_listener, member.node_id)]
        return cmd

    def run(self) -> int:
        """Start everything, supervise until a stop signal, stop everything. Returns the exit code."""
        from pipeline.process.datadir import endpoints_path
        from pipeline.process.lifecycle import StartupInterrupted
        from pipeline.persist.spark_cluster import ConnectServer
        from pipeline.table.catalog import catalog_conf

        c = self.config
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        endpoints = endpoints_path(c.data_dir)
        try:
            if self.spark_remote is None:
                log.info("starting the brokers' shared Spark Connect server (master %s)", c.spark_master)
                self.connect = connect = ConnectServer(
                    Path(c.data_dir) / "_pipeline" / "spark-connect", master=c.spark_master,
                    port=c.spark_connect_port or None, conf=catalog_conf(c.data_dir, c.metastore_uris),
                    timeout_s=300.0, die_with_parent=True)
                connect.start()
                assert connect.process is not None  # start() returned: it runs
                self.spark_remote = connect.url
                log.info("Spark Connect server at %s (log %s)", self.spark_remote, connect.process.log_path)
                endpoints.write_text(json.dumps({"spark_connect": self.spark_remote}))
            create_shared_stores(c)
            members = self.cluster()
            log.info("cluster: %s", format_brokers(members))
            print(f"pipeline supervisor: {len(members)} brokers {format_brokers(members)}, Spark {self.spark_remote}",
                  flush=True)
            self.brokers = [Broker(m.node_id, self._broker_cmd(m, members), prefix_log=self.prefix_log) for m in members]
            for b in self.brokers:
                b.start()
            self._starting = False
            if not self._stop.is_set():
                code = self._supervise()
                if code:
                    return code
            log.info("stop signal received: stopping the brokers, then Spark")
            return 0
        except StartupInterrupted as exc:
            log.warning("%s: stopping what was started", exc)
            return 0
        finally:
            self._starting = False
            self._stop_all()
            endpoints.unlink(missing_ok=True)
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _supervise(self) -> int:
        """Until a stop signal (0), or a broker's configuration error (2: restarting cannot help)."""
        while not self._stop.wait(0.2):
            now = time.monotonic()
            for b in self.brokers:
                assert b.proc is not None
                if b.restart_at is not None:
                    if now >= b.restart_at:
                        b.restarts += 1
                        log.warning("restarting broker %d (restart %d)", b.node_id, b.restarts)
                        b.start()
                    continue
                code = b.proc.poll()
                if code is None:
                    continue
                if code == CONFIG_ERROR_STATUS:
                    log.error("broker %d exited with a configuration error (status 2, its log says which): "
                              "stopping the cluster", b.node_id)
                    return CONFIG_ERROR_STATUS
                if now - b.started_at >= STABLE_AFTER_S:
                    b.backoff_s = RESTART_BACKOFF_S[0]
                b.restart_at = now + b.backoff_s
                log.error("broker %d (pid %d) exited with %s; restarting in %.0f s", b.node_id, b.proc.pid,
                          f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}", b.backoff_s)
                b.backoff_s = min(b.backoff_s * 2, RESTART_BACKOFF_S[1])
        return 0

    def _stop_all(self) -> None:
        running = [(b, b.proc) for b in self.brokers if b.proc is not None and b.proc.poll() is None]
        if running:
            log.info("stopping %d broker(s)", len(running))
        for _, proc in running:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + BROKER_STOP_TIMEOUT_S
        for b, proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("broker %d did not stop within %.0f s: killing it", b.node_id, BROKER_STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        for b in self.brokers:
            for pump in b.pumps:
                pump.join(5)
        if self.connect is not None:
            log.info("stopping the Spark Connect server")
            self.connect.stop()
        log.info("supervisor stopped")
