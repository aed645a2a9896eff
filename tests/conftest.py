"""Fixtures shared by every test package."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import warnings
from collections.abc import Iterator

import pytest

from tests.postgres import metadata_target, postgres_server  # noqa: F401  (fixtures for every package)

_databases = itertools.count()

JVM_FIXTURES = frozenset({"spark", "standalone_cluster", "connect_server", "connect_spark"})
"""The session fixtures below that start a JVM: a test using one is ``slow`` whether marked or not."""


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options every Spark driver the suite starts gets (``SPARK_SUBMIT_OPTS``, which
``spark-submit`` puts on the driver's command line: the servers', the session fixtures', the bench
runs'). C1 only: no C2 compiler threads competing for the 2 cores during a JVM's short test life;
a server reached ``listening on`` in 15-17 s instead of 19-24 s on the 2-core machine (alternated
starts of ``pipeline serve``). The serial collector: no G1 concurrent threads; a server's start to
its table side ready and a SIGTERM took 7.5-8.2 CPU seconds in its JVM instead of 8.4-10.1 (two
alternated starts each, idle machine; the suite's 2 cores are saturated while its JVMs run, so
CPU seconds are what it waits for). The code's semantics depend on neither; production starts
are not affected."""


_archive_maker: threading.Thread | None = None


def pytest_configure(config) -> None:
    """Append ``TEST_JVM_OPTIONS`` to ``SPARK_SUBMIT_OPTS`` for every process the run starts, and
    ``-XX:SharedArchiveFile`` of the drivers' class-data archive (``pipeline.persist.jvm_archive``:
    ``make test`` makes it after installing; this covers a plain ``pytest`` and the JVMs that
    ``build_spark_session`` does not start, e.g. the Connect server's).

    In the main process only (pytest-xdist's workers inherit its environment): the archive's
    path is set before it exists, and a missing archive is made in a thread beside the run.
    A JVM started before it is there starts without it (JDK 17 says nothing about a missing
    archive); every later one maps it: a server's Spark was ready in 8 s instead of 13 s.
    """
    global _archive_maker
    _no_hypothesis_plugins_in_children(config)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from pipeline.persist.jvm_archive import archive_path, ensure_archive

    options = TEST_JVM_OPTIONS
    try:
        options += f" -XX:SharedArchiveFile={archive_path()}"
        _archive_maker = threading.Thread(target=ensure_archive, name="jvm-archive", daemon=True)
        _archive_maker.start()
    except (OSError, subprocess.SubprocessError) as exc:  # no java: the Spark tests say so themselves
        warnings.warn(f"no JVM class-data archive: {exc}", stacklevel=1)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {options}".strip()


def _no_hypothesis_plugins_in_children(config) -> None:
    """Set ``HYPOTHESIS_NO_PLUGINS`` for the processes a test process starts, after loading them here.

    kio imports ``hypothesis.strategies`` when hypothesis is installed (``kio.static._phantom``), and
    hypothesis runs its entry-point plugins on import: trio's imports ``trio.testing`` and with it
    pytest. So every server and broker process the suite starts loaded trio's plugin and pytest
    (``/usr/bin/time python -c "import pipeline.server"``: 1.49 CPU s, 1.40 with the variable set),
    which an installation without the dev extras never does. The test processes keep their plugins
    (trio's makes its scheduling deterministic under hypothesis): a pytest-xdist worker, or the main
    process when it runs the tests itself (``-n 0``), imports hypothesis first and sets the variable
    after; the main process of a distributed run starts only the workers, which must load theirs, and
    leaves it unset.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "numprocesses", None):
        return
    import hypothesis  # noqa: F401 - its plugins load in this process now, before the variable is set

    os.environ["HYPOTHESIS_NO_PLUGINS"] = "1"


def pytest_unconfigure(config) -> None:
    """Wait for the archive's maker (bounded by its own timeout): no JVM outlives the run."""
    if _archive_maker is not None:
        _archive_maker.join()


SHARED_SERVER_MODULES = frozenset({
    "tests/e2e/test_admin.py",
    "tests/e2e/test_api_versions.py",
    "tests/e2e/test_compression.py",
    "tests/e2e/test_connections.py",
    "tests/e2e/test_groups.py",
    "tests/e2e/test_live_typed.py",
    "tests/e2e/test_producers.py",
    "tests/e2e/test_transaction_admin.py",
})
"""The modules whose tests use the session-scoped shared servers of tests/e2e/conftest.py
(``multiqueue_server``, ``baseline_server``; some through ``request.getfixturevalue``). Under
pytest-xdist they are one unit of work, run by one worker (``ModuleScheduling``), so each
shared server starts once per run, not once per worker. A module that uses a shared server by
fixture name but is not listed stops the collection (``pytest_collection_modifyitems``)."""

SHARED_SERVER_FIXTURES = frozenset({"multiqueue_server", "baseline_server"})

SHARED_SERVERS_UNIT = "shared-servers"
"""The unit of work of every module in ``SHARED_SERVER_MODULES``."""


def unit_of(module: str) -> str:
    """The pytest-xdist unit of work a test module belongs to (``ModuleScheduling``)."""
    return SHARED_SERVERS_UNIT if module in SHARED_SERVER_MODULES else module


LONGEST_UNITS = (
    "tests/e2e/test_durability.py",
    "tests/e2e/test_security.py",
    "tests/docs/test_docs.py",
    "tests/e2e/test_cluster_metadata.py",
    "tests/bench/test_bench_smoke.py",
    "tests/deploy/test_deploy.py",
    SHARED_SERVERS_UNIT,
    "tests/e2e/test_config_and_logs.py",
    "tests/e2e/test_metastore.py",
    "tests/e2e/test_spark_cluster.py",
    "tests/table/test_reader.py",
    "tests/table/test_catalog.py",
    "tests/e2e/test_transactions.py",
    "tests/bench/test_brokers_smoke.py",
    "tests/bench/test_hostile_smoke.py",
    "tests/e2e/test_table.py",
    "tests/e2e/test_metrics.py",
    "tests/bench/test_consume_smoke.py",
    "tests/bench/test_sustained_smoke.py",
    "tests/bench/test_freshness_smoke.py",
    "tests/e2e/test_live_view.py",
    "tests/e2e/test_hostile.py",
    "tests/bench/test_security_smoke.py",
    "tests/compat/test_matrix.py",
    "tests/e2e/test_metadata_postgres.py",
    "tests/compat/test_matrix_cluster.py",
)
"""The units of work that take longest (30-210 s each on the 2-core machine, summed from the
``--durations=0`` report of two full ``make test`` runs), longest first. Only a scheduling hint:
``make test`` runs the suite on ``TEST_WORKERS`` pytest-xdist workers (Makefile), one unit at a time
each (``ModuleScheduling``: a module, or every module of the shared servers), in the order of
``pytest_collection_modifyitems``, so starting the long ones first keeps one worker from running a
long module alone at the end (a unit missing here runs after all of these). A stale entry makes
the run slower, never wrong."""


def pytest_collection_modifyitems(config, items) -> None:
    """Fast tests first.

    Every test not marked ``slow`` runs before every ``slow`` one; among the slow ones the
    units of ``LONGEST_UNITS`` go first, in that order; otherwise the
    order is the collection order (a stable sort), so a failure in the unit tests shows in
    the first minutes of a run instead of after the Spark and server tests. Under
    pytest-xdist a unit of work (``ModuleScheduling``) goes to a worker at its first test in
    this order. A test that uses a JVM fixture (``JVM_FIXTURES``) is marked ``slow`` here if
    its module forgot to, so ``-m "not slow"`` never starts a JVM through them.

    Raises:
        pytest.UsageError: a module uses a shared server but is not in ``SHARED_SERVER_MODULES``.
    """
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if JVM_FIXTURES.intersection(fixtures) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        module = item.nodeid.split("::", 1)[0]
        if SHARED_SERVER_FIXTURES.intersection(fixtures) and module not in SHARED_SERVER_MODULES:
            raise pytest.UsageError(f"{module} uses a shared server: add it to SHARED_SERVER_MODULES "
                                    "in tests/conftest.py")
    rank = {unit: i for i, unit in enumerate(LONGEST_UNITS)}

    def key(item) -> tuple[bool, int]:
        if item.get_closest_marker("slow") is None:
            return False, 0
        return True, rank.get(unit_of(item.nodeid.split("::", 1)[0]), len(rank))

    items[:] = sorted(items, key=key)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``make test``), with the shared servers' modules as one unit.

    pytest-xdist's ``loadfile`` sends each module to one worker, so its module-scoped
    fixtures start once; here every module of ``SHARED_SERVER_MODULES`` is one unit too.
    (``--dist loadgroup`` with ``xdist_group`` marks would say the same, but its node-id
    suffix is ignored with pytest 9: every test became a unit of its own.) Other ``--dist``
    modes are xdist's own.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid.split("::", 1)[0])

    return ModuleScheduling(config, log)


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

    from pyspark.errors import PySparkRuntimeError

    conf = catalog_conf(tmp_path_factory.mktemp("spark-metastore"))
    try:
        session = build_spark_session("local[2]", app_name="pipeline-tests", conf=conf)
    except PySparkRuntimeError as exc:
        # Seen once in ~10 CI runs: the JVM exited during start-up while the other workers'
        # servers were starting theirs (its reason went to a capture nobody printed). One
        # more start, said out loud; a JVM that cannot start twice fails the test.
        if exc.getErrorClass() != "JAVA_GATEWAY_EXITED":
            raise
        warnings.warn(f"the Spark session's JVM exited during start-up, starting it once more: {exc}",
                      stacklevel=1)
        session = build_spark_session("local[2]", app_name="pipeline-tests", conf=conf)
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
