"""Fixtures shared by every test package."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

_databases = itertools.count()

JVM_FIXTURES = frozenset({"spark", "standalone_cluster", "connect_server", "connect_spark"})
"""The session fixtures below that start a JVM: a test using one is ``slow`` whether marked or not."""


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""JVM options every Spark driver the suite starts gets (``SPARK_SUBMIT_OPTS``, which
``spark-submit`` puts on the driver's command line: the servers', the session fixtures', the bench
runs'). C1 only: no C2 compiler threads competing for the 2 cores during a JVM's short test life;
a server reached ``listening on`` in 15-17 s instead of 19-24 s on the 2-core machine (alternated
starts of ``pipeline serve``). The code's semantics do not depend on the JIT tier; production
starts are not affected."""


def pytest_configure(config) -> None:
    """Append ``TEST_JVM_OPTIONS`` to ``SPARK_SUBMIT_OPTS`` for every process the run starts."""
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {TEST_JVM_OPTIONS}".strip()


SHARED_SERVER_FIXTURES = frozenset({"multiqueue_server", "baseline_server"})
"""The session-scoped servers of tests/e2e/conftest.py: every test using one goes to the same
pytest-xdist worker (the ``shared-servers`` group), so each starts once per run, not per worker."""

SHARED_SERVERS_GROUP = "shared-servers"

LONGEST_MODULES = (
    "tests/deploy/test_deploy.py",
    "tests/e2e/test_security.py",
    "tests/bench/test_brokers_smoke.py",
    "tests/e2e/test_brokers.py",
    "tests/e2e/test_durability.py",
    "tests/compat/test_matrix.py",
    "tests/bench/test_bench_smoke.py",
    "tests/e2e/test_metastore.py",
    "tests/e2e/test_table.py",
    "tests/bench/test_consume_smoke.py",
    "tests/bench/test_hostile_smoke.py",
    "tests/e2e/test_config_and_logs.py",
    "tests/bench/test_security_smoke.py",
    "tests/e2e/test_spark_cluster.py",
    "tests/persist/test_spark_cluster.py",
)
"""The slow modules that take longest (60-200 s each on the 2-core machine, from the
``--durations`` table of a full run), longest first, after the shared-servers group. Only a
scheduling hint: ``make test`` runs the suite on 2 pytest-xdist workers, one group at a time
each (``--dist loadgroup``: a module, or every test of the shared servers), in the order of
``pytest_collection_modifyitems``, so starting the long ones first keeps one worker from
running a long module alone at the end. A stale entry makes the run slower, never wrong."""


def pytest_collection_modifyitems(config, items) -> None:
    """Fast tests first, and every test in a pytest-xdist group.

    Every test not marked ``slow`` runs before every ``slow`` one; among the slow ones the
    shared servers' tests go first, then ``LONGEST_MODULES`` in that order; otherwise the
    order is the collection order (a stable sort), so a failure in the unit tests shows in
    the first minutes of a run instead of after the Spark and server tests. A test that
    uses a JVM fixture (``JVM_FIXTURES``) is marked ``slow`` here if its module forgot to,
    so ``-m "not slow"`` never starts a JVM through them.

    Each test also gets an ``xdist_group`` mark, which ``--dist loadgroup`` (``make test``)
    turns into the unit a worker runs: its module, or ``SHARED_SERVERS_GROUP`` for a test
    using a shared server (``SHARED_SERVER_FIXTURES``). This hook is not ``trylast``:
    xdist's own (``trylast``) reads the marks after it. A group goes to a worker at its
    first test in this order (``--no-loadscope-reorder``).
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if JVM_FIXTURES.intersection(fixtures) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is None:
            shared = SHARED_SERVER_FIXTURES.intersection(fixtures)
            item.add_marker(pytest.mark.xdist_group(SHARED_SERVERS_GROUP if shared else item.nodeid.split("::", 1)[0]))
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}

    def key(item) -> tuple[bool, int]:
        if item.get_closest_marker("slow") is None:
            return False, 0
        if SHARED_SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            return True, -1
        return True, rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items[:] = sorted(items, key=key)


def unique_database() -> str:
    """A catalog database name no other test of this run uses (tests share one metastore)."""
    return f"test_{next(_databases)}"


@pytest.fixture(scope="session")
def spark(tmp_path_factory) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """One local Spark session (2 cores) with a Hive catalog for the whole run, stopped at the end.

    Built with ``build_spark_session`` and ``catalog_conf`` so tests see the
    server's confs (UTC session time zone, Arrow on, the embedded Hive
    metastore, ...), on a metastore of its own in a temp dir: a test that
    writes tables gives them a database of its own (``unique_database``).
    Starting it takes ~8 s, hence session scope; pyspark is imported here so
    runs without Spark tests stay fast.
    """
    from pipeline.persist.spark_sink import build_spark_session
    from pipeline.table.catalog import catalog_conf

    session = build_spark_session("local[2]", app_name="pipeline-tests",
                                  conf=catalog_conf(tmp_path_factory.mktemp("spark-metastore")))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory) -> Iterator["pipeline.persist.spark_cluster.StandaloneCluster"]:  # noqa: F821
    """A standalone Spark Master + one Worker (1 core, 1 GiB) on 127.0.0.1, for the whole run.

    Started on first use (~8 s) and stopped at the end; its logs and the
    executors' are under the fixture's temp dir. One SparkContext per JVM:
    a driver on this cluster must run in its own process (the ``spark``
    fixture already holds this one's).
    """
    from pipeline.persist.spark_cluster import StandaloneCluster

    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory) -> Iterator["pipeline.persist.spark_cluster.ConnectServer"]:  # noqa: F821
    """A Spark Connect server (local[*], 2 GiB heap, a Hive catalog of its own) on 127.0.0.1, for the whole run (~7 s to start)."""
    from pipeline.persist.spark_cluster import ConnectServer

    from pipeline.table.catalog import catalog_conf

    work_dir = tmp_path_factory.mktemp("spark-connect")
    with ConnectServer(work_dir, conf=catalog_conf(work_dir / "catalog")) as server:
        yield server


@pytest.fixture(scope="session")
def connect_spark(connect_server) -> Iterator["pyspark.sql.SparkSession"]:  # noqa: F821
    """A Spark Connect client session to ``connect_server``, built like the server's own sink."""
    from pipeline.persist.spark_sink import build_spark_session

    session = build_spark_session(remote=connect_server.url)
    yield session
    session.stop()
