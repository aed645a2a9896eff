"""Read the pipeline's catalog tables from a test, the way a user's own Spark session does.

``read_table(data_dir, query)`` runs ``query`` (the current database is the
pipeline's, so ``records`` names the records table) and returns the rows as
dicts (binary as ``bytes``, structs as dicts, timestamps as tz-aware
datetimes), through Arrow. Where it runs depends on the data directory, as
``pipeline sql`` decides (``pipeline.process.datadir.table_session``):

* a server runs on it with a Spark Connect endpoint (``DATA_DIR/_pipeline/
  endpoints.json``): in this process, through a Spark Connect client session
  (gRPC, no JVM here);
* no server runs on it, or ``metastore_uris`` is given: in a separate process
  with a classic ``local[1]`` Spark session on the data directory's (or that)
  metastore. A separate process because one JVM holds one embedded metastore
  and a test run reads many data directories.

Both paths give the same rows: the session is ``table_session``'s either way
and the rows are the same Arrow table's ``to_pylist()`` (the subprocess hands
it over as an Arrow IPC stream, which keeps every type).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa


def read_table(data_dir: Path, query: str, timeout_s: float = 300.0, metastore_uris: str | None = None,
               remote: str | None = None) -> list[dict]:
    """Rows of ``query`` over the tables of ``data_dir`` (through ``metastore_uris`` if given, or
    through the Spark Connect server ``remote`` on its catalog).

    Raises AssertionError with the reader's log (or the Spark error) on failure, or when
    the read takes longer than ``timeout_s``."""
    return read_tables(data_dir, [query], timeout_s, metastore_uris, remote)[0]


def read_tables(data_dir: Path, queries: list[str], timeout_s: float = 300.0,
                metastore_uris: str | None = None, remote: str | None = None) -> list[list[dict]]:
    """Rows of each of ``queries``, in one session (one JVM start for all when no server runs and no
    ``remote`` Connect server is given)."""
    if remote is None and not metastore_uris:
        remote = running_server_connect_url(data_dir)
    if remote is not None:
        return _read_through_connect(data_dir, remote, queries, timeout_s)
    return _read_in_a_subprocess(data_dir, queries, timeout_s, metastore_uris)


def read_table_until(data_dir: Path, query: str, until: Callable[[list[dict]], bool], timeout_s: float = 180.0,
                     interval_s: float = 0.5) -> list[dict]:
    """Rows of ``query``, read again every ``interval_s`` until ``until(rows)`` holds; those rows.

    For a test on a running (shared) server: an acknowledgement (``--ack-on wal``)
    comes before the table commit, so a read right after the produce may not see
    the records yet. While the server runs each read is a Connect query in this
    process (a few seconds at most), so polling costs no JVM start. Let ``until``
    wait for the count (``len(rows) >= n``) and assert the exact rows after, so a
    duplicate still fails the test.

    Raises AssertionError (with the last rows) when ``until`` does not hold within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = read_table(data_dir, query, timeout_s=max(1.0, deadline - time.monotonic()))
        if until(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{query!r} over {data_dir}: condition not met within {timeout_s:g} s; "
                                 f"last rows ({len(rows)}): {rows[:5]}")
        time.sleep(interval_s)


def running_server_connect_url(data_dir: Path) -> str | None:
    """The Spark Connect URL of the server running on ``data_dir`` now, or None.

    None when no process holds the data directory's lock (``pipeline.process.datadir.data_dir_in_use``:
    after a ``kill -9`` the endpoints file outlives the server) or when the running server
    serves no Connect endpoint (the subprocess reader then fails as ``pipeline sql`` does,
    naming the cause)."""
    from pipeline.process.datadir import data_dir_in_use, endpoints_path

    if not data_dir_in_use(Path(data_dir)):
        return None
    try:
        return json.loads(endpoints_path(Path(data_dir)).read_text()).get("spark_connect")
    except (OSError, ValueError):
        return None


def _read_through_connect(data_dir: Path, remote: str, queries: list[str], timeout_s: float) -> list[list[dict]]:
    from pipeline.process.datadir import table_session
    from pipeline.table.layout import DEFAULT_DATABASE

    spark = table_session(Path(data_dir), spark_remote=remote)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            spark.catalog.setCurrentDatabase(DEFAULT_DATABASE)
            outcome["tables"] = [spark.sql(query).toArrow() for query in queries]
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    reader = threading.Thread(target=run, name="table-reader", daemon=True)
    try:
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            spark.interruptAll()
            reader.join(30)
            raise AssertionError(f"reading {data_dir} through {remote} took more than {timeout_s:g} s: {queries}")
        if "error" in outcome:
            raise AssertionError(f"reading {data_dir} through {remote} failed: {outcome['error']!r}") \
                from outcome["error"]  # type: ignore[misc]
    finally:
        spark.stop()
    return [table.to_pylist() for table in outcome["tables"]]  # type: ignore[union-attr]


def _read_in_a_subprocess(data_dir: Path, queries: list[str], timeout_s: float,
                          metastore_uris: str | None) -> list[list[dict]]:
    with tempfile.TemporaryDirectory(prefix="table-reader-") as tmp:
        request = Path(tmp) / "queries.json"
        request.write_text(json.dumps(queries))
        proc = subprocess.run([sys.executable, "-m", "tests.e2e.table_reader", str(data_dir), str(request), tmp,
                               *([metastore_uris] if metastore_uris else [])],
                              capture_output=True, timeout=timeout_s)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
        results = []
        for i in range(len(queries)):
            with pa.ipc.open_stream(str(Path(tmp) / f"{i}.arrow")) as reader:
                results.append(reader.read_all().to_pylist())
        return results


def main(argv: list[str]) -> int:
    data_dir, request, out_dir, *uris = argv
    from pipeline.process.datadir import table_session
    from pipeline.table.layout import DEFAULT_DATABASE

    queries = json.loads(Path(request).read_text())
    spark = table_session(Path(data_dir), "local[1]", metastore_uris=uris[0] if uris else None,
                          app_name="pipeline-test-reader")
    try:
        spark.catalog.setCurrentDatabase(DEFAULT_DATABASE)
        tables = [spark.sql(query).toArrow() for query in queries]
    finally:
        spark.stop()
    for i, table in enumerate(tables):
        with pa.OSFile(str(Path(out_dir) / f"{i}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def wait_for_live_view(session, timeout_s: float = 60.0, database: str = "pipeline") -> None:
    """Until ``<database>.records_live`` exists in ``session``'s catalog: a server publishes it a moment
    after its table side is ready (its first Python data source costs the JVM ~2 s)."""
    deadline = time.monotonic() + timeout_s
    while not session.catalog.tableExists(f"{database}.records_live"):
        if time.monotonic() > deadline:
            raise AssertionError(f"{database}.records_live not published within {timeout_s:g} s")
        time.sleep(0.2)
