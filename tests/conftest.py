"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """One local Spark session (2 cores) for the whole run, stopped at the end.

    Built with ``build_spark_session`` so tests see the server's confs (UTC
    session time zone, Arrow on, ...). Starting it takes ~8 s, hence session
    scope; pyspark is imported here so runs without Spark tests stay fast.
    """
    from pipeline.persist.spark_sink import build_spark_session

    session = build_spark_session("local[2]", app_name="pipeline-tests")
    yield session
    session.stop()
