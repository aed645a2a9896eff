"""The Spark side of the persister: the session, one table append per flush, and the read path.

The records go to the catalog table ``pipeline.records`` (``pipeline.table``:
files under ``DATA_DIR/tables/records``, partitioned by topic, date and hour,
with Spark's Kafka source schema, ``pipeline.table.schema``), registered
in the Hive metastore pyspark ships. A flush's Arrow table goes to Spark through
``createDataFrame(pa.Table)``, which ships Arrow record batches to the JVM
as they are (no per-row Python conversion; a list of tuples measured
1.5-2.5x slower for 100k rows).

Three ways to reach Spark, one code path: the embedded ``local[*]``, a
standalone cluster (``master="spark://HOST:PORT"``; this process is the
driver, executors run in the cluster's Workers) or a Spark Connect server
(``remote="sc://HOST:PORT"``; no JVM here, the Connect client sends the Arrow
table over gRPC and the server's driver writes it). In the last two, the
executors or the server must see ``data_dir`` at the same path: true on this
machine (``pipeline.persist.spark_cluster`` starts both), otherwise a shared
filesystem.

Everything here blocks (a Spark job); the persister calls ``SparkSink.write``
from a worker thread, one call at a time.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, TypedDict, cast

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from pipeline.persist.jvm_archive import existing_archive
from pipeline.persist.spark_cluster import python_workers_env
from pipeline.table import live
from pipeline.table.live import LIVE_SUFFIX
from pipeline.table.schema import COLUMNS
from pipeline.table.catalog import TableCatalog, catalog_conf
from pipeline.table.table_config import TableConfig
from pipeline.table.layout import DEFAULT_DATABASE, RECORDS_TABLE

# Defaults for every session we build; the caller's ``conf`` wins.
LOG4J2_PROPERTIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
"""Spark driver logging: WARN and up to stderr, no start-up banner."""

# pyspark checks the pandas version when Arrow is first used and warns about
# pandas >= 3 on every start, a warning users can do nothing about; the
# Arrow paths this project uses are covered by its tests with that pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)

_DEFAULT_CONF: dict[str, str] = {
    # We only ever run on loopback: keep the driver off other interfaces
    # (and away from a hostname that may not resolve) for any master.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Fail loudly rather than silently fall back to the slow row path.
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    # Our queries aggregate small tables; 200 shuffle partitions is 200 tasks.
    "spark.sql.shuffle.partitions": "4",
    # Kafka timestamps are UTC instants; render and extract them in UTC.
    "spark.sql.session.timeZone": "UTC",
    # Ship the flush's Arrow batches to the executors as they are instead of
    # turning them into rows on the driver (LocalRelation), in batches of up
    # to 100k rows (one task, one file per topic each): measured ~2x faster
    # writes of 100k rows than the defaults (48 MiB threshold, 10k-row batches).
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    # A topic named "123" is a string, never an int partition value.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # The live view's tail (pipeline.table.live): Spark's Python workers are this Python (pipeline
    # installed) and Python data sources take pushed filters (its boundary, topic/partition/offset).
    **live.SESSION_CONF,
    # Quiet start-up: warnings and errors only, no banner (log4j2.properties).
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}",
}


DEFAULT_MASTER = "local[*]"


def build_spark_session(
    master: str | None = None,
    app_name: str = "pipeline",
    conf: dict[str, str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Start (or join the running) Spark session, configured for the pipeline.

    Args:
        master: Spark master URL, ``local[N]``/``local[*]`` or ``spark://host:port``;
            default ``local[*]`` (unless ``remote`` is given).
        app_name: Spark application name.
        conf: extra Spark confs; they override the defaults above (driver bound
            to 127.0.0.1, UI and console progress off, Arrow on without
            fallback and without LocalRelation, 100k-row Arrow batches, 4
            shuffle partitions, UTC session time zone, partition type
            inference off). Sets ``SPARK_LOCAL_IP=127.0.0.1`` in the
            environment unless already set. A local driver also maps the
            class-data archive of ``pipeline.persist.jvm_archive`` when it has
            been made (~5 s less to start).
        remote: a Spark Connect URL, ``sc://host:port``, instead of a master:
            the session is a Connect client (no local JVM); only the
            ``spark.sql.*`` defaults above that Connect knows and ``conf`` are
            set, as session confs (``app_name`` and static confs belong to
            whoever started the server).

    Returns:
        The session, with the log level set to WARN. Blocks while the JVM starts
        (~8 s the first time in a process). With ``remote``, always a new
        Connect session (a default session left over from another server is
        not reused), which retries an unavailable server for ~17 s per call
        (``CONNECT_RETRY_POLICY``), then raises ``SparkConnectGrpcException``.

    Raises:
        ValueError: both ``master`` and ``remote`` are given.
        AnalysisException: ``conf`` sets a static conf through Connect.
        Whatever pyspark raises when the JVM cannot start or the master is
        unreachable (e.g. ``PySparkRuntimeError`` JAVA_GATEWAY_EXITED), or when
        the Connect client's dependencies (grpcio, grpcio-status,
        googleapis-common-protos, zstandard) are missing (``ImportError``).
    """
    if master is not None and remote is not None:
        raise ValueError(f"give a Spark master ({master!r}) or a Connect remote ({remote!r}), not both")
    if remote is not None:
        return _build_connect_session(remote, conf)
    # The JVM picks its local address before any conf is read; without this a
    # host whose name resolves to 127.0.0.1 makes it pick another interface.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master or DEFAULT_MASTER).appName(app_name)
    merged = {**_DEFAULT_CONF, **(conf or {})}
    os.environ.update(python_workers_env(os.environ))
    java_options = _DEFAULT_CONF["spark.driver.extraJavaOptions"]
    archive = existing_archive()
    if archive is not None:  # the classes of a past driver, mapped instead of loaded (jvm_archive)
        java_options += f" -XX:SharedArchiveFile={archive}"
    if conf and "spark.driver.extraJavaOptions" in conf:  # both sets of JVM options, ours first
        java_options += f" {conf['spark.driver.extraJavaOptions']}"
    merged["spark.driver.extraJavaOptions"] = java_options
    for key, value in merged.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _quiet_task_size_warning(spark)
    return spark


# How the Connect client retries an RPC the server did not take (UNAVAILABLE,
# e.g. the server is down): 5 retries, 50 ms x4 each time, ~17 s in all.
# pyspark's default (15 retries, up to 60 s apart) keeps one write blocked for
# 10+ minutes; the persister has its own retries and must hear of it sooner.
class RetryPolicy(TypedDict):
    """Arguments of pyspark's Connect ``DefaultPolicy`` (ms, except the multiplier)."""

    max_retries: int
    initial_backoff: int
    backoff_multiplier: float
    max_backoff: int


CONNECT_RETRY_POLICY: RetryPolicy = {
    "max_retries": 5,
    "initial_backoff": 50,
    "backoff_multiplier": 4.0,
    "max_backoff": 15_000,
}


def _build_connect_session(remote: str, conf: dict[str, str] | None) -> SparkSession:
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

    # Not the builder: its create() sends the confs before we could shorten the
    # retries, so an unreachable server would block it for 10+ minutes.
    spark = ConnectSparkSession(connection=remote)
    spark.client.set_retry_policies([DefaultPolicy(**CONNECT_RETRY_POLICY)])
    ConnectSparkSession._set_default_and_active_session(spark)  # as the builder does
    # Driver binding and the UI are the server's (static confs, set by whoever
    # starts it: ConnectServer does); the SQL confs are per session, except
    # the client-side Arrow switches Connect does not have (it always uses Arrow).
    session_conf = {
        k: v for k, v in _DEFAULT_CONF.items()
        if k.startswith("spark.sql.") and not k.startswith("spark.sql.execution.arrow.pyspark.")
    }
    for key, value in {**session_conf, **(conf or {})}.items():
        spark.conf.set(key, value)
    # A Connect session is not a subclass of the classic one, but stands for it (pyspark's own
    # SparkSession.builder.remote(...).getOrCreate() is typed as returning the classic class).
    return cast(SparkSession, spark)


def _jvm(spark: SparkSession) -> Any:
    """The py4j view of the JVM of ``spark``'s driver (a classic session).

    Raises:
        RuntimeError: its SparkContext is stopped (pyspark sets ``_jvm`` to None then).
    """
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext is stopped")
    return jvm


def _quiet_task_size_warning(spark: SparkSession) -> None:
    """Silence TaskSetManager's "task of very large size" WARN.

    Every write of a flush ships its rows inside the task (the data starts in
    the driver's memory), so the warning would fire on every flush of more than
    ~1 MiB and says nothing actionable here.
    """
    jvm = _jvm(spark)
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.scheduler.TaskSetManager", jvm.org.apache.logging.log4j.Level.ERROR
    )


class SparkSink:
    """Appends Arrow tables of records to the catalog table (``pipeline.table.catalog``).

    Attributes:
        data_dir: absolute data directory.
        catalog: the ``TableCatalog`` (after ``start()``).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        master: str | None = None,
        conf: dict[str, str] | None = None,
        spark: SparkSession | None = None,
        remote: str | None = None,
        table_config: TableConfig | None = None,
        metastore_uris: str | None = None,
        connect_port: int | None = None,
        thrift_port: int | None = None,
    ) -> None:
        """Remember where to write; nothing starts until ``start()``.

        Args:
            data_dir: data directory (tables under ``DATA_DIR/tables``, the
                embedded metastore under ``DATA_DIR/_pipeline``); made absolute
                here, so executors of a standalone cluster and a Connect server
                on this machine write where this process reads.
            master, conf, remote: passed to ``build_spark_session`` by
                ``start()``: ``master`` (default ``local[*]``) or ``remote``
                (``sc://host:port``, Spark Connect), not both. A classic
                session gets ``catalog_conf`` (the Hive catalog); a Connect
                server must have been started with a Hive catalog itself.
            spark: an existing session (classic or Connect, with a Hive
                catalog) to use instead; ``stop()`` leaves it running.
            table_config: table settings (database, target file size, per-topic settings).
            metastore_uris: an external Hive metastore instead of the embedded one.
            connect_port: serve Spark Connect from this session's driver on
                127.0.0.1:PORT (its SparkConnectPlugin), so other processes
                query the tables by name with ``SparkSession.builder.remote``;
                classic sessions only.
            thrift_port: start the Spark Thrift Server (HiveServer2 protocol,
                JDBC ``jdbc:hive2://127.0.0.1:PORT/``) on this session;
                classic sessions only.

        Raises:
            ValueError: both ``master`` and ``remote`` are given, or a port
                is given with ``remote``.
        """
        if master is not None and remote is not None:
            raise ValueError(f"give a Spark master ({master!r}) or a Connect remote ({remote!r}), not both")
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        self._master = master
        self._remote = remote
        self._conf = dict(conf or {})
        if remote is not None and (connect_port is not None or thrift_port is not None):
            raise ValueError("the Spark Connect and Thrift ports are served by a classic session, not through --spark-remote")
        if remote is None:
            self._conf = {**catalog_conf(self.data_dir, metastore_uris), **self._conf}
        if connect_port is not None:
            self._conf.update({
                "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(connect_port),
            })
        if thrift_port is not None:
            self._conf.update({
                "spark.hadoop.hive.server2.thrift.bind.host": "127.0.0.1",
                "spark.hadoop.hive.server2.thrift.port": str(thrift_port),
            })
        self._thrift_port = thrift_port
        self._thrift_server = None
        self._spark = spark
        self._owns_session = False
        self._table_config = table_config or TableConfig()
        self._catalog: TableCatalog | None = None

    @property
    def catalog(self) -> TableCatalog:
        """The ``TableCatalog``; raises ``RuntimeError`` before ``start()``."""
        if self._catalog is None:
            raise RuntimeError("SparkSink is not started")
        return self._catalog

    @property
    def spark(self) -> SparkSession:
        """The session; raises ``RuntimeError`` before ``start()`` (without a given session)."""
        if self._spark is None:
            raise RuntimeError("SparkSink is not started")
        return self._spark

    def start_session(self) -> SparkSession:
        """Build the Spark session unless there is one (given, or built before), and return it.
        Touches no table: a broker of a cluster builds it before it holds the shared tables (``start``).

        Blocking (~8 s; ~1 s for Connect).
        """
        if self._spark is None:
            self._spark = build_spark_session(self._master, conf=self._conf, remote=self._remote)
            self._owns_session = True
        return self._spark

    def start(self, ensure: bool = True) -> None:
        """Build the Spark session unless there is one (``start_session``), and create the table if
        missing (``TableCatalog.ensure``; ``ensure=False``: the caller does, if it must, ``settled``).

        Blocking (~8 s; ~1 s for Connect).

        Raises:
            RuntimeError: the session's catalog is not Hive.
        """
        spark = self.start_session()
        self._catalog = TableCatalog(spark, self.data_dir, self._table_config)
        if ensure:
            self._catalog.ensure()
        if self._thrift_port is not None and self._thrift_server is None:
            jvm = _jvm(spark)
            self._thrift_server = jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
                spark._jsparkSession.sqlContext())

    def write(self, table: pa.Table) -> None:
        """Append ``table`` to the records table: one Spark job (``TableCatalog.write``).

        Through Spark Connect the table travels as Arrow IPC: inline in the
        plan below ``spark.sql.session.localRelationCacheThreshold`` (64 MiB by
        default), else uploaded first in chunks as a cached artifact (4 MiB
        chunks), then written by one job; the server's driver holds it in memory.

        Args:
            table: rows with columns ``COLUMNS`` (as built by
                ``appends_to_table``); an empty table is a no-op.

        Raises:
            ValueError: the table's columns are not ``COLUMNS`` in that order.
            RuntimeError: the sink is not started.
            Whatever Spark raises when the write fails (e.g. ``Py4JJavaError``,
            ``AnalysisException``; through Connect ``SparkConnectGrpcException``
            and its subclasses); the caller decides whether to retry.
        """
        self.catalog.write(table)

    def stop(self) -> None:
        """Stop the Thrift server, and the session if ``start()`` created it; a given session keeps running."""
        if self._thrift_server is not None:
            self._thrift_server.stop()
            self._thrift_server = None
        if self._owns_session and self._spark is not None:
            self._spark.stop()
            self._spark = None
            self._owns_session = False


def read_records(spark: SparkSession, database: str = DEFAULT_DATABASE) -> DataFrame:
    """The records table, read by name through ``spark``'s catalog, with ``SPARK_SCHEMA`` (``COLUMNS`` order).

    Raises:
        AnalysisException: the session's catalog has no such table.
    """
    return spark.table(f"`{database}`.`{RECORDS_TABLE}`").select(*COLUMNS)


def run_sql(spark: SparkSession, query: str, database: str = DEFAULT_DATABASE,
            live: bool = False) -> tuple[list[str], list[tuple]]:
    """Run ``query`` with ``database`` as the current database (so ``records`` names the records table).
    ``live``: each table with a live view (``records_live``, a typed topic's ``<table>_live``:
    ``pipeline.table.live``, the table plus what is acknowledged and not committed yet) is named by
    its view instead, through a temporary view of the table's name; ``<database>.<table>`` still
    names the table.

    Returns:
        (column names, rows as tuples), all rows collected to the driver.
        TimestampType values come back as naive ``datetime`` in the Python
        process's local time zone (pyspark's collect convention).

    Raises:
        pyspark.errors.AnalysisException / ParseException for a bad query.
    """
    spark.catalog.setCurrentDatabase(database)
    shadowed: list[str] = []
    if live:
        names = {t.name for t in spark.catalog.listTables(database)}
        shadowed = sorted(n[:-len(LIVE_SUFFIX)] for n in names
                          if n.endswith(LIVE_SUFFIX) and n[:-len(LIVE_SUFFIX)] in names)
    for table in shadowed:
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{table}` AS SELECT * FROM `{database}`.`{table}{LIVE_SUFFIX}`")
    try:
        result = spark.sql(query)
        return list(result.columns), [tuple(row) for row in result.collect()]
    finally:
        for table in shadowed:
            spark.catalog.dropTempView(table)
