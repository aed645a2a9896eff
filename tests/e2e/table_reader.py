"""Read the pipeline's catalog tables from a test, the way a user's own Spark session does.

``read_table(data_dir, query)`` runs ``query`` (the current database is the
pipeline's, so ``records`` names the records table) in a separate process
with a classic Spark session on the data directory's metastore
(``pipeline.datadir.table_session``: the embedded one once the server has
stopped, the server's Spark Connect endpoint while it runs) and returns
the rows as dicts (binary as ``bytes``, structs as dicts, timestamps as
tz-aware datetimes), through Arrow. A separate process because one JVM
holds one metastore and a test run reads many data directories.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa


def read_table(data_dir: Path, query: str, timeout_s: float = 300.0, metastore_uris: str | None = None) -> list[dict]:
    """Rows of ``query`` over the tables of ``data_dir`` (through ``metastore_uris`` if given).

    Raises AssertionError with the reader's log on failure."""
    return read_tables(data_dir, [query], timeout_s, metastore_uris)[0]


def read_tables(data_dir: Path, queries: list[str], timeout_s: float = 300.0,
                metastore_uris: str | None = None) -> list[list[dict]]:
    """Rows of each of ``queries``, in one reader process (one JVM start for all)."""
    import json

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
    import json

    data_dir, request, out_dir, *uris = argv
    from pipeline.datadir import table_session
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
