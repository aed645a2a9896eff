"""Start and stop Spark beyond the embedded ``local[*]``: a standalone cluster, a Connect server.

``pipeline serve --spark-master spark://HOST:PORT`` needs a standalone Master
with at least one Worker; ``--spark-remote sc://HOST:PORT`` needs a Spark
Connect server. Both ship with the pyspark package (``bin/spark-class``,
``bin/spark-submit`` and the ``spark-connect`` jar), so tests, benchmarks and
users trying the cluster modes out can start them on this machine with:

    with StandaloneCluster(work_dir) as cluster:      # cluster.master_url
        ...
    with ConnectServer(work_dir) as server:           # server.url
        ...

Every process binds to 127.0.0.1 (``--host``, ``SPARK_LOCAL_IP``, the gRPC
binding address), runs in its own process group (so ``stop`` also ends the
executor JVMs a Worker launched) and writes its log to ``work_dir``; a
process that does not come up within ``timeout_s`` is stopped and reported
with the tail of its log. Being in their own group, the JVMs also outlive a
Python process killed before it could call ``stop`` (SIGKILL; SIGTERM without
a handler): stop them by their group id then. Memory is kept modest (daemons 512 MiB of heap,
executors 1 GiB, the Connect server 2 GiB): a laptop or a 2-core CI runner.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Callable, Self

from pipeline.process.lifecycle import set_parent_death_signal

LOOPBACK = "127.0.0.1"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Master's "Starting Spark master at spark://127.0.0.1:PORT" (Master.onStart).
_MASTER_STARTED = re.compile(r"Starting Spark master at (spark://\S+)")
# Worker's "Successfully registered with master spark://..." (Worker.handleRegisterResponse).
_WORKER_REGISTERED = re.compile(r"Successfully registered with master")
# SparkConnectServer's "Spark Connect server started at: 127.0.0.1:PORT". The
# port can differ from the one asked for: a taken port makes Spark try the
# next ones (Utils.startServiceOnPort, spark.port.maxRetries); 0 picks a free one.
_CONNECT_STARTED = re.compile(r"Spark Connect server started at: \S+:(\d+)")


class SparkProcessError(RuntimeError):
    """A Spark process exited, or did not come up in time; the message ends with its log tail."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (``bin/``, ``jars/``).

    The package's own directory, not ``$SPARK_HOME``: the JVM side must be the
    exact version of the Python side.
    """
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def python_workers_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a JVM started with environment ``env`` needs so that its Python workers (the live view's
    tail, ``pipeline.table.live``) run this Python, which has pipeline installed: ``PYSPARK_PYTHON``
    unless set (Spark's data source planner reads the variable, not ``spark.pyspark.python``), and the
    directory of ``pyspark_pipeline`` first on their ``PYTHONPATH``: pyspark finds data sources by
    listing ``sys.path`` (``pkgutil.iter_modules``), which does not see a module an editable install
    maps through an import hook (an installed wheel has it in site-packages: adding it is harmless).

    Returns:
        The variables to set (a subset of ``PYSPARK_PYTHON``, ``PYTHONPATH``).
    """
    import importlib.util

    out = {} if env.get("PYSPARK_PYTHON") else {"PYSPARK_PYTHON": sys.executable}
    spec = importlib.util.find_spec("pyspark_pipeline")
    if spec is not None and spec.origin is not None:
        directory = os.path.dirname(spec.origin)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if directory not in paths:
            out["PYTHONPATH"] = os.pathsep.join([directory, *paths])
    return out


def _spark_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(python_workers_env(env))
    env.update({
        "SPARK_HOME": str(spark_home()),
        # Master/Worker web UIs and every RPC endpoint bind here (Utils.localHostName).
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": LOOPBACK,
        # Heap of the Master and Worker daemons themselves (default 1g).
        "SPARK_DAEMON_MEMORY": "512m",
    })
    # The Master's REST submission server would take the fixed port 6066.
    env["SPARK_MASTER_OPTS"] = f"{env.get('SPARK_MASTER_OPTS', '')} -Dspark.master.rest.enabled=false".strip()
    env.update(extra or {})
    return env


class SparkProcess:
    """One Spark JVM launched by a ``bin/`` script, its output appended to ``log_path``.

    The child is the leader of a new process group: ``stop`` signals the group,
    so the JVM ``spark-class`` execs into and anything it spawned (a Worker's
    executors) go with it.
    """

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str],
                 die_with_parent: bool = False) -> None:
        self.die_with_parent = die_with_parent
        """SIGKILL the JVM when this process dies (``PR_SET_PDEATHSIG``, kept across exec)."""
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            env=self.env, start_new_session=True,
            preexec_fn=set_parent_death_signal if self.die_with_parent else None,
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self._exit_status() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def fail(self, what: str) -> SparkProcessError:
        return SparkProcessError(f"{self.name} {what}; log {self.log_path}:\n{self.log_tail()}")

    def check_alive(self) -> None:
        """Raises ``SparkProcessError`` (with the log tail) if the process has exited."""
        status = None if self.proc is None else self._exit_status()
        if status is not None:
            raise self.fail(f"exited with status {status}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``. Safe to call twice.

        The group gets SIGKILL in any case once the leader has exited (a Worker's
        executors may outlive it), but while the leader is still an unreaped
        zombie: until then its pid, hence the group id, cannot be reused.
        """
        if self.proc is not None and self.proc.returncode is None:
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self._exit_status() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _exit_status(self) -> int | None:
        """The leader's exit status (or killing signal) once it has exited, else None.

        Never reaps it (``WNOWAIT``, unlike ``Popen.poll``): see ``stop``.
        """
        assert self.proc is not None
        if self.proc.returncode is not None:
            return self.proc.returncode
        info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return None if info is None else info.si_status

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # pgid == pid: start_new_session
        except ProcessLookupError:
            pass


def _wait_for(proc: SparkProcess, ready: Callable[[], bool], what: str, timeout_s: float, poll_s: float = 0.25) -> None:
    """Poll ``ready()`` until true; raise (stopping nothing) if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if ready():
            return
        proc.check_alive()
        if time.monotonic() >= deadline:
            raise proc.fail(f"did not {what} within {timeout_s:.0f} s")
        time.sleep(poll_s)


class StandaloneCluster:
    """A standalone Master and one Worker on 127.0.0.1, as a context manager.

    Args:
        work_dir: logs (``master.log``, ``worker.log``) and the Worker's work
            directory (``worker/``, one folder per application with executor logs).
        cores: cores the Worker offers (``--cores``).
        memory: memory the Worker offers its executors (``--memory``, e.g. "1g");
            an application's ``spark.executor.memory`` (default 1g) must fit.
        timeout_s: how long the Master may take to start, and the Worker to register.

    Attributes:
        master_url: ``spark://127.0.0.1:PORT`` once started (the Master picks a free port).

    Raises (from ``start``/``__enter__``):
        SparkProcessError: a process exited or was not ready in time; both are stopped.
    """

    def __init__(self, work_dir: str | os.PathLike[str], cores: int = 1, memory: str = "1g",
                 timeout_s: float = 120.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.cores = cores
        self.memory = memory
        self.timeout_s = timeout_s
        self.master_url: str | None = None
        self.master: SparkProcess | None = None
        self.worker: SparkProcess | None = None

    def start(self) -> "StandaloneCluster":
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = _spark_env()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            # Port 0 for the RPC port and the web UI: the Master binds free ones
            # and logs the URL it got, so there is no race for a pre-picked port.
            self.master = master = SparkProcess(
                "Spark Master",
                [spark_class, MASTER_CLASS, "--host", LOOPBACK, "--port", "0", "--webui-port", "0"],
                self.work_dir / "master.log", env,
            )
            master.start()

            def master_started() -> bool:
                m = _MASTER_STARTED.search(master.log_text())
                if m:
                    self.master_url = m.group(1)
                return m is not None

            _wait_for(master, master_started, "start", self.timeout_s)
            master_url = self.master_url
            assert master_url is not None  # set by master_started before it returned True
            self.worker = worker = SparkProcess(
                "Spark Worker",
                [spark_class, WORKER_CLASS, master_url, "--host", LOOPBACK, "--port", "0",
                 "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory,
                 "--work-dir", str(self.work_dir / "worker")],
                self.work_dir / "worker.log", env,
            )
            worker.start()
            _wait_for(worker, lambda: bool(_WORKER_REGISTERED.search(worker.log_text())),
                      "register with the Master", self.timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the Worker (and its executors), then the Master. Safe to call twice."""
        for proc in (self.worker, self.master):
            if proc is not None:
                proc.stop()

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _OneProcessService:
    """A service that is one ``SparkProcess`` (``self.process``); a context manager around the subclass's ``start``."""

    process: SparkProcess | None = None

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL). Safe to call twice."""
        if self.process is not None:
            self.process.stop()

    def start(self) -> Self:
        """Start the service; the subclass's."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ConnectServer(_OneProcessService):
    """A Spark Connect server on 127.0.0.1, as a context manager.

    Runs ``bin/spark-submit --class SparkConnectServer`` in the foreground (what
    ``sbin/start-connect-server.sh`` runs through ``spark-daemon.sh``), so the
    JVM is our child and ``stop`` ends it.

    Args:
        work_dir: holds ``connect-server.log``.
        master: the master the server's own driver uses (``local[*]``, or a
            ``StandaloneCluster``'s ``master_url``).
        port: gRPC port to ask for; default a free one (the server picks it).
        driver_memory: the server's heap. Every Arrow table a client sends
            becomes rows in this heap and one serialised task: a 68 MiB table
            (a full default ``--batch-max-bytes`` flush) fits in 1 GiB, a
            106 MiB one needed more (passed with 3 GiB). Out of memory, the
            server either exits (the client then sees UNAVAILABLE) or leaves
            the write hanging.
        conf: extra ``--conf`` settings for the server.
        timeout_s: how long the server may take to accept connections.
        die_with_parent: the JVM gets SIGKILL when the thread that started it dies
            (``PR_SET_PDEATHSIG``): start it from the main thread. Otherwise it
            outlives a SIGKILLed parent (its own process group).
        host: the address the gRPC server binds (default 127.0.0.1); the
            multi-host failover test binds its bridge's address, which the
            brokers in their network namespaces reach. The driver stays on
            127.0.0.1.

    Attributes:
        bound_port: the port the server listens on, once started.
        url: ``sc://HOST:PORT``, for ``SparkSession.builder.remote``.

    Raises (from ``start``/``__enter__``):
        SparkProcessError: the server exited or did not listen in time; it is stopped.
    """

    DEFAULT_CONF: dict[str, str] = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
    }

    def __init__(self, work_dir: str | os.PathLike[str], master: str = "local[*]",
                 port: int | None = None, driver_memory: str = "2g",
                 conf: dict[str, str] | None = None, timeout_s: float = 120.0,
                 die_with_parent: bool = False, host: str = LOOPBACK) -> None:
        self.die_with_parent = die_with_parent
        self.host = host
        self.work_dir = Path(work_dir).resolve()
        self.master = master
        self.port = port
        self.bound_port: int | None = None
        self.driver_memory = driver_memory
        self.conf = {**self.DEFAULT_CONF, **(conf or {})}
        self.timeout_s = timeout_s
        self.process: SparkProcess | None = None

    @property
    def url(self) -> str:
        if self.bound_port is None:
            raise RuntimeError("ConnectServer is not started")
        return f"sc://{self.host}:{self.bound_port}"

    def start(self) -> "ConnectServer":
        conf = {
            **self.conf,
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port or 0),
        }
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS,
               "--name", "Spark Connect server", "--master", self.master,
               "--driver-memory", self.driver_memory]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # spark-submit's launcher sizes a "spark-internal" server's heap (the
        # Thrift and Connect servers) by SPARK_DAEMON_MEMORY, not --driver-memory.
        env = _spark_env({"SPARK_DAEMON_MEMORY": self.driver_memory})
        self.process = process = SparkProcess("Spark Connect server", cmd, self.work_dir / "connect-server.log",
                                              env, die_with_parent=self.die_with_parent)
        process.start()

        def listening() -> bool:
            if self.bound_port is None:
                m = _CONNECT_STARTED.search(process.log_text())
                if m is None:
                    return False
                self.bound_port = int(m.group(1))
            return port_open(self.host, self.bound_port)

        try:
            _wait_for(process, listening, f"listen on {self.host}", self.timeout_s)
        except BaseException:
            self.stop()
            raise
        return self



METASTORE_CLASS = "org.apache.hadoop.hive.metastore.HiveMetaStore"


class MetastoreServer(_OneProcessService):
    """A Hive metastore service (Thrift, ``hive.metastore.uris``) from pyspark's own jars, on 127.0.0.1.

    Runs Hive's ``HiveMetaStore`` (hive-metastore 2.3, shipped in
    ``pyspark/jars``) on an embedded Derby database in ``work_dir``, so several
    Spark applications (the server, ``pipeline sql``, a user's own session)
    share one catalog at the same time: pass ``uris`` to ``pipeline serve
    --metastore-uris`` and to ``pipeline.table.catalog.catalog_conf``.

    It listens on EVERY interface, not only 127.0.0.1: Hive 2.3's
    ``HiveMetaStore`` opens its Thrift server socket without a bind address
    (``hive.metastore.thrift.bind.host`` came with Hive 3). It has no
    authentication either: use it on a machine whose network you trust (CI,
    a laptop), and a managed metastore elsewhere.

    Args:
        work_dir: holds ``metastore_db`` (the Derby database), ``warehouse`` and ``metastore.log``.
        port: Thrift port (default: a free one, picked before start).
        timeout_s: how long it may take to accept connections (~5 s here).

    Raises (from ``start``/``__enter__``):
        SparkProcessError: it exited or did not listen in time; it is stopped.
        FileNotFoundError: no ``java`` on PATH or in JAVA_HOME.
    """

    def __init__(self, work_dir: str | os.PathLike[str], port: int | None = None, timeout_s: float = 120.0) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.port = port
        self.timeout_s = timeout_s
        self.process: SparkProcess | None = None

    @property
    def uris(self) -> str:
        if self.port is None:
            raise RuntimeError("MetastoreServer is not started")
        return f"thrift://{LOOPBACK}:{self.port}"

    def start(self) -> "MetastoreServer":
        import shutil

        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java:
            raise FileNotFoundError("java (Java 17) is needed by the Hive metastore")
        port = self.port
        if port is None:
            with socket.socket() as s:
                s.bind((LOOPBACK, 0))
                self.port = port = s.getsockname()[1]
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cmd = [java, "-Xmx512m", "-cp", str(spark_home() / "jars" / "*"),
               # Hive's own log set-up wants the LMAX disruptor for async logging, which pyspark does not ship.
               "-Dhive.async.log.enabled=false",
               f"-Djavax.jdo.option.ConnectionURL=jdbc:derby:;databaseName={self.work_dir / 'metastore_db'};create=true",
               f"-Dderby.stream.error.file={self.work_dir / 'derby.log'}",
               "-Ddatanucleus.schema.autoCreateAll=true", "-Dhive.metastore.schema.verification=false",
               f"-Dhive.metastore.warehouse.dir={self.work_dir / 'warehouse'}",
               METASTORE_CLASS, "-p", str(port)]
        self.process = process = SparkProcess("Hive metastore", cmd, self.work_dir / "metastore.log", _spark_env())
        process.start()
        try:
            _wait_for(process, lambda: port_open(LOOPBACK, port), f"listen on {LOOPBACK}:{port}", self.timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

