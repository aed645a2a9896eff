"""Read the pipeline's catalog tables from a test, the way a user's own Spark session does.

``read_table(data_dir, query)`` runs ``query`` (the current database is the
pipeline's, so ``records`` names the records table) in a separate process
with a classic Spark session on the data directory's metastore
(``pipeline.cli.table_session``: the embedded one once the server has
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
    with tempfile.NamedTemporaryFile(suffix=".arrow") as out:
        proc = subprocess.run([sys.executable, "-m", "tests.e2e.table_reader", str(data_dir), query, out.name,
                               *([metastore_uris] if metastore_uris else [])],
                              capture_output=True, timeout=timeout_s)
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
        with pa.ipc.open_stream(out.name) as reader:
            return reader.read_all().to_pylist()


def main(argv: list[str]) -> int:
    data_dir, query, out, *uris = argv
    from pipeline.cli import table_session
    from pipeline.persist.spark_sink import run_sql  # noqa: F401  (same current-database rule)
    from pipeline.table.layout import DEFAULT_DATABASE

    spark = table_session(Path(data_dir), "local[1]", metastore_uris=uris[0] if uris else None,
                          app_name="pipeline-test-reader")
    try:
        spark.catalog.setCurrentDatabase(DEFAULT_DATABASE)
        table = spark.sql(query).toArrow()
    finally:
        spark.stop()
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
