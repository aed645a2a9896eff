"""The Spark driver maps the class-data archive (pipeline.persist.jvm_archive) when it exists."""

from __future__ import annotations

import pytest

from pipeline.persist.jvm_archive import archive_path, existing_archive
from tests.missing import missing

pytestmark = pytest.mark.slow


def test_a_driver_started_by_build_spark_session_maps_the_archive(spark):
    """The session fixture's driver is started by ``build_spark_session``: with the archive made
    (``make test`` makes it after installing), the JVM has the file mapped (``/proc/PID/maps``)."""
    archive = existing_archive()
    if archive is None:
        missing(f"no archive at {archive_path()}: `python -m pipeline.persist.jvm_archive` makes it "
                "(make does, after installing)")
    pid = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getPid()
    with open(f"/proc/{pid}/maps") as maps:
        assert str(archive) in maps.read()


def test_the_archive_is_keyed_by_java_and_pyspark():
    path = archive_path()
    assert path.name.startswith("spark-driver-") and path.suffix == ".jsa"
    assert path == archive_path()  # stable for one installation
