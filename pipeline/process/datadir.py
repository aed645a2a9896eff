"""The data directory's process-wide pieces: its lock, its endpoints file, and a Spark session on its tables.

One ``pipeline`` process at a time owns a data directory (``serve`` or
``compact``): it holds ``DATA_DIR/_pipeline/lock`` (flock) for its lifetime.
A running server tells ``pipeline sql`` where it serves SQL in
``DATA_DIR/_pipeline/endpoints.json``. ``table_session`` uses both to reach
the tables: over the server's Spark Connect endpoint while a server runs,
else with a classic session on the directory's metastore.

Used by the ``pipeline`` command (``pipeline.cli``), the benchmarks and the tests.
"""

from __future__ import annotations

import fcntl
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.config import ServerConfig

log = logging.getLogger(__name__)


def _flock(path: Path) -> TextIO | None:
    """``path`` opened and locked (exclusive, non-blocking flock); None if another process holds it."""
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def lock_data_dir(data_dir: Path, state: Path | None = None) -> TextIO | None:
    """Take ``DATA_DIR/_pipeline/lock`` (flock) for as long as the returned file stays open; None
    (logged) if another process holds it. ``state``: lock ``state/lock`` instead (a broker of a
    cluster: its own state directory). Creates the directory."""
    state = Path(state) if state is not None else Path(data_dir) / "_pipeline"
    state.mkdir(parents=True, exist_ok=True)
    f = _flock(state / "lock")
    if f is None:
        log.error("%s is in use by another pipeline process (serve or compact); one process per data directory",
                  Path(data_dir).resolve())
    return f


def data_dir_in_use(data_dir: Path) -> bool:
    """Whether a process holds ``DATA_DIR/_pipeline/lock`` now (creates nothing)."""
    path = Path(data_dir) / "_pipeline" / "lock"
    if not path.exists():
        return False
    f = _flock(path)
    if f is None:
        return True
    f.close()
    return False


def endpoints_path(data_dir: Path) -> Path:
    """``DATA_DIR/_pipeline/endpoints.json``: where a running server serves SQL."""
    return Path(data_dir) / "_pipeline" / "endpoints.json"


def write_endpoints(config: ServerConfig) -> None:
    """Tell ``pipeline sql`` (and users) where the running server serves SQL: ``DATA_DIR/_pipeline/endpoints.json``."""
    endpoints = {}
    if config.spark_connect_port and not config.spark_remote:
        endpoints["spark_connect"] = f"sc://127.0.0.1:{config.spark_connect_port}"
        log.info("tables queryable by name over Spark Connect at sc://127.0.0.1:%d (database %s)",
                 config.spark_connect_port, config.table.database)
    if config.thrift_port and not config.spark_remote:
        endpoints["jdbc"] = f"jdbc:hive2://127.0.0.1:{config.thrift_port}/{config.table.database}"
        log.info("JDBC (Spark Thrift Server) at %s", endpoints["jdbc"])
    endpoints_path(config.data_dir).write_text(json.dumps(endpoints))


def table_session(data_dir: Path, spark_master: str = "local[*]", spark_remote: str | None = None,
                  metastore_uris: str | None = None, app_name: str = "pipeline-sql",
                  locked: bool = False, wait_s: float = 120.0) -> SparkSession:
    """A Spark session that sees the pipeline's tables by name.

    ``spark_remote`` if given; else the running server's Spark Connect endpoint
    (``DATA_DIR/_pipeline/endpoints.json``) if it serves one; else a classic
    session on the data directory's metastore (the embedded one is free only
    while no server runs). ``locked``: the caller holds the data directory's lock.
    A server still starting Spark (it listens before) publishes its endpoint
    once Spark is up: waited for up to ``wait_s`` (s).

    Raises:
        RuntimeError: a server runs on ``data_dir`` without a Spark Connect endpoint.
    """
    from pipeline.persist.spark_sink import build_spark_session
    from pipeline.table.catalog import catalog_conf

    if spark_remote is None and metastore_uris is None and not locked and data_dir_in_use(data_dir):
        spark_remote = _running_connect_endpoint(Path(data_dir), wait_s)
    if spark_remote is not None:
        return build_spark_session(remote=spark_remote)
    return build_spark_session(spark_master, app_name=app_name, conf=catalog_conf(data_dir, metastore_uris))


def _running_connect_endpoint(data_dir: Path, wait_s: float) -> str:
    """The Spark Connect URL of the server running on ``data_dir`` (its ``endpoints.json``);
    while that server is still starting Spark (no file yet), waits up to ``wait_s``.

    Raises:
        RuntimeError: the server serves no Spark Connect (port 0), or did not publish one in time.
    """
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        # (after a kill -9 the endpoints file outlives the server: only trust it while the server runs)
        try:
            endpoints = json.loads(endpoints_path(data_dir).read_text())
        except (OSError, ValueError):
            endpoints = None
        if endpoints is not None:
            if endpoints.get("spark_connect"):
                return str(endpoints["spark_connect"])
            raise RuntimeError(f"a pipeline server runs on {data_dir.resolve()} with --spark-connect-port 0: "
                               "its embedded metastore is in use; query it over JDBC, or stop it")
        if not data_dir_in_use(data_dir):
            raise RuntimeError(f"the pipeline server on {data_dir.resolve()} stopped before its Spark was up")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the pipeline server on {data_dir.resolve()} has not published its Spark Connect "
                               f"endpoint within {wait_s:.0f} s (its Spark is still starting?)")
        if not waiting:
            waiting = True
            log.info("the server on %s is starting Spark: waiting for its Spark Connect endpoint", data_dir)
        time.sleep(0.2)
