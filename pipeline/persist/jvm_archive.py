"""A class-data-sharing archive of the Spark driver's JVM (JDK 17 dynamic CDS).

Most of a Spark driver's start-up is loading and verifying the same ~20,000 classes.
``ensure_archive`` runs one small Spark job (a Hive catalog on Derby, a Parquet table written
and read) once, in a JVM started with ``-XX:ArchiveClassesAtExit``, and keeps the archive
(~200 MB) in the environment pipeline is installed in (``sys.prefix/share/pipeline``), keyed
by ``java -version`` and pyspark; ``build_spark_session`` then starts every local driver with
``-XX:SharedArchiveFile`` when it exists: ``pipeline serve``'s table side was ready in 8 s
instead of 13 s on the 2-core machine. ``make serve`` and ``make test`` make it after
installing (~40 s, once); a driver whose JDK or classpath differ from the archive's ignores
it (``-Xshare:auto``, the default) and starts as before, as every driver does without one.

    python -m pipeline.persist.jvm_archive     # make it now; prints its path (exit 1: not made)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(sys.prefix) / "share" / "pipeline"
"""Where the archive is kept: beside the installed packages, made for their classpath."""
TIMEOUT_S = 300.0
"""Bound on the archive job (s); its JVM exits with its Python (pyspark's gateway)."""

_JOB = """
import os, sys, tempfile
from pipeline.persist.spark_sink import build_spark_session
from pipeline.table.catalog import catalog_conf
work = tempfile.mkdtemp()
spark = build_spark_session("local[1]", app_name="jvm-archive", conf=catalog_conf(work))
spark.sql("CREATE DATABASE IF NOT EXISTS archive")
spark.range(1000).selectExpr("id", "id % 4 as part", "cast(cast(id as string) as binary) as value", "current_timestamp() as ts") \\
    .write.format("parquet").partitionBy("part").mode("overwrite").saveAsTable("archive.t")
assert spark.table("archive.t").count() == 1000
spark.stop()
"""


def archive_path() -> Path:
    """Where the archive for this machine's ``java`` and pyspark lives (it may not exist yet).

    Raises:
        OSError, subprocess.SubprocessError: ``java`` cannot be run.
    """
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    key = hashlib.sha256(f"{java}\n{pyspark.__version__}\n{pyspark.__file__}".encode()).hexdigest()[:16]
    return CACHE / f"spark-driver-{key}.jsa"


def existing_archive() -> Path | None:
    """The archive if it has been made, else None (also when ``java`` cannot be run)."""
    try:
        path = archive_path()
    except (OSError, subprocess.SubprocessError):
        return None
    return path if path.exists() else None


def ensure_archive() -> Path | None:
    """The archive, made first if missing; None (with the reason on stderr) if it cannot be made."""
    try:
        path = archive_path()
        if path.exists():
            return path
        CACHE.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=CACHE, suffix=".jsa.tmp")
        os.close(fd)
        os.unlink(tmp)  # the JVM writes it at exit
        env = dict(os.environ, SPARK_SUBMIT_OPTS=f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={tmp}")
        proc = subprocess.run([sys.executable, "-c", _JOB], env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=tempfile.gettempdir())
        if proc.returncode != 0 or not os.path.exists(tmp):
            print(f"no JVM class-data archive (exit {proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
            if os.path.exists(tmp):
                os.unlink(tmp)
            return None
        os.replace(tmp, path)
        return path
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"no JVM class-data archive: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    made = ensure_archive()
    print(made or "no archive")
    sys.exit(0 if made else 1)
