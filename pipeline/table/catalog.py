"""The catalog tables: writes, reads, compaction and retention through a Spark catalog.

Blocking (Spark jobs and metastore calls); the persister calls ``write`` and
``maintain`` from its Spark worker thread, one call at a time, so a
compaction never runs while a flush writes into the same partition.

The table (``pipeline.table.layout`` has the layout and why) is a Spark
datasource table ``USING parquet`` registered in the session's catalog: the
Hive metastore pyspark ships, embedded (Derby under ``DATA_DIR/_pipeline``)
unless ``hive.metastore.uris`` points at an external one. Its partitions
are tracked in the metastore: an insert registers new partitions after its
files are committed, a compaction swaps a partition's location in one
metastore call, retention drops partitions there. Directories a reader may
still be reading are deleted only ``file.delete.delay.ms`` later, from a
journal (``DATA_DIR/_pipeline/table-journal.json``) that survives a crash:
a compaction cut short before its swap leaves a directory nothing points at,
which the journal deletes at the next start; after its swap, the old one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from pipeline.table import live
from pipeline.table.schema import ARROW_SCHEMA, COLUMNS, SPARK_SCHEMA
from pipeline.table.staging import StagedFile, StagedRecords, without
from pipeline.table.typed import DEAD_LETTERS_TABLE, FlushTables, NoSchema, TopicFormat, typed_column_name
from pipeline.table.values import ValueFormat, registry_value_format
from pipeline.table.table_config import VALUE_FORMATS, TableConfig, with_topic_configs
from pipeline.table.layout import (
    PARTITION_COLUMNS,
    RECORDS_TABLE,
    TABLES_DIR,
    DataFile,
    add_time_partitions,
    compacted_location,
    partition_spec_sql,
    plan_compaction,
    table_name_for_topic,
)

log = logging.getLogger(__name__)

DATA_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c != "topic")
"""Columns stored in the Parquet files (the partition columns live in directory names)."""

TABLE_COLUMNS: tuple[str, ...] = (*DATA_COLUMNS, *PARTITION_COLUMNS)
"""The records table's columns in catalog order (Spark puts partition columns last)."""

DATA_SPARK_SCHEMA = StructType([f for f in SPARK_SCHEMA.fields if f.name != "topic"])
TABLE_SPARK_SCHEMA = StructType(
    [*DATA_SPARK_SCHEMA.fields, StructField("topic", StringType()), StructField("date", StringType()),
     StructField("hour", IntegerType())]
)

COALESCE_BELOW_ROWS = 20_000
"""A flush of fewer rows is written as one file per time partition (one task). Larger
flushes keep one task per Arrow batch of 100k rows (``spark.sql.execution.arrow.maxRecordsPerBatch``),
so both cores write: their files are large anyway."""

STATE_DIR = "_pipeline"
JOURNAL_FILE = "table-journal.json"
METASTORE_DIR = "metastore_db"


def catalog_conf(data_dir: str | os.PathLike[str], metastore_uris: str | None = None) -> dict[str, str]:
    """Spark confs that give a classic session the pipeline's catalog (static: set before the JVM starts).

    Args:
        data_dir: the data directory; the embedded metastore lives in
            ``DATA_DIR/_pipeline/metastore_db`` and managed tables (none of
            ours) under ``DATA_DIR/warehouse``.
        metastore_uris: an external Hive metastore (``thrift://host:9083``,
            Hive ``hive.metastore.uris``) instead of the embedded one.

    Returns:
        ``spark.sql.catalogImplementation=hive`` and where the metastore is,
        plus ``spark.sql.hive.filesourcePartitionFileCacheSize=0``: file
        listings are not cached between queries, so a reader sees the files a
        commit added since its last query (the cache is per session and
        nothing tells another session's cache that a commit happened).
    """
    root = Path(os.path.abspath(os.fspath(data_dir)))
    conf = {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.sql.hive.filesourcePartitionFileCacheSize": "0",
    }
    if metastore_uris:
        conf["spark.hadoop.hive.metastore.uris"] = metastore_uris
    else:
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={root / STATE_DIR / METASTORE_DIR};create=true")
        # derby.log goes beside the metastore instead of the working directory.
        conf["spark.driver.extraJavaOptions"] = f"-Dderby.stream.error.file={root / STATE_DIR / 'derby.log'}"
    return conf


@dataclass(frozen=True, slots=True)
class OwnedTable:
    """A catalog table this module writes and maintains.

    Attributes:
        name: ``database.table``.
        directory: absolute path of its files (``DATA_DIR/tables/<table>``).
        partition_columns: in directory order.
        topic: the one topic a typed topic's table holds (None: ``topic`` is a column).
    """

    name: str
    directory: str
    partition_columns: tuple[str, ...]
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class Partition:
    """One catalog partition: its column values (None: Hive's default partition) and location."""

    values: dict[str, object]
    location: str


class SparkAppendNeeded(RuntimeError):
    """A flush written under a shared hold of the tables needs a table created or changed
    (``write_flush``, ``shared_write_blocker``; nothing of it written): the caller writes it again
    holding them exclusively."""


class MaintenanceResult:
    """What one ``maintain`` call did."""

    compacted_partitions: int = 0
    files_before: int = 0
    files_after: int = 0
    dropped_partitions: int = 0
    deleted_directories: int = 0
    seconds: float = 0.0


class TableConfigError(ValueError):
    """A topic's table settings cannot work with the catalog as it is (names the topic)."""


class Journal:
    """Directories to delete, and compactions in progress, saved atomically as JSON.

    Entries: ``{"delete": path, "after_ms": wall-clock ms}`` and
    ``{"compacting": new_path, "replaces": old_path, "partition": values}``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.entries: list[dict] = json.loads(path.read_text())["entries"]
        except FileNotFoundError:
            self.entries = []

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"entries": self.entries}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def local_path(location: str) -> str | None:
    """The local filesystem path of a ``file:`` location (or a bare path); None for other schemes."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    if "://" in location:
        return None
    return location


def list_data_files(location: str) -> list[DataFile]:
    """Parquet data files directly under a partition location (not ``_``/``.`` names), sorted by path."""
    path = local_path(location)
    if path is None or not os.path.isdir(path):
        return []
    out = []
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_file() and not entry.name.startswith(("_", ".")):
                out.append(DataFile(entry.path, entry.stat().st_size))
    return sorted(out, key=lambda f: f.path)


@contextmanager
def _unlocked(shared: bool) -> Iterator[None]:
    """``TableCatalog.maintain``'s hold when the tables are one process's alone: nothing."""
    yield


@dataclass(frozen=True)
class _Compaction:
    """One partition ``TableCatalog.maintain`` compacts: its files as listed (``location``), merged
    into ``n`` files in ``new``."""

    owned: OwnedTable
    values: dict[str, object]
    location: str
    files: list[DataFile]
    n: int
    new: str

    def entry(self) -> dict[str, object]:
        """Its journal entry while it is under way (``resume_journal`` settles one a crash left), with
        the names of the files it merges: the others of ``location`` were committed after its listing."""
        return {"compacting": self.new, "replaces": self.location, "partition": self.values,
                "table": self.owned.name, "files": sorted(os.path.basename(f.path) for f in self.files)}


class TableCatalog:
    """The records table in a Spark catalog. See the module docstring.

    Args:
        spark: a session whose catalog is Hive (``catalog_conf``), classic or Connect.
        data_dir: the data directory; the table's files are under ``DATA_DIR/tables/records``.
        config: table settings.
    """

    def __init__(self, spark: SparkSession, data_dir: str | os.PathLike[str], config: TableConfig | None = None) -> None:
        self.spark = spark
        self.data_dir = Path(os.path.abspath(os.fspath(data_dir)))
        self.config = config or TableConfig()
        self.table_dir = str(self.data_dir / TABLES_DIR / RECORDS_TABLE)
        self.records_table = f"{self.config.database}.{RECORDS_TABLE}"
        self._journal_path = self.data_dir / STATE_DIR / JOURNAL_FILE
        self.records = OwnedTable(self.records_table, self.table_dir, PARTITION_COLUMNS)
        self.dead_letters = OwnedTable(f"{self.config.database}.{DEAD_LETTERS_TABLE}",
                                       str(self.data_dir / TABLES_DIR / DEAD_LETTERS_TABLE), ("topic", "date"))
        self.partition_directories: dict[tuple, str] | None = {}
        """Records-table partition (``StagedFile.partition``) -> its local directory, as
        ``commit_staged`` registered or found it. A catalog call costs ~0.2 s of JVM CPU; this
        process's own ``maintain`` and ``drop_topic`` empty the cache, and so does a change of
        ``share_partitions``' generation (another process moved partitions)."""
        self.spark_staging: str | None = None
        """A directory (this broker run's staging directory) Spark appends write their files into
        before they are committed as files (``_spark_staged``); None: they insert into the table."""
        self._generation: Callable[[], str] | None = None
        self._generation_seen: str | None = None
        self._typed_partition_directories: dict[str, dict[tuple, str]] = {}
        """Typed topic's table -> its ``partition_directories`` (not kept when that is None)."""
        self._file_columns: dict[tuple[str, str], bool] = {}
        """(typed table, staged files' Arrow schema) -> whether the files can be committed as they are
        (``_takes_files``); emptied by every Spark append to a typed table and by ``maintain``."""
        self._registry_formats: dict[str, tuple[tuple[int, str], TopicFormat]] = {}
        """Registry topic -> ((the latest schema id, its value.wire.format), its format) as ``registry_format``
        last built it."""
        self._table_columns: dict[str, list[tuple[str, str]]] = {}
        """Registry topic's table -> its data columns (name, Spark type), as ``_evolve`` last read or made them."""
        self._live_created = False
        """``publish_live`` made sure the live view and its tail's table exist."""
        self._live_typed: dict[str, str] = {}
        """Typed table -> the tail table's columns DDL made for it (``publish_live_typed``)."""
        self.static_config = self.config
        """The table settings of the server's configuration, before any topic config (``apply_topic_configs``)."""
        self.typed_tables: dict[str, OwnedTable] = {}
        """Typed topic -> its table: every topic typed now or earlier in this process (its table may hold rows)."""
        self._add_typed_tables()

    def _add_typed_tables(self) -> None:
        for topic, c in self.config.topics.items():
            if c.value_format is not None and topic not in self.typed_tables:
                name = table_name_for_topic(topic)
                self.typed_tables[topic] = OwnedTable(f"{self.config.database}.{name}",
                                                      str(self.data_dir / TABLES_DIR / name), ("date", "hour"), topic)

    def apply_topic_configs(self, configs: Mapping[str, Mapping[str, str]]) -> bool:
        """Take the topics' configs (topic -> its topic configs, as the topic store holds them) over the
        configuration file's table settings (``with_topic_configs``); whether the settings in effect changed."""
        config = with_topic_configs(self.static_config, configs)
        if config == self.config:
            return False
        self.config = config
        self._add_typed_tables()
        return True

    # -- set-up ------------------------------------------------------------------

    def settled(self) -> bool:
        """Whether ``ensure`` would change nothing: the session's catalog is Hive, the records table
        exists, and no compaction cut short waits to be settled (``resume_journal``). A read (one
        catalog call): a broker of a cluster asks it holding the shared tables shared, and holds
        them exclusively for ``ensure`` only when it is False, so that its start holds back no
        other broker's commits."""
        if self.spark.conf.get("spark.sql.catalogImplementation", "in-memory") != "hive":
            return False
        if any("compacting" in e for e in Journal(self._journal_path).entries):
            return False
        return bool(self.spark.catalog.tableExists(self.records_table))

    def ensure(self) -> None:
        """Create the database and the records table if missing (idempotent).

        Raises:
            RuntimeError: the session's catalog is not Hive (tables would vanish with it).
        """
        impl = self.spark.conf.get("spark.sql.catalogImplementation", "in-memory")
        if impl != "hive":
            raise RuntimeError(f"the Spark session's catalog is {impl!r}; the tables need a Hive metastore "
                               "(build the session with pipeline.table.catalog.catalog_conf)")
        db = self.config.database
        table_path = local_path(self.table_dir)
        if table_path is not None:  # (Spark warns about a missing directory, then creates it)
            os.makedirs(table_path, exist_ok=True)
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS `{db}`")
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in TABLE_SPARK_SCHEMA.fields)
        partitioned = ", ".join(f"`{c}`" for c in PARTITION_COLUMNS)
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS `{db}`.`{RECORDS_TABLE}` ({columns}) USING parquet "
            f"PARTITIONED BY ({partitioned}) LOCATION '{self.table_dir}' "
            "COMMENT 'Kafka records written by pipeline (Spark Kafka source schema)'"
        )
        self.resume_journal()

    # -- writes and reads --------------------------------------------------------

    def write(self, table: pa.Table) -> None:
        """Append records (``COLUMNS``) to the table in one Spark job: time partitions added, partitions registered.

        A flush below ``COALESCE_BELOW_ROWS`` rows is written as one file per
        time partition.

        Raises:
            ValueError: the table's columns are not ``COLUMNS`` in that order.
            Whatever Spark raises when the write fails; the caller retries.
        """
        if table.num_rows == 0:
            return
        if tuple(table.column_names) != COLUMNS:
            raise ValueError(f"table columns {table.column_names} are not the records columns {list(COLUMNS)}")
        table = add_time_partitions(table, self.config.day_topics).select(list(TABLE_COLUMNS))
        df = self.spark.createDataFrame(table, schema=TABLE_SPARK_SCHEMA)
        if table.num_rows < COALESCE_BELOW_ROWS:
            df = df.coalesce(1)
        df.write.insertInto(self.records_table)

    def publish_live(self, boundary: live.Boundary) -> None:
        """Publish the live view ``records_live`` at ``boundary`` (``pipeline.table.live.view_sql``:
        one catalog call). The first call of this catalog creates the tail's table and the view if
        missing (a JVM's first Python data source costs ~2 s: off the table side's start).

        Raises:
            Whatever Spark raises for the catalog calls.
        """
        db = self.config.database
        if not self._live_created:
            self.spark.sql(live.tail_table_sql(db))
            self.spark.sql(live.view_sql(db, boundary, create=True))
            self._live_created = True
        self.spark.sql(live.view_sql(db, boundary))

    def publish_live_typed(self, boundary: live.Boundary) -> bool:
        """Publish the live view of typed topic ``boundary.topic``'s table, or of ``dead_letters``
        (``boundary.dead_letter_formats``), ``<table>_live``, at ``boundary`` (its ends, and the
        format(s) its tail decodes values with). The tail's
        table, ``<table>_tail``, declares the typed table's columns: when they are not the table's
        any more (the topic's schema evolved, or first publication), the tail's table and the view
        are made again (two catalog calls each; a query in between does not find the view).
        Whether the view was published (False: the typed table does not exist yet: its first
        commit makes it).

        Raises:
            Whatever Spark raises for the catalog calls.
        """
        from pipeline.table.layout import table_name_for_topic

        db = self.config.database
        if boundary.dead_letter_formats is not None:
            table = DEAD_LETTERS_TABLE
        else:
            assert boundary.topic is not None
            table = table_name_for_topic(boundary.topic)
        if not self.spark.catalog.tableExists(f"{db}.{table}"):
            return False
        columns, ddl = live.typed_tail_columns(self.spark.table(f"`{db}`.`{table}`").schema)
        tail = f"{db}.{table}{live.TAIL_SUFFIX}"
        if self._live_typed.get(table) != ddl:
            if self.spark.catalog.tableExists(tail):
                _, existing = live.typed_tail_columns(self.spark.table(f"`{db}`.`{table}{live.TAIL_SUFFIX}`").schema)
                if existing != ddl:  # the table's columns changed: the tail's follow
                    self.spark.sql(f"DROP VIEW IF EXISTS `{db}`.`{table}{live.LIVE_SUFFIX}`")
                    self.spark.sql(f"DROP TABLE IF EXISTS `{db}`.`{table}{live.TAIL_SUFFIX}`")
            self.spark.sql(live.tail_table_sql(db, table, ddl))
            self.spark.sql(live.view_sql(db, boundary, create=True, table=table, columns=columns))
            self._live_typed[table] = ddl
        self.spark.sql(live.view_sql(db, boundary, table=table, columns=columns))
        return True

    def read(self) -> DataFrame:
        """The records table as a DataFrame with ``SPARK_SCHEMA`` (columns in ``COLUMNS`` order)."""
        return self.spark.table(self.records_table).select(*COLUMNS)

    def registry_topics(self) -> list[str]:
        """The typed topics whose schema is their registry subject's latest version (no ``value.schema``)."""
        return [t for t, c in self.config.topics.items()
                if c.value_format in VALUE_FORMATS and not c.value_schema and self.config.schema_registry is not None]

    def registry_format(self, topic: str) -> TopicFormat:
        """The format of registry topic ``topic`` now: its subject's (``<topic>-value``) latest version
        as the table's schema (each value still read with its own writer's schema), or ``NoSchema``
        (its records dead letters) while the subject has no usable version. Blocking: one registry
        read; the format is rebuilt only when the latest version changed.

        Raises:
            pipeline.registry.lookup.RegistryUnavailable: the registry could not be asked.
        """
        from pipeline.registry.lookup import lookup_for

        c = self.config.topic(topic)
        registry = self.config.schema_registry
        assert registry is not None
        subject = f"{topic}-value"
        latest = lookup_for(registry).latest(subject)
        if latest is None:
            return NoSchema(f"subject {subject!r} has no schema in the schema registry")
        schema_id, schema_type, text = latest
        assert c.value_format is not None
        if schema_type != VALUE_FORMATS[c.value_format]:
            return NoSchema(f"subject {subject!r}'s latest schema (id {schema_id}) is {schema_type}; "
                            f"the topic's value.format is {c.value_format}")
        cached = self._registry_formats.get(topic)
        if cached is not None and cached[0] == (schema_id, c.value_wire_format):
            return cached[1]
        fmt: TopicFormat
        # a Protobuf schema's imports: other subjects' versions (Avro's references are not read yet)
        references = lookup_for(registry).references(schema_id) if schema_type == "PROTOBUF" else ()
        try:
            fmt = registry_value_format(schema_type, text, c.value_wire_format, registry, references)
        except ValueError as exc:
            fmt = NoSchema(f"subject {subject!r}'s latest schema (id {schema_id}) cannot be a table: {exc}")
        self._registry_formats[topic] = ((schema_id, c.value_wire_format), fmt)
        return fmt

    def value_formats(self, strict: bool = True) -> dict[str, TopicFormat]:
        """topic -> format of every typed topic with a schema in the configuration (a json schema's
        DDL is parsed by Spark). Registry topics (``registry_topics``) are left out: their format is
        ``registry_format``'s at each flush.

        ``strict`` False (settings changed while serving): a topic whose format or schema is unusable
        gets ``NoSchema`` (its records dead letters, with the reason) instead of the error.

        Raises:
            TableConfigError: ``strict`` and a topic's format or schema is unusable (names the topic).
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        formats: dict[str, TopicFormat] = {}
        for topic, c in self.config.topics.items():
            if c.value_format is None:
                continue
            try:
                if c.value_format not in VALUE_FORMATS:
                    raise ValueError(f"value.format must be one of {', '.join(VALUE_FORMATS)}, "
                                     f"not {c.value_format!r}")
                if not c.value_schema:
                    if self.config.schema_registry is None:
                        raise ValueError(f"value.schema is required for {c.value_format} without a schema "
                                         "registry (schema.registry.listeners or schema.registry.url)")
                    continue  # registry_format, at each flush
                if c.value_format == "json":
                    struct = self.spark.createDataFrame([], c.value_schema).schema
                    formats[topic] = ValueFormat("json", to_arrow_schema(struct, timezone="UTC"),
                                                 wire_format=c.value_wire_format)
                elif c.value_format == "avro":
                    formats[topic] = ValueFormat.for_avro(c.value_schema, c.value_wire_format,
                                                          self.config.schema_registry)
                else:
                    raise ValueError(f"value.schema is not taken for {c.value_format}: its table follows "
                                     f"the registry subject {topic}-value")
            except Exception as exc:
                reason = f"topic {topic!r}: {str(exc).splitlines()[0]}"
                if strict:
                    raise TableConfigError(reason) from None
                formats[topic] = NoSchema(reason)
        return formats

    def check_typed_tables(self, formats: dict[str, TopicFormat]) -> None:
        """Refuse to start when a typed topic's existing table has other columns than its format gives.

        Every write to it would fail (``insertInto`` matches columns by
        position and type) and be retried forever; a schema change needs a
        new table (drop or rename the old one) or an ``ALTER TABLE`` first.

        Raises:
            TableConfigError: names the topic, the table and both column lists.
        """
        for reason in self.typed_table_mismatches(formats).values():
            raise TableConfigError(reason)

    def typed_table_mismatches(self, formats: dict[str, TopicFormat]) -> dict[str, str]:
        """topic -> why, for each typed topic (registry topics aside: their tables follow the registry)
        whose existing table has other columns than its format gives. Blocking (catalog calls)."""
        mismatches: dict[str, str] = {}
        registry_topics = set(self.registry_topics())
        for topic, fmt in formats.items():
            owned = self.typed_tables[topic]
            if topic in registry_topics or not isinstance(fmt, ValueFormat):
                continue  # the table's columns follow the registry (_evolve)
            if not self.spark.catalog.tableExists(owned.name):
                continue
            expected_schema = ARROW_SCHEMA
            for f in fmt.schema:
                expected_schema = expected_schema.append(pa.field(typed_column_name(f.name), f.type))
            expected = [(f.name, f.dataType.simpleString())
                        for f in self.spark.createDataFrame(expected_schema.empty_table()).schema.fields]
            actual = [(f.name, f.dataType.simpleString()) for f in self.spark.table(owned.name).schema.fields
                      if f.name not in owned.partition_columns]
            if actual != expected:
                mismatches[topic] = (
                    f"topic {topic!r}: table {owned.name} has columns {actual}, its value.format/value.schema "
                    f"give {expected}; drop or rename the table (or ALTER it) before changing the schema")
        return mismatches

    def write_flush(self, flush: FlushTables, exclude: set[tuple[str, int, int]] | None = None,
                    spark_appends: bool = True) -> None:
        """Write one flush: raw rows to the records table, typed rows to their topics' tables,
        dead letters to theirs; one Spark job per destination with rows.

        ``spark_appends=False``: the caller holds the tables shared with other brokers' commits
        (``pipeline.persist.group_sink.table_lock``), where no table may be created or changed and
        no Spark job may write into a table's directory. A flush that would (``shared_write_blocker``)
        raises ``SparkAppendNeeded`` before anything of it is written; a Spark append into an existing
        table through this broker's staging directory (``spark_staging``) goes on.

        ``flush.records`` and each of ``flush.typed`` is either an Arrow table (a Spark append,
        ``write``) or the flush's staged files (``pipeline.table.staging.StagedRecords``, committed
        by ``commit_staged`` / ``commit_staged_typed`` minus the rows in ``exclude``); ``exclude``
        applies to staged files only (an Arrow table's caller filters it first).

        Raises:
            Whatever Spark raises; rows already written before the failure are
            found by ``present_offsets`` and not written again by the retry.
        """
        if not spark_appends:
            blocker = self.shared_write_blocker(flush)
            if blocker is not None:
                raise SparkAppendNeeded(f"{blocker}: not under a shared hold of the tables")
        if isinstance(flush.records, StagedRecords):
            self.commit_staged(flush.records, exclude)
        else:
            self.write(flush.records)
        for topic, table in flush.typed.items():
            if isinstance(table, StagedRecords):
                self.commit_staged_typed(self.typed_tables[topic], table, exclude, spark_append=spark_appends)
            elif table.num_rows:
                self._write_owned(self.typed_tables[topic], table, may_change_table=spark_appends)
        if flush.dead_letters.num_rows:
            self._write_owned(self.dead_letters, flush.dead_letters, may_change_table=spark_appends)

    def commit_staged(self, staged: StagedRecords, exclude: set[tuple[str, int, int]] | None = None,
                      codec: str = "snappy") -> int:
        """Commit staged files to the records table: their partitions first, then the files.

        Order, and why: (1) every partition the files go to is registered
        (``ALTER TABLE ... ADD IF NOT EXISTS PARTITION``, one metastore call; its
        directory exists from then on, empty) and its location read from the
        catalog (a compacted partition lives elsewhere than its default path);
        (2) each file is renamed into its partition's directory, one atomic
        ``rename`` per file. A file is visible to readers, and to
        ``present_offsets``, from its rename on; a crash between two renames
        leaves whole files in and whole files out, and the retry, or recovery
        from the WAL, writes exactly the rows not yet in (``exclude``). A Spark
        append (``write``) registers new partitions after its files are in
        place, so a crash in between left files no query saw until a later
        write of the same partition registered it.

        Idempotent for files already moved by an earlier attempt (they are no
        longer in the staging directory and are skipped).

        Args:
            staged: the flush's staged files.
            exclude: (topic, partition, offset) rows the table already holds;
                a file holding any is rewritten without them first.
            codec: Arrow codec for a rewritten file.

        Returns:
            The files committed.

        Raises:
            OSError: a file could not be read, rewritten or moved.
            Whatever Spark raises for the catalog calls.
        """
        files = _present(staged, exclude, codec)
        if files:
            self._commit_files(self.records, files, self.partition_directories)
        return len(files)

    @staticmethod
    def spark_rows(flush: FlushTables) -> int:
        """The rows of ``flush`` that a Spark append writes (every table's but staged files')."""
        tables = [flush.records, *flush.typed.values(), flush.dead_letters]
        return sum(t.num_rows for t in tables if not isinstance(t, StagedRecords))

    def may_write_shared(self, flush: FlushTables) -> bool:
        """Whether ``flush`` may be written under a shared hold of the tables as far as this
        catalog knows without asking Spark (the caller's cheap guess before it takes the lock):
        its Spark appends, if any, go through ``spark_staging``, the records table takes files only,
        and each typed topic's staged files are known to fit its table (``takes_staged``).
        ``write_flush(spark_appends=False)`` checks the rest (``shared_write_blocker``).

        Raises:
            OSError: a staged file could not be read.
        """
        if not isinstance(flush.records, StagedRecords) and flush.records.num_rows:
            return False
        if self.spark_rows(flush) and self.spark_staging is None:
            return False
        return all(self.takes_staged(topic, t) for topic, t in flush.typed.items() if isinstance(t, StagedRecords))

    def shared_write_blocker(self, flush: FlushTables) -> str | None:
        """Why ``flush`` cannot be written under a shared hold of the tables, or None when it can.

        Other brokers' commits of files (``commit_staged``: partitions added, files renamed in)
        conflict with a change of a table (its creation, new columns: the metastore's schema and
        a typed topic's files checked against it) and with a Spark job writing into a table's
        directory (Hadoop FileOutputCommitter's ``_temporary`` there, deleted by the first job to
        commit), not with a Spark job writing into this broker's own staging directory
        (``_spark_staged``) and committed by renames. So a flush blocks when it has rows for the
        records table's Spark append, a Spark append without ``spark_staging``, rows for a table
        that does not exist yet or lacks some of their columns, or typed staged files that need
        an append (``commit_staged_typed``). Asks Spark's catalog (one call per table to append to).

        Raises:
            OSError: a staged file could not be read.
            Whatever Spark raises for the catalog calls.
        """
        if not isinstance(flush.records, StagedRecords) and flush.records.num_rows:
            return "rows for the records table's Spark append"
        appends = [(self.typed_tables[t], v) for t, v in flush.typed.items()
                   if not isinstance(v, StagedRecords) and v.num_rows]
        if flush.dead_letters.num_rows:
            appends.append((self.dead_letters, flush.dead_letters))
        if appends and self.spark_staging is None:
            return "a Spark append into a table's directory"
        for owned, table in appends:
            if not self.spark.catalog.tableExists(owned.name):
                return f"the first rows of {owned.name}"
            missing = self._columns_to_add(owned, self._append_rows(owned, table).column_names)
            if missing:
                return f"new columns of {owned.name} ({', '.join(missing)})"
        for topic, staged in flush.typed.items():
            if isinstance(staged, StagedRecords):
                files = [f for f in staged.files if os.path.exists(f.path)]  # as ``takes_staged``: no rewrite
                if files and not self._takes_files(self.typed_tables[topic], pq.read_schema(files[0].path),
                                                   files[0].path):
                    return f"staged rows of {self.typed_tables[topic].name} that need a Spark append"
        return None

    def _columns_to_add(self, owned: OwnedTable, names: Collection[str]) -> list[str]:
        """Which of ``names`` (an append's columns, partition columns among them) ``_evolve`` would add
        to ``owned``'s table: none but for a registry topic's table (others never change)."""
        if owned.topic is None or owned.topic not in self.registry_topics():
            return []
        known = {name for name, _ in self._known_columns(owned)}
        return [n for n in names if n not in known and n not in owned.partition_columns]

    def _known_columns(self, owned: OwnedTable) -> list[tuple[str, str]]:
        """``owned``'s data columns (name, Spark type), as ``_evolve`` last read or made them."""
        columns = self._table_columns.get(owned.name)
        if columns is None:
            columns = [(f.name, f.dataType.simpleString()) for f in self.spark.table(owned.name).schema.fields
                       if f.name not in owned.partition_columns]
            self._table_columns[owned.name] = columns
        return columns

    def _append_rows(self, owned: OwnedTable, table: pa.Table) -> pa.Table:
        """``table``'s rows as a Spark append to ``owned`` writes them: time partitions added (those
        ``owned`` is not partitioned by dropped), data columns first, then the partition columns."""
        table = add_time_partitions(table, self.config.day_topics)
        if "hour" not in owned.partition_columns:
            table = table.drop_columns(["hour"])
        data = [c for c in table.column_names if c not in owned.partition_columns]
        return table.select(data + list(owned.partition_columns))

    def takes_staged(self, topic: str, staged: StagedRecords) -> bool:
        """Whether ``commit_staged_typed`` is known to commit ``staged`` (typed topic ``topic``'s
        files) as files, without a Spark append: its table's columns were checked for their schema
        before (``_takes_files``' cache). False when unknown, or when they need an append.

        Raises:
            OSError: a staged file could not be read.
        """
        files = [f for f in staged.files if os.path.exists(f.path)]
        if not files:
            return True  # nothing left to commit
        schema = pq.read_schema(files[0].path)
        key = (self.typed_tables[topic].name, schema.to_string(show_field_metadata=False, show_schema_metadata=False))
        return self._file_columns.get(key) is True

    def commit_staged_typed(self, owned: OwnedTable, staged: StagedRecords,
                            exclude: set[tuple[str, int, int]] | None = None, codec: str = "snappy",
                            spark_append: bool = True) -> int:
        """Commit a typed topic's staged files (``pipeline.table.staging.stage_typed``) to its table
        ``owned`` as ``commit_staged`` does, when the table exists and its data columns are the
        files' (names and Spark types, in order: what a Spark append would have written). Otherwise
        (the table's first rows, a registry subject's new version adding or dropping a field, a
        column whose name or type differs) the files' rows are appended with Spark instead
        (``_write_owned``: it creates or evolves the table), and the files removed.

        Returns:
            The files committed (0 when Spark appended the rows).

        Raises:
            SparkAppendNeeded: the rows need a Spark append and ``spark_append`` is False (nothing
                written).
            OSError: a file could not be read, rewritten or moved.
            Whatever Spark raises for the catalog calls or the append.
        """
        files = _present(staged, exclude, codec)
        if not files:
            return 0
        schema = pq.read_schema(files[0].path)  # every file of a flush has the flush's columns
        if not self._takes_files(owned, schema, files[0].path):
            if not spark_append:
                raise SparkAppendNeeded(f"the staged rows of {owned.name} need a Spark append (new table or columns)")
            self._write_owned(owned, pa.concat_tables([pq.read_table(f.path) for f in files]))
            for f in files:
                os.unlink(f.path)
            return 0
        cache = None
        if self.partition_directories is not None:
            cache = self._typed_partition_directories.setdefault(owned.name, {})
        try:
            self._commit_files(owned, files, cache)
        except Exception:
            self._file_columns.clear()  # the table may have changed under us: ask the catalog again
            raise
        return len(files)

    def _takes_files(self, owned: OwnedTable, schema: pa.Schema, sample: str) -> bool:
        """Whether ``owned`` exists and its data columns are, in order, those a Spark append of
        rows of ``schema`` would give it (cached per table and schema until ``_write_owned``).
        ``sample``: a staged file of that schema, whose first row Spark types (Spark Connect cannot
        infer a schema from an empty table: CANNOT_INFER_EMPTY_SCHEMA)."""
        key = (owned.name, schema.to_string(show_field_metadata=False, show_schema_metadata=False))
        takes = self._file_columns.get(key)
        if takes is None:
            if not self.spark.catalog.tableExists(owned.name):
                return False
            first_row = pq.ParquetFile(sample).read_row_group(0).slice(0, 1)
            incoming = [(f.name, f.dataType.simpleString())
                        for f in self.spark.createDataFrame(first_row).schema.fields]
            actual = [(f.name, f.dataType.simpleString()) for f in self.spark.table(owned.name).schema.fields
                      if f.name not in owned.partition_columns]
            takes = self._file_columns[key] = incoming == actual
        return takes

    def _commit_files(self, owned: OwnedTable, files: list[StagedFile], cache: dict[tuple, str] | None) -> None:
        """Register the partitions of ``files`` in ``owned`` (one ``ALTER TABLE ... ADD IF NOT
        EXISTS``), then rename each file into its partition's directory (``commit_staged``).
        ``cache``: partition -> directory, read and filled (None: ask the catalog)."""
        if self._generation is not None:
            generation = self._generation()
            if generation != self._generation_seen:  # another process moved partitions: ask again
                self._forget_partition_directories()
                self._generation_seen = generation
        directories = dict(cache) if cache is not None else {}
        specs: dict[tuple, dict[str, object]] = {}
        for f in files:
            if f.partition not in directories:
                specs.setdefault(f.partition, dict(f.partition))
        if specs:
            self.spark.sql(f"ALTER TABLE {owned.name} ADD IF NOT EXISTS " + " ".join(
                f"PARTITION ({partition_spec_sql(v)})" for v in specs.values()))
        for key, values in specs.items():
            path = local_path(self.partition_location(values, owned))
            if path is None:
                raise OSError(f"partition {values} of {owned.name} is not on a local filesystem")
            os.makedirs(path, exist_ok=True)
            directories[key] = path
            if cache is not None:
                cache[key] = path
        for f in files:
            os.rename(f.path, os.path.join(directories[f.partition], os.path.basename(f.path)))

    def _write_owned(self, owned: OwnedTable, table: pa.Table, may_change_table: bool = True) -> None:
        """Append ``table``'s rows to ``owned`` (a typed topic's table, or the dead letters) with Spark,
        creating the table or adding its new columns first. With ``spark_staging`` set the rows are
        written there by Spark and committed as files (``_spark_staged``), else inserted directly.
        ``may_change_table=False`` (a shared hold of the tables, ``write_flush``): the table must
        exist and take the rows' columns as it is.

        Raises:
            SparkAppendNeeded: ``may_change_table`` is False and the table is missing or lacks a column
                (nothing written; ``shared_write_blocker`` says so before).
            FileNotFoundError: the staging directory is gone (another broker fenced this broker's run).
            Whatever Spark raises.
        """
        self._file_columns.clear()  # the append may create or change the table
        table = self._append_rows(owned, table)
        df = self.spark.createDataFrame(table)
        if table.num_rows < COALESCE_BELOW_ROWS:
            df = df.coalesce(1)
        if not self.spark.catalog.tableExists(owned.name):
            if not may_change_table:
                raise SparkAppendNeeded(f"the first rows of {owned.name}")
            if self.spark_staging is None:
                df.write.partitionBy(*owned.partition_columns).option("path", owned.directory).saveAsTable(owned.name)
                return
            # The table alone (no rows: no files); its rows go through the staging directory below.
            df.limit(0).write.partitionBy(*owned.partition_columns).option("path", owned.directory) \
                .saveAsTable(owned.name)
        elif owned.topic is not None and owned.topic in self.registry_topics():
            missing = [] if may_change_table else self._columns_to_add(owned, table.column_names)
            if missing:
                raise SparkAppendNeeded(f"new columns of {owned.name} ({', '.join(missing)})")
            try:
                df = self._evolve(owned, df)
            except Exception:
                self._table_columns.pop(owned.name, None)  # another broker may have changed it: read it again
                raise
        if self.spark_staging is None:
            df.write.insertInto(owned.name)
            return
        files, written = self._spark_staged(owned, df)
        try:
            self._commit_files(owned, files, self._typed_partition_directories.setdefault(owned.name, {}))
        finally:
            shutil.rmtree(written, ignore_errors=True)  # Spark's _SUCCESS and checksum files

    def _spark_staged(self, owned: OwnedTable, df: DataFrame) -> tuple[list[StagedFile], str]:
        """Write ``df`` (``owned``'s columns, partition columns last) with Spark into a new directory
        of ``spark_staging``, partitioned as ``owned``; returns its Parquet files (each with the
        partition its path names, Hive style: ``column=value``, percent-escaped) and the directory.

        Issue 34: a Spark append that a broker submitted to a shared Spark Connect server runs on
        there if the broker then stalls or dies. Written here, its files are published only by this
        broker's own ``rename`` into their partitions (``_commit_files``); another broker that
        fences this broker's run (``pipeline.persist.group_sink.SparkGroupSink.fence_staging``)
        leaves a file where the staging directory was, so the job's output can land nowhere the
        rename would take it from, and Spark cannot make the directory again under it.

        The job's directory is listed strictly (``_written_files``): a fence that lands after the job
        and before the listing took the job's files with it, and an empty listing taken for a
        commit of nothing would be acknowledged and recorded as done (``commit_done``) by a broker
        that wakes from a pause, for rows no table holds.

        Raises:
            FileNotFoundError: the staging directory is gone or fenced (before the job, or after it:
                the job's directory is gone).
            NotADirectoryError: fenced while the job's directory was listed.
            Whatever Spark raises.
        """
        assert self.spark_staging is not None  # checked by the caller
        if not os.path.isdir(self.spark_staging):
            raise FileNotFoundError(errno.ENOENT, "the staging directory is gone: another broker fenced this "
                                    "broker's run (it is no longer a member)", self.spark_staging)
        written = os.path.join(self.spark_staging, f"spark-{uuid.uuid4().hex[:12]}")
        df.write.partitionBy(*owned.partition_columns).parquet(written)
        return self._written_files(written), written

    @staticmethod
    def _written_files(written: str) -> list[StagedFile]:
        """The Parquet files a Spark job wrote into ``written`` (``_spark_staged``), each with the
        partition its path names.

        Raises:
            FileNotFoundError: ``written`` is not there (its run was fenced after the job).
            OSError: a directory under it could not be listed (fenced meanwhile).
        """
        if not os.path.isdir(written):
            raise FileNotFoundError(errno.ENOENT, "the Spark job's output is gone: another broker fenced this "
                                    "broker's run after the job (it is no longer a member)", written)

        def failed(exc: OSError) -> None:
            raise exc

        files = []
        for root, _dirs, names in os.walk(written, onerror=failed):
            relative = os.path.relpath(root, written)
            values: list[tuple[str, object]] = []
            for segment in ([] if relative == "." else relative.split(os.sep)):
                column, _, raw = segment.partition("=")
                text = urllib.parse.unquote(raw)
                values.append((column, None if text == "__HIVE_DEFAULT_PARTITION__" else
                               int(text) if column == "hour" else text))
            files += [StagedFile(os.path.join(root, name), tuple(values), 0, ())
                      for name in sorted(names) if name.endswith(".parquet") and not name.startswith(".")]
        return files

    def _evolve(self, owned: OwnedTable, df: DataFrame) -> DataFrame:
        """``df`` with the columns of ``owned``'s table, in its order: a column ``df`` has and the table
        lacks is added to the table first (``ALTER TABLE ... ADD COLUMNS``: the rows written before
        read null in it, Parquet files without the column); a column the table has and ``df`` lacks
        (a field a newer schema dropped) is null. A column of another type is cast by the insert,
        under Spark's store assignment rules (a widening passes; a narrowing that does not fit fails
        the write, which is retried).

        Raises:
            Whatever Spark raises for the catalog calls.
        """
        F = _functions(self.spark)
        columns = self._known_columns(owned)
        known = {name for name, _ in columns}
        incoming = [f for f in df.schema.fields if f.name not in owned.partition_columns]
        added = [(f.name, f.dataType.simpleString()) for f in incoming if f.name not in known]
        if added:
            spec = ", ".join(f"`{name}` {type_}" for name, type_ in added)
            self.spark.sql(f"ALTER TABLE {owned.name} ADD COLUMNS ({spec})")
            log.info("table %s: columns added for topic %r: %s", owned.name, owned.topic, spec)
            columns = self._table_columns[owned.name] = columns + added
        have = {f.name for f in incoming}
        return df.select(*[df[name] if name in have else F.lit(None).cast(type_).alias(name) for name, type_ in columns],
                         *[df[c] for c in owned.partition_columns])

    def tables(self, topics: Collection[str] | None = None) -> list[OwnedTable]:
        """The tables that exist: records, typed topics' tables, dead letters.

        Args:
            topics: only the tables that may hold rows of these topics (None: every table).
        """
        out = [self.records]
        for owned in [*self.typed_tables.values(), self.dead_letters]:
            if topics is not None and owned.topic is not None and owned.topic not in topics:
                continue
            if self.spark.catalog.tableExists(owned.name):
                out.append(owned)
        return out

    def read_positions(self, topics: Collection[str] | None = None) -> DataFrame:
        """(topic, partition, offset) of every row of every table (records, typed, dead letters).

        Args:
            topics: only the rows of these topics (None: every row); ``topic`` is the records
                table's first partition column, so the others' directories are not listed.
        """
        frames = []
        for owned in self.tables(topics):
            df = self.spark.table(owned.name)
            if owned.topic is not None:
                df = df.withColumn("topic", _functions(self.spark).lit(owned.topic))
            elif topics is not None:
                df = df.where(_functions(self.spark).col("topic").isin(sorted(topics)))
            frames.append(df.select("topic", "partition", "offset"))
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df)
        return out

    # -- partitions --------------------------------------------------------------

    def partition_values(self, owned: OwnedTable | None = None) -> list[dict[str, object]]:
        """Every partition's column values (``SHOW PARTITIONS``); None for Hive's default partition."""
        out = []
        for row in self.spark.sql(f"SHOW PARTITIONS {(owned or self.records).name}").collect():
            values: dict[str, object] = {}
            for part in row[0].split("/"):
                column, _, text = part.partition("=")
                if text == "__HIVE_DEFAULT_PARTITION__":
                    values[column] = None
                elif column == "hour":
                    values[column] = int(text)
                else:
                    values[column] = text
            out.append(values)
        return out

    def partition_location(self, values: dict[str, object], owned: OwnedTable | None = None) -> str:
        """The location the catalog gives one partition (``DESCRIBE FORMATTED ... PARTITION``)."""
        rows = self.spark.sql(
            f"DESCRIBE FORMATTED {(owned or self.records).name} PARTITION ({partition_spec_sql(values)})"
        ).collect()
        for row in rows:
            if row[0] == "Location":
                return row[1]
        raise LookupError(f"no location for partition {values}")

    def partitions(self, owned: OwnedTable | None = None) -> list[Partition]:
        return [Partition(v, self.partition_location(v, owned)) for v in self.partition_values(owned)]

    # -- deleting a topic ------------------------------------------------------------

    def drop_topic(self, topic: str, *, now_ms: int | None = None) -> int:
        """Remove every row of ``topic``: its partitions of the records table and of the dead
        letters, and its typed table if it has one (Kafka deletes a deleted topic's log).

        Blocking. The partitions' directories are journaled for deletion before the
        catalog forgets them (``ALTER TABLE ... DROP IF EXISTS PARTITION (topic=...)``,
        ``DROP TABLE``), then deleted at once, so a crash in between leaks no file
        (``maintain`` deletes what the journal lists). Idempotent: dropping a topic
        without rows does nothing. Returns the number of partitions dropped.

        Raises:
            ValueError: ``topic`` is not a legal Kafka topic name (it goes into SQL).
            Whatever Spark raises; the call can be repeated.
        """
        from pipeline.protocol.apis import validate_topic_name

        validate_topic_name(topic)
        self._forget_partition_directories()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        journal = Journal(self._journal_path)
        dropped = 0
        for owned in (self.records, self.dead_letters):
            if owned is not self.records and not self.spark.catalog.tableExists(owned.name):
                continue
            parts = [v for v in self.partition_values(owned) if v.get("topic") == topic]
            if not parts:
                continue
            journal.entries.extend({"delete": self.partition_location(v, owned), "after_ms": now_ms} for v in parts)
            journal.save()
            self.spark.sql(f"ALTER TABLE {owned.name} DROP IF EXISTS PARTITION (`topic`='{topic}')")
            dropped += len(parts)
            log.info("dropped %d partitions of topic %r from %s", len(parts), topic, owned.name)
        typed = self.typed_tables.get(topic)
        if typed is not None and self.spark.catalog.tableExists(typed.name):
            parts = self.partition_values(typed)
            journal.entries.extend({"delete": self.partition_location(v, typed), "after_ms": now_ms} for v in parts)
            journal.save()
            self.spark.sql(f"DROP TABLE IF EXISTS {typed.name}")
            dropped += len(parts)
            log.info("dropped table %s of topic %r", typed.name, topic)
        if typed is not None:
            path = local_path(typed.directory)
            if path is not None and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)  # a re-created topic's table starts empty
        self._delete_due(journal, now_ms)
        return dropped

    # -- maintenance --------------------------------------------------------------

    def maintain(self, *, time_budget_s: float = 30.0, now_ms: int | None = None,
                 hold: Callable[[bool], AbstractContextManager[None]] | None = None,
                 moved: Callable[[], None] | None = None) -> MaintenanceResult:
        """Retention, then compaction, then deletion of directories whose delay has passed.

        In phases, so that with tables shared by the brokers of a cluster the long part, Spark
        writing compacted files, overlaps their commits (issue 34):

        1. plan, holding the tables shared: partitions past retention; partitions to compact, with
           their files (``plan_compaction``); journal entries due for deletion.
        2. holding them exclusively: retention's drops (a new partition generation before and after
           them, as around the swaps of 4), and a ``compacting`` journal entry per
           planned compaction (its new directory is garbage if the process dies before 4).
        3. holding them shared, once per partition: each planned partition's listed files merged
           into its new directory; no new one after ``time_budget_s``. Other brokers commit
           meanwhile, and one waiting to hold them exclusively goes in between two partitions.
        4. holding them exclusively: a new partition generation (``moved``, before the first swap
           and again after the last, so that a broker dying in between leaves no broker's cached
           directory valid), then each new directory swapped in (``SET LOCATION``) after the
           files committed into the old one since the listing are hard-linked into it, so it
           holds every row the old one does; a compaction whose partition moved or went meanwhile
           (another broker dropped the topic), or whose journal entry is gone (a broker starting
           settled it, ``resume_journal``), is dropped. Then deletions whose delay passed.

        Args:
            time_budget_s: no new partition is compacted after this long (the
                one under way finishes); the rest waits for the next call.
            now_ms: wall-clock ms (default: now); partitions dates compare in UTC.
            hold: the tables' lock, ``hold(shared)`` blocking (``SparkGroupSink.hold_table``);
                None: the tables are this process's alone and its caller makes no commit
                meanwhile (the persister's writer slot; ``pipeline compact``).
            moved: called holding the tables exclusively after partitions moved or went
                (``SparkGroupSink._partitions_moved``).

        Raises:
            Whatever Spark raises; the journal keeps every directory it must
            delete, so a failed call loses nothing and leaks nothing.
        """
        started = time.monotonic()
        hold = hold or _unlocked
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        result = MaintenanceResult()
        expired: list[tuple[OwnedTable, dict[str, object]]] = []
        plans: list[_Compaction] = []
        with hold(True):  # 1
            for owned in self.tables():
                for v in self.partition_values(owned):
                    if self._expired(v, owned, now_ms):
                        expired.append((owned, v))
                        continue
                    location = self.partition_location(v, owned)
                    files = list_data_files(location)
                    n = plan_compaction(files, self.config.target_file_bytes, self.config.compaction_min_files)
                    if n is not None:
                        plans.append(_Compaction(owned, v, location, files, n,
                                                 compacted_location(owned.directory, v, now_ms)))
            due = any("delete" in e and e["after_ms"] <= now_ms for e in Journal(self._journal_path).entries)
        if expired or plans:
            with hold(False):  # 2
                self._forget_partition_directories()
                journal = Journal(self._journal_path)
                if expired and moved is not None:
                    moved()  # before the drops too (as before the swaps, phase 4)
                try:
                    for owned, v in expired:
                        location = self.partition_location(v, owned)
                        self.spark.sql(f"ALTER TABLE {owned.name} DROP IF EXISTS PARTITION ({partition_spec_sql(v)})")
                        journal.entries.append({"delete": location, "after_ms": now_ms + self.config.file_delete_delay_ms})
                        journal.save()
                        result.dropped_partitions += 1
                        log.info("retention: dropped %s partition %s", owned.name, v)
                finally:
                    if expired and moved is not None:
                        moved()
                journal.entries.extend(c.entry() for c in plans)
                journal.save()
        written: list[_Compaction] = []
        for c in plans:
            if time.monotonic() - started > time_budget_s:
                break
            with hold(True):  # 3, a hold per partition: an exclusive waiter (a take-over) goes in between
                schema = (DATA_SPARK_SCHEMA if c.owned is self.records else StructType(
                    [f for f in self.spark.table(c.owned.name).schema.fields
                     if f.name not in c.owned.partition_columns]))
                df = self.spark.read.schema(schema).parquet(*(f"file://{f.path}" for f in c.files))
                df.coalesce(c.n).sortWithinPartitions("partition", "offset").write.parquet(c.new)
                written.append(c)
        if plans or due or expired:  # retention's deletions may be due at once (file.delete.delay.ms 0)
            with hold(False):  # 4
                self._forget_partition_directories()
                journal = Journal(self._journal_path)
                swapping = False
                if moved is not None and any(c in written for c in plans):
                    # Before the first SET LOCATION too: a broker that dies (or is cut off, its hold
                    # lapsing) between a swap and the end of this phase must not leave the other
                    # brokers' caches of the partition's old directory valid (a commit renamed into
                    # the replaced directory after the swap is read by nobody).
                    moved()
                try:
                    for c in plans:
                        if c in written:
                            swapping = True
                        if c in written and self._swap(c, journal, now_ms):
                            result.compacted_partitions += 1
                            result.files_before += len(c.files)
                            result.files_after += c.n
                        elif c.entry() in journal.entries:  # not written, or dropped: its directory is garbage
                            journal.entries.remove(c.entry())
                            journal.entries.append({"delete": c.new, "after_ms": 0})
                            journal.save()
                finally:
                    if swapping and moved is not None:
                        moved()
                result.deleted_directories = self._delete_due(journal, now_ms)
        result.seconds = time.monotonic() - started
        return result

    def compact(self, *, now_ms: int | None = None) -> MaintenanceResult:
        """Compact every partition that needs it now, without a time budget (``pipeline compact``)."""
        return self.maintain(time_budget_s=float("inf"), now_ms=now_ms)

    def _expired(self, values: dict[str, object], owned: OwnedTable, now_ms: int) -> bool:
        topic = owned.topic if owned.topic is not None else values.get("topic")
        if topic is None:
            return False
        days = self.config.topic(str(topic)).retention_days
        date = values.get("date")
        if days is None or date is None:
            return False
        cutoff = time.strftime("%Y-%m-%d", time.gmtime(now_ms / 1000 - days * 86400))
        return str(date) < cutoff

    def _swap(self, c: _Compaction, journal: Journal, now_ms: int) -> bool:
        """Holding the tables exclusively: point ``c``'s partition at its written directory, after
        hard-linking into it the files committed into the old one since ``c`` listed it; False
        (nothing changed) when the partition moved or went meanwhile or ``c``'s journal entry is
        gone (``maintain``, phase 4).

        Raises:
            OSError: a file could not be linked (the partition still points at the old directory).
            Whatever Spark raises.
        """
        if c.entry() not in journal.entries:
            log.warning("compaction of %s %s dropped: its journal entry was settled meanwhile", c.owned.name, c.values)
            return False
        try:
            current = self.partition_location(c.values, c.owned)
        except Exception:  # noqa: BLE001 - the partition is gone (its topic was dropped)
            current = None
        if current is None or local_path(current) != local_path(c.location):
            log.info("compaction of %s %s dropped: the partition moved or went meanwhile", c.owned.name, c.values)
            return False
        newer = self._link_unmerged(c.location, c.new, {os.path.basename(f.path) for f in c.files})
        self.spark.sql(f"ALTER TABLE {c.owned.name} PARTITION ({partition_spec_sql(c.values)}) SET LOCATION '{c.new}'")
        journal.entries.remove(c.entry())
        journal.entries.append({"delete": c.location, "after_ms": now_ms + self.config.file_delete_delay_ms})
        journal.save()
        log.info("compacted %s: %d files (%d bytes) into %d%s", partition_spec_sql(c.values), len(c.files),
                 sum(f.size for f in c.files), c.n, f", and {newer} committed meanwhile linked" if newer else "")
        return True

    def stage_spark_appends(self, directory: str) -> None:
        """Spark appends (a typed table's rows that need one, the dead letters) write their files
        into ``directory`` (this broker run's staging directory) and are committed from there as
        staged files are (``_spark_staged``)."""
        self.spark_staging = directory

    def share_partitions(self, generation: Callable[[], str]) -> None:
        """Other processes share these tables and may move or drop a partition (their compaction,
        retention, a deleted topic). The partition directories cached for commits
        (``partition_directories``) are kept only while ``generation()`` returns the same token: it
        is read at each commit of files, which the caller makes holding the tables (shared), and a
        process that moves partitions changes it before it releases them (exclusive hold), so a
        commit never renames a file into a directory that is no longer its partition's. Issue 34:
        asking the catalog at every commit cost each broker of ``--brokers 3`` ~0.5 s per commit
        of Connect round trips."""
        self._generation = generation
        self._generation_seen = None

    def _forget_partition_directories(self) -> None:
        """Partitions are about to move or go: ``commit_staged`` asks the catalog again."""
        if self.partition_directories is not None:
            self.partition_directories.clear()
        for directories in self._typed_partition_directories.values():  # a commit may hold one
            directories.clear()
        self._typed_partition_directories.clear()
        self._file_columns.clear()

    def resume_journal(self) -> None:
        """Settle compactions a crash cut short: keep whichever directory the catalog points at. When
        that is the new one (the broker died after its swap), every file of the old directory that the
        compaction did not merge (its entry's ``files``) and the new one lacks is hard-linked into it
        first: a commit that landed there after the compaction's own links (its broker's hold of the
        tables lapsed: cut off, paused) is not lost with the old directory.

        Raises:
            OSError: a file could not be linked (the entry stays; the next start tries again).
        """
        journal = Journal(self._journal_path)
        changed = False
        for entry in [e for e in journal.entries if "compacting" in e]:
            owned = next((t for t in [self.records, self.dead_letters, *self.typed_tables.values()]
                          if t.name == entry.get("table", self.records.name)), self.records)
            try:
                current = local_path(self.partition_location(entry["partition"], owned))
            except Exception:  # the partition is gone (dropped): both directories are garbage
                current = None
            new, old = entry["compacting"], entry["replaces"]
            if current is not None and current == local_path(new) and os.path.isdir(current) and "files" in entry:
                linked = self._link_unmerged(old, new, set(entry["files"]))
                if linked:
                    log.warning("compaction of %s %s cut short after its swap: %d file(s) committed into the replaced "
                                "directory after its listing linked into the new one", owned.name,
                                entry["partition"], linked)
            journal.entries.remove(entry)
            garbage = old if current == local_path(new) else new
            journal.entries.append({"delete": garbage, "after_ms": 0 if garbage == new else
                                    int(time.time() * 1000) + self.config.file_delete_delay_ms})
            changed = True
        if changed:
            journal.save()

    @staticmethod
    def _link_unmerged(old: str, new: str, merged: set[str]) -> int:
        """Hard-link into ``new`` each data file of ``old`` that is not in ``merged`` (a compaction's
        input) and that ``new`` lacks: the files committed into ``old`` after the compaction listed
        it (``_swap``, ``resume_journal``). Returns how many.

        Raises:
            OSError: a file could not be linked.
        """
        target = local_path(new)
        if target is None:
            return 0  # not a local directory: nothing was listed either (``list_data_files``)
        have = set(os.listdir(target))
        linked = 0
        for f in list_data_files(old):
            name = os.path.basename(f.path)
            if name not in merged and name not in have:
                os.link(f.path, os.path.join(target, name))
                linked += 1
        return linked

    def _delete_due(self, journal: Journal, now_ms: int) -> int:
        due = [e for e in journal.entries if "delete" in e and e["after_ms"] <= now_ms]
        if not due:
            return 0
        tables_root = str(self.data_dir / TABLES_DIR) + os.sep
        for entry in due:
            path = local_path(entry["delete"])
            # Only ever inside a table directory (DATA_DIR/tables/<table>/...).
            if path is not None and path.startswith(tables_root) and os.sep in path[len(tables_root):] \
                    and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                # and the partition directories above it that are now empty
                table_dir = tables_root + path[len(tables_root):].split(os.sep, 1)[0]
                parent = os.path.dirname(path)
                while parent.startswith(table_dir + os.sep):
                    try:
                        os.rmdir(parent)
                    except OSError:  # not empty
                        break
                    parent = os.path.dirname(parent)
            journal.entries.remove(entry)
        journal.save()
        return len(due)

    def pending_deletions(self) -> list[str]:
        """Directories waiting for ``file.delete.delay.ms`` (tests, ``pipeline compact``)."""
        return [e["delete"] for e in Journal(self._journal_path).entries if "delete" in e]


def _present(staged: StagedRecords, exclude: set[tuple[str, int, int]] | None, codec: str) -> list[StagedFile]:
    """The files of ``staged`` still in the staging directory (an earlier attempt moved the
    others), each without the rows in ``exclude`` (``staging.without``).

    Raises:
        FileNotFoundError: a file is missing and so is the staging directory: another broker moved
            it away (``SparkGroupSink.fence_staging``), and what is missing may never have been
            committed.
    """
    files = [f for f in staged.files if os.path.exists(f.path)]
    if len(files) < len(staged.files):
        directory = os.path.dirname(staged.files[0].path)
        if not os.path.isdir(directory):
            raise FileNotFoundError(errno.ENOENT, "the staging directory is gone: another broker fenced this "
                                    "commit (its broker is no longer a member)", directory)
    if exclude:
        kept = (without(f, exclude, codec) for f in files)
        files = [f for f in kept if f is not None]
    return files


def read_uncompacted_files(spark: SparkSession, data_dir: str | os.PathLike[str]) -> DataFrame:
    """The records table read from its files, without a catalog (``COLUMNS`` order).

    For a reader that cannot reach the data directory's metastore (the
    benchmarks verify several data directories from one Spark session). It
    is exact only for a table that was never compacted: after a compaction
    the catalog, not the directory tree, says which files are current.

    Raises:
        RuntimeError: the table has been compacted (``_compacted`` exists).
    """
    root = Path(os.path.abspath(os.fspath(data_dir))) / TABLES_DIR / RECORDS_TABLE
    if (root / "_compacted").exists():
        raise RuntimeError(f"{root} has been compacted: read it through its catalog")
    if not root.is_dir():
        return spark.createDataFrame([], SPARK_SCHEMA)
    return spark.read.schema(TABLE_SPARK_SCHEMA).option("basePath", str(root)).parquet(str(root)).select(*COLUMNS)


def _functions(spark: SparkSession) -> ModuleType:
    """``pyspark.sql.functions`` for a classic session, its Connect twin for a Connect one.

    pyspark picks by the ``SPARK_CONNECT_MODE_ENABLED`` environment variable, which only
    ``SparkSession.builder.remote`` sets; ``build_spark_session`` builds its Connect session
    directly (and a process may hold sessions of both kinds), so ask the session.
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions as connect_functions
        return connect_functions
    from pyspark.sql import functions
    return functions


def present_offsets(df: DataFrame, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) rows of ``df`` within [start, end) of each (topic, partition)."""
    from functools import reduce

    if not ranges:
        return set()
    # The DataFrame's own columns, not pyspark.sql.functions.col: those are classic-only unless
    # the process built its Connect session through the builder (pipeline builds it directly).
    topic, partition, offset = df["topic"], df["partition"], df["offset"]
    conditions = [
        (topic == t) & (partition == p) & (offset >= lo) & (offset < hi)
        for (t, p), (lo, hi) in ranges.items()
    ]
    rows = df.where(reduce(lambda a, b: a | b, conditions)).select("topic", "partition", "offset").collect()
    return {(r[0], r[1], r[2]) for r in rows}


def end_offsets(df: DataFrame) -> dict[tuple[str, int], int]:
    """(topic, partition) -> max(offset) + 1 over ``df``."""
    rows = df.groupBy("topic", "partition").agg({"offset": "max"}).collect()
    return {(r[0], r[1]): r[2] + 1 for r in rows}
