"""The persister's table side: Arrow conversion plus Spark, behind the GroupSink protocol.

Every method blocks (Spark jobs, CPU-bound decoding) and is called from a
worker thread by the persister or by start-up recovery, one call at a time
per method.

Decoding records (kafka.record, ~4-10 us per record in Python) runs in
separate processes by default (``DECODE_WORKERS``; a flush holding typed topics'
records is split between them, ``split_for_decoding``): in a thread it would hold the GIL in 5 ms slices
and slow the event loop serving requests, and it could not overlap with the
Spark write on another core. The persister's flushes send the worker the
appends' fields (one list per field, ``batch.to_columns``, which pickles ~4x
faster than the objects) and where each append's records are in the WAL; the
worker reads the record bytes from there (``to_table_from_wal``), so they are
not pickled. Recovery's replays send the bytes (``to_table``).

The worker also writes the records table's Parquet files (``pipeline.table.staging``,
Arrow's C++ writer) into this sink's staging directory, and only their names come
back; ``write`` commits them to the catalog (``TableCatalog.commit_staged``: the
partitions, then one rename per file). A Spark append of the same rows took 30-50x
more CPU (docs/benchmarks.md, "Table side"). Typed topics' rows are staged the same
way (``stage_typed``; committed by ``commit_staged_typed``, which falls back to a Spark
append when the table's columns are not the files'); dead letters come back as an
Arrow table (pickle's Arrow IPC buffers) and go through a Spark append.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import logging
import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from pipeline.process.lifecycle import worker_init
from pipeline.table.arrow import appends_to_table
from pipeline.log.batch import AppendColumns, PartitionAppend, to_columns
from pipeline.persist.spark_sink import SparkSink
from pipeline.table.catalog import (MaintenanceResult, SparkAppendNeeded, TableCatalog, end_offsets, local_path,
                                    present_offsets)
from pipeline.table.table_config import TableConfig
from pipeline.log.wal import WalSpan
from pipeline.table.live import LIVE_DIR, Boundary, merge_ends
from pipeline.table.schema import ARROW_SCHEMA
from pipeline.table.staging import STAGING_DIR, StagedRecords, Staging, arrow_codec, stage_flush
from pipeline.metadata.database import Target
from pipeline.metadata.topics import TopicStore
from pipeline.table.typed import (DEAD_LETTERS_TABLE, FlushTables, NoSchema, TopicFormat, build_flush, build_flush_from_columns,
                                  build_flush_from_wal)

log = logging.getLogger(__name__)


DECODE_WORKERS = 2
"""Decode worker processes of a server with typed topics. One decodes a flush while the Spark stage
commits the one before; a flush holding typed topics' records (``split_for_decoding``) is split
between them, since parsing its values costs ~8x what decoding the records does (docs/benchmarks.md,
"Typed Avro"). A server whose configuration has no typed topic and no schema registry starts one
(a raw flush is never split); see ``SparkGroupSink.decode_workers``."""
SPLIT_MIN_BYTES = 8 * 1024 * 1024
"""A flush with typed topics' records is split between the decode workers from this many record bytes on."""

LOCAL_RELATION_MAX_ROWS = 20_000
"""Flushes with fewer rows go to Spark as a LocalRelation (see ``write``)."""
LOCAL_RELATION_MAX_BYTES = 48 * 1024 * 1024
"""Spark's default ``spark.sql.execution.arrow.localRelationThreshold``."""


PARTITION_GENERATION_FILE = "partitions.generation"
"""``DATA_DIR/_pipeline/partitions.generation``: a token the brokers of a cluster change when they
have moved or dropped partitions of the shared tables (``SparkGroupSink._partitions_moved``); each
broker keeps the partition directories it cached for its commits while it stays the same."""

TABLE_LOCK_FILE = "table.lock"
"""``DATA_DIR/_pipeline/table.lock``: taken (flock) around every change to the tables by the
brokers of a cluster, which share one Spark and one table; ``table.lock.gate`` beside it orders
exclusive holds before new shared ones (``table_lock``)."""

LIVE_LOCK_FILE = "live.lock"
"""``DATA_DIR/_pipeline/live.lock``: taken (flock, exclusive) by a broker of a cluster while it
publishes the live view's boundary (``SparkGroupSink.publish_live``): publications exclude each
other, and nothing else waits for them."""


@contextlib.contextmanager
def table_lock(path: Path | None, shared: bool = False) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` (nothing if None), shared or exclusive, blocking until it is free.

    The brokers of a cluster append to the same tables through one Spark
    Connect server: one application, whose jobs share the table directory's
    ``_temporary`` staging directory (Hadoop FileOutputCommitter), which the
    first job to commit deletes under the others; a compaction swaps a
    partition's location and would lose files another broker added meanwhile.
    Those changes hold the lock exclusively (a compaction only to swap:
    ``TableCatalog.maintain``), and so does a table's creation or new columns. A
    commit of files (a metastore ``ADD IF NOT EXISTS PARTITION`` and one
    ``rename`` per file, into the partitions of topics the broker leads; staged
    files, or a Spark append's written into the broker run's own staging
    directory) conflicts with neither another such commit nor anything but
    those changes: it holds the lock shared, so the brokers' commits overlap
    (issue 34). The lock is the kernel's: a broker
    killed with it held releases it.

    Writer preference: Linux lets a new shared ``flock`` in while an exclusive
    one waits, so a stream of overlapping commits could starve compaction. Each
    hold therefore passes ``path.gate`` first: an exclusive hold keeps the gate
    (exclusively) while it waits for the lock and while it holds it; a shared
    hold takes the gate shared only while it takes the lock.
    """
    if path is None:
        yield
        return
    with open(f"{path}.gate", "a+") as gate, open(path, "a+") as f:
        fcntl.flock(gate, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        finally:
            if shared:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            if not shared:
                fcntl.flock(gate, fcntl.LOCK_UN)


def _staged_from_columns(columns: AppendColumns, formats: dict[str, TopicFormat], staging: Staging) -> FlushTables:
    """The decode worker's job for appends with their bytes: decode, split, stage the records."""
    return stage_flush(build_flush_from_columns(columns, formats), staging)


def _staged_from_wal(columns: AppendColumns, wal_directory: str, spans: Sequence[WalSpan],
                     formats: dict[str, TopicFormat], staging: Staging) -> FlushTables:
    """The decode worker's job for appends whose bytes are in the WAL: read, decode, split, stage."""
    return stage_flush(build_flush_from_wal(columns, wal_directory, spans, formats), staging)


def _stored_typed_topics(target: Target) -> bool:
    """Whether a topic of the topic store at ``target`` has a ``value.format`` other than raw (blocking, one read)."""
    store = TopicStore(target)
    try:
        return any(t.configs.get("value.format", "raw") != "raw" for t in store.load())
    finally:
        store.close()


def split_for_decoding(appends: Sequence[PartitionAppend], spans: Sequence[WalSpan], formats: dict[str, TopicFormat],
                       workers: int = DECODE_WORKERS) -> list[tuple[list[PartitionAppend], list[WalSpan]]]:
    """``appends`` (with their WAL ``spans``) in at most ``workers`` parts of about equal record bytes,
    cut between appends, to decode at once: one part unless some append is of a typed topic (in
    ``formats``) and the records weigh ``SPLIT_MIN_BYTES`` or more (a raw flush is cheap to decode,
    and one part keeps it one file per partition). Pure."""
    total = sum(span[2] for span in spans)
    if workers < 2 or total < SPLIT_MIN_BYTES or not any(a.topic in formats for a in appends):
        return [(list(appends), list(spans))]
    parts: list[tuple[list[PartitionAppend], list[WalSpan]]] = [([], [])]
    done, share = 0, total / workers
    for append, span in zip(appends, spans):
        if done >= share * len(parts) and len(parts) < workers:
            parts.append(([], []))
        parts[-1][0].append(append)
        parts[-1][1].append(span)
        done += span[2]
    return parts


def merge_flushes(flushes: Sequence[FlushTables]) -> FlushTables:
    """One flush of the parts ``split_for_decoding`` made, decoded and staged: their staged files
    together, their Arrow tables (dead letters, typed rows without staging) concatenated. Pure."""
    if len(flushes) == 1:
        return flushes[0]

    def together(tables: list) -> object:
        if all(isinstance(t, StagedRecords) for t in tables):
            return StagedRecords(tuple(f for t in tables for f in t.files))
        return pa.concat_tables(tables)

    topics = sorted({t for f in flushes for t in f.typed})
    return FlushTables(together([f.records for f in flushes]),
                       {t: together([f.typed[t] for f in flushes if t in f.typed]) for t in topics},
                       pa.concat_tables([f.dead_letters for f in flushes]))


def _discard(flush: FlushTables) -> None:
    """Remove a flush's staged files (its other part failed: the retry decodes it all again)."""
    for table in [flush.records, *flush.typed.values()]:
        if isinstance(table, StagedRecords):
            for f in table.files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f.path)


def _staging_name(state_dir: str) -> str:
    """A sink's staging directory name: its state directory's name for a cluster's broker
    (``broker-<node.id>``, ``pipeline.server.state_dir``), else a hash of the state directory's path."""
    base = os.path.basename(os.path.normpath(state_dir))
    if re.fullmatch(r"broker-\d+", base):
        return base
    return hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:16]


HOLD_WAIT_LOGGED_S = 1.0
"""A hold of the shared tables (``SparkGroupSink.hold_table``) that waited this long or longer for
the lock (other brokers' holds, this broker's other threads) is logged (INFO, with the waiting thread's
name): a commit's acknowledgement, a take-over, the maintenance wait that long. So is an exclusive
hold that lasted this long (s): every other broker's commits waited for it."""


class SparkGroupSink:
    """The table side of the persister: Arrow conversion + Spark, blocking (worker thread).

    Args:
        data_dir: table at ``data_dir/records``.
        master: Spark master URL (``local[*]``, ``spark://...``).
        remote: Spark Connect URL (``sc://...``); excludes ``master``.
        spark: an existing session to use (then ``stop`` leaves it running).
        decode_in_subprocess: decode records in a worker process (default) rather
            than in the calling thread.
        table_config, metastore_uris, connect_port, thrift_port: see ``SparkSink``.
        state_dir: this broker's own state directory (the warm-up write goes there);
            default ``DATA_DIR/_pipeline``.
        shared_table: the tables are shared with other processes (the brokers of a
            cluster): every change to them holds ``DATA_DIR/_pipeline/table.lock``
            (``table_lock``), or ``lock``.
        lock: with ``shared_table``: what every change to the tables holds instead of
            the ``flock`` (a context manager factory taking ``shared``, blocking; e.g.
            ``pipeline.metadata.locks.LeaseLock.hold``: a lock in the metadata database
            for brokers on several hosts).
        live_lock: with ``shared_table``: what a publication of the live view holds instead of the
            ``flock`` on ``LIVE_LOCK_FILE`` (a context manager factory, exclusive, blocking; with
            ``lock`` set and this None, the tables' lock exclusively).
        topic_store: the topic store (``pipeline.metadata.topics``; a SQLite file or a PostgreSQL
            URL) whose topic configs (``value.format``, ``value.schema``, ``value.wire.format``) override
            the configuration file's at the next flush; None: the configuration file's alone.
        decode_niceness: added to the decode worker process's nice value (``os.nice``):
            with acknowledgements at the WAL, decoding for the table can yield the CPU
            to the front end under load (the table lags a little more, within
            ``buffer.memory``); 0 leaves it as the server's.
    """

    def __init__(self, data_dir: str | os.PathLike, master: str | None = "local[*]", remote: str | None = None,
                 spark: SparkSession | None = None, decode_in_subprocess: bool = True,
                 table_config: TableConfig | None = None, metastore_uris: str | None = None,
                 connect_port: int | None = None, thrift_port: int | None = None,
                 state_dir: str | os.PathLike | None = None, shared_table: bool = False,
                 decode_niceness: int = 0,
                 lock: Callable[[bool], contextlib.AbstractContextManager[None]] | None = None,
                 live_lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
                 topic_store: Target | None = None) -> None:
        self._sink = SparkSink(data_dir, master=None if remote else master, remote=remote, spark=spark,
                               table_config=table_config, metastore_uris=metastore_uris,
                               connect_port=connect_port, thrift_port=thrift_port)
        self.data_dir = data_dir
        self._state_dir = os.fspath(state_dir) if state_dir is not None else os.path.join(
            self._sink.data_dir, "_pipeline")
        self._table_lock = Path(self._sink.data_dir) / "_pipeline" / TABLE_LOCK_FILE if shared_table else None
        if self._table_lock is not None:
            self._table_lock.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock if shared_table and lock is not None else None
        self._live_lock = live_lock if shared_table and live_lock is not None else None
        self._holding = threading.RLock()
        self._held: dict[int, bool] = {}  # thread id -> the mode of its outermost hold (``hold_table``)
        self._decode_in_subprocess = decode_in_subprocess
        config = table_config or TableConfig()
        typed = (config.schema_registry is not None or any(c.value_format for c in config.topics.values())
                 or (topic_store is not None and _stored_typed_topics(topic_store)))
        self.decode_workers = DECODE_WORKERS if typed else 1
        """Decode worker processes: ``DECODE_WORKERS`` when the server starts with typed topics (in the
        configuration file or the topic store's configs) or a schema registry, else 1. Fixed at start: a
        worker must be started from the main thread (``start_decoder``), so a topic made typed later
        (IncrementalAlterConfigs) on a server without a registry is decoded by the one worker, unsplit."""
        self._decode_niceness = decode_niceness
        self._pool: ProcessPoolExecutor | None = None
        self._formats: dict[str, TopicFormat] = {}
        self._flush_formats: dict[str, TopicFormat] | None = None
        """The typed topics' formats the last flush was decoded with (``_current_formats``)."""
        self._live_published: dict[str, str] = {}
        """Typed topic -> the boundary its live view was last published at (``_publish_live_typed``)."""
        self._topic_store_target = topic_store
        self._topic_store: TopicStore | None = None
        self._topics_version: int | None = None
        self._staging: Staging | None = None
        self.staging_name: str | None = None
        """This run's staging directory, relative to ``TABLE_DIR/_staging`` (after ``start``): what a
        commit in flight records with its pending ends, so another broker can fence it."""

    @contextlib.contextmanager
    def hold_table(self, shared: bool = False) -> Iterator[None]:
        """Hold the shared tables for a change (blocking): ``lock``, else the ``flock``
        (``table_lock``); nothing when the tables are this process's alone. ``shared``: a commit of
        staged files, which other brokers' commits may overlap (``commits_shared``); every other
        change holds them exclusively. Re-entrant within a thread (a commit's fencing check and its
        write hold it once, the write's own changes again; an inner hold has the outer one's mode).

        Raises:
            RuntimeError: an exclusive hold asked for inside a shared one (a bug: an upgrade
                could deadlock two brokers).
        """
        if self._table_lock is None and self._lock is None:
            yield
            return
        asked = time.monotonic()
        with self._holding:
            thread = threading.get_ident()
            outer = self._held.get(thread)  # this thread's hold: None, or its mode
            if outer is not None:
                if outer and not shared:
                    raise RuntimeError("an exclusive hold of the tables inside a shared one")
                yield
                return
            self._held[thread] = shared
            try:
                with self._lock(shared) if self._lock is not None else table_lock(self._table_lock, shared):
                    waited = time.monotonic() - asked
                    if waited >= HOLD_WAIT_LOGGED_S:
                        log.info("waited %.1f s to hold the tables %s (%s)", waited,
                                 "shared" if shared else "exclusively", threading.current_thread().name)
                    held = time.monotonic()
                    try:
                        yield
                    finally:
                        if not shared and time.monotonic() - held >= HOLD_WAIT_LOGGED_S:
                            log.info("held the tables exclusively for %.1f s (%s)", time.monotonic() - held,
                                     threading.current_thread().name)
            finally:
                del self._held[thread]

    @contextlib.contextmanager
    def _hold_live(self) -> Iterator[None]:
        """Hold the live view's lock (blocking): ``live_lock``, else the ``flock`` on
        ``LIVE_LOCK_FILE``; the tables' exclusively when only their lock is in the database (a
        sink built without ``live_lock``); nothing when the tables are this process's alone."""
        if self._live_lock is not None:
            with self._live_lock():
                yield
        elif self._lock is not None:
            with self.hold_table():
                yield
        else:
            with table_lock(self._table_lock.with_name(LIVE_LOCK_FILE) if self._table_lock is not None else None):
                yield

    def _holds_shared(self) -> bool:
        """Whether this thread holds the tables shared (``hold_table``)."""
        return bool(self._held.get(threading.get_ident()))

    def start(self) -> None:
        """Start Spark (blocking, ~8 s), warm its write path, start the decode worker.

        The first Parquet write of a JVM takes seconds (class loading, JIT);
        one throwaway row written to ``DATA_DIR/_pipeline/warmup`` here keeps
        that off the first produce request's latency.
        """
        self._sink.start_session()  # before any hold: other brokers' commits go on meanwhile
        with self.hold_table(shared=True):
            self._sink.start(ensure=False)
            settled = self._sink.catalog.settled()
        if not settled:
            with self.hold_table():  # creating the tables, settling a compaction cut short
                self._sink.catalog.ensure()
                self._partitions_moved()
        self._formats = self._sink.catalog.value_formats()
        self._sink.catalog.check_typed_tables(self._formats)
        self._staging = self._start_staging()
        if self._shared:  # other brokers may move partitions (compaction): cached while the generation holds
            self._sink.catalog.share_partitions(self._partition_generation)
        warmup = pa.table({"warmup": pa.array([1], pa.int32())})
        path = os.path.join(self._state_dir, "warmup")
        self._sink.spark.createDataFrame(warmup).write.mode("overwrite").parquet(path)
        if self._pool is None:
            self.start_decoder()
        if self._pool is not None:
            # import pyarrow, kafka, this module and Parquet's writer there now
            warming = [self._pool.submit(_staged_from_columns, to_columns([]), {}, self.staging)
                       for _ in range(self.decode_workers)]
            for future in warming:
                future.result()

    def _start_staging(self) -> Staging:
        """This run's staging directory: ``TABLE_DIR/_staging/<name>/<run>``, ``<name>``
        ``broker-<node.id>`` for a cluster's broker (its state directory's name), else a hash of the
        state directory, and ``<run>`` new for each start, so that fencing a dead run's commit
        (``fence_staging``) never touches the next run's. ``<name>`` is emptied first: whatever is
        there is left from a run that stopped before committing it (its records are in its WAL, or
        were never acknowledged), and a run of this broker still going (stalled, its lease gone)
        can then commit none of it."""
        name = _staging_name(self._state_dir)
        shutil.rmtree(self._staging_path(name), ignore_errors=True)
        self.staging_name = f"{name}/{uuid.uuid4().hex[:12]}"
        directory = self._staging_path(self.staging_name)
        os.makedirs(directory)
        codec = arrow_codec(self._sink.spark.conf.get("spark.sql.parquet.compression.codec", "snappy") or "snappy")
        self._sink.catalog.stage_spark_appends(directory)  # fenced with the staged files
        return Staging(directory, self._sink.catalog.config.day_topics, codec)

    def _staging_path(self, name: str) -> str:
        """``TABLE_DIR/_staging/<name>``."""
        table_dir = local_path(self._sink.catalog.table_dir)
        if table_dir is None:
            raise RuntimeError(f"the records table {self._sink.catalog.table_dir} is not on a local filesystem")
        return os.path.join(table_dir, STAGING_DIR, name)

    def fence_staging(self, staging_name: str) -> bool:
        """Fence a dead broker run's commit in flight (blocking; call it holding the tables' lock, once
        that run is no longer a live member): move its staging directory (``staging_name``, as its
        ``staging_name`` was) away (one ``rename``), delete it, and leave an empty file in its place.
        A commit publishes a file by renaming it from there into its partition, so each of that run's
        files is either in the table before this (and any read after finds it) or never: a zombie that
        wakes (SIGSTOP, a long GC pause) fails its next rename with ENOENT. The file in its place keeps
        a Spark job of that run still going on a shared Connect server (an append through
        ``TableCatalog.spark_staging``) from making the directory again: its writes fail, and so do
        its renames (ENOTDIR). Returns whether there was a directory to move.

        Raises:
            ValueError: ``staging_name`` is not a staging directory's name.
            OSError: the directory could not be moved (it is then still there).
        """
        if not re.fullmatch(r"[\w.-]+/[0-9a-f]+", staging_name):
            raise ValueError(f"not a staging directory's name: {staging_name!r}")
        directory = self._staging_path(staging_name)
        moved = False
        while not os.path.isfile(directory):  # fenced before
            fenced = f"{directory}.fenced-{uuid.uuid4().hex[:12]}"
            try:
                os.rename(directory, fenced)
                moved = True
                shutil.rmtree(fenced, ignore_errors=True)
            except FileNotFoundError:
                pass
            try:
                with open(directory, "x"):
                    break
            except FileExistsError:  # the run made it again in between (a Spark job's mkdirs): again
                continue
            except FileNotFoundError:  # no staging directory of that broker here at all
                break
        return moved

    @property
    def staging(self) -> Staging:
        """Where flushes' records are staged (after ``start``)."""
        if self._staging is None:
            raise RuntimeError("SparkGroupSink is not started")
        return self._staging

    def start_decoder(self) -> None:
        """Start the decode worker process (if ``decode_in_subprocess``), without waiting for it.

        Call it from the main thread: the worker is told to die with the thread that
        started it (``PR_SET_PDEATHSIG``, ``pipeline.process.lifecycle.die_with_parent``), and
        ``ProcessPoolExecutor`` starts its process in the thread of the first ``submit``,
        made here. ``start`` calls it when it was not called before.
        """
        if self._decode_in_subprocess and self._pool is None:
            # spawn, not fork: forking a process that runs a JVM gateway and
            # threads is unsafe. The worker dies with this process, however
            # it dies (kill -9 included), and so does the resource tracker.
            self._pool = ProcessPoolExecutor(self.decode_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=worker_init,
                                             initargs=(os.getpid(), self._decode_niceness))
            for _ in range(self.decode_workers):  # each submit starts a process while none is idle: all now, here
                self._pool.submit(appends_to_table, [])

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._staging is not None:  # flushes decoded but not committed: the WAL has their records
            shutil.rmtree(self._staging.directory, ignore_errors=True)
            self._staging = None
        if self._topic_store is not None:
            self._topic_store.close()
            self._topic_store = None
        self._sink.stop()

    def to_table(self, appends: Sequence[PartitionAppend]) -> FlushTables:
        """Decode every record of ``appends`` once, parse typed topics' values
        (``pipeline.table.typed.build_flush``), and stage the records table's rows as Parquet
        files (``pipeline.table.staging.stage_flush``); in the worker process if any.

        Returns:
            The flush: ``records`` and each typed topic's rows are ``StagedRecords``, the dead letters an Arrow table.

        Raises:
            ValueError, kafka.errors.CorruptRecordError: see ``appends_to_table``.
            OSError: a staged file could not be written.
        """
        formats = self._current_formats()
        if self._pool is None:
            return stage_flush(build_flush(appends, formats), self.staging)
        return self._pool.submit(_staged_from_columns, to_columns(appends), formats, self.staging).result()

    def to_table_from_wal(self, appends: Sequence[PartitionAppend], wal_directory: str,
                          spans: Sequence[WalSpan]) -> FlushTables:
        """``to_table`` for appends whose records stayed only in the WAL (``records`` is empty):
        append i's records are read back from ``spans[i]`` of ``wal_directory`` where they are
        decoded (the worker process if any), so record bytes are neither kept nor pickled by
        the server's process (``pipeline.table.typed.build_flush_from_wal``). A flush holding typed
        topics' records is decoded in parts by the workers at once (``split_for_decoding``,
        ``merge_flushes``); if a part fails, the others' staged files are removed and it raises.

        Raises:
            OSError: a span could not be read; see ``to_table`` otherwise.
        """
        formats = self._current_formats()
        if self._pool is None:
            return _staged_from_wal(to_columns(appends), wal_directory, spans, formats, self.staging)
        futures = [self._pool.submit(_staged_from_wal, to_columns(part), wal_directory, part_spans, formats,
                                     self.staging)
                   for part, part_spans in split_for_decoding(appends, spans, formats, self.decode_workers)]
        done, failure = [], None
        for future in futures:
            try:
                done.append(future.result())
            except Exception as exc:  # noqa: BLE001 - raised below, once every part is settled
                failure = failure or exc
        if failure is not None:
            for flush in done:
                _discard(flush)
            raise failure
        return merge_flushes(done)

    def _current_formats(self) -> dict[str, TopicFormat]:
        """The typed topics' formats for the flush being built: the registry topics' from their
        subjects' latest versions now (``TableCatalog.registry_format``), the others' as at start.

        Raises:
            pipeline.registry.lookup.RegistryUnavailable: a registry could not be asked (the
                flush is retried, as a failed write is).
        """
        catalog = self._sink.catalog
        self._apply_topic_configs()
        topics = catalog.registry_topics()
        formats = self._formats if not topics else {**self._formats, **{t: catalog.registry_format(t) for t in topics}}
        self._flush_formats = formats
        return formats

    def _apply_topic_configs(self) -> None:
        """Take the topic store's configs over the configuration file's (one read of its change
        version; the configs themselves only when it moved). A topic whose new settings are unusable,
        or do not match its existing table, gets ``NoSchema``: its records are dead letters until the
        settings are fixed, never raw, never lost.

        Raises:
            sqlite3.Error, psycopg.Error: the store could not be read (the flush is retried).
        """
        if self._topic_store_target is None:
            return
        if self._topic_store is None:
            self._topic_store = TopicStore(self._topic_store_target)
        version = self._topic_store.change_version()
        if version == self._topics_version:
            return
        catalog = self._sink.catalog
        if catalog.apply_topic_configs({t.name: t.configs for t in self._topic_store.load()}):
            formats = catalog.value_formats(strict=False)
            with self.hold_table(shared=True):  # a read: no broker changes a table meanwhile
                mismatches = catalog.typed_table_mismatches(formats)
            formats.update({t: NoSchema(reason) for t, reason in mismatches.items()})
            self._formats = formats
            log.info("topic configs changed: typed topics now %s",
                     ", ".join(f"{t} ({type(f).__name__ if isinstance(f, NoSchema) else f.kind})"
                               for t, f in sorted(formats.items())) or "none")
        self._topics_version = version

    def write(self, table: FlushTables, exclude: set[tuple[str, int, int]] | None = None) -> None:
        """Write the flush minus the (topic, partition, offset) rows in ``exclude``: its staged
        files committed (``TableCatalog.commit_staged``, ``commit_staged_typed``), one Spark append
        per other destination table with rows (``TableCatalog.write_flush``). Repeatable after a failure
        (files already committed are skipped; ``exclude`` then names their rows). Holds the tables
        shared when the flush changes no table (``commits_shared``, then ``shared_write_blocker``
        under the hold), else exclusively: a shared try that finds a change needed writes nothing
        and the flush is written again, exclusively.

        Raises:
            pipeline.table.catalog.SparkAppendNeeded: called inside a shared hold (``hold_table``),
                and the flush needs a table changed after all (nothing of it written).
            Whatever the catalog raises."""
        exclude = exclude or set()
        staged = {t: v for t, v in table.typed.items() if isinstance(v, StagedRecords)}
        arrow = {t: v for t, v in table.typed.items() if not isinstance(v, StagedRecords)}
        if isinstance(table.records, StagedRecords):
            rest = FlushTables(ARROW_SCHEMA.empty_table(), arrow, table.dead_letters).without(exclude)
            flush = FlushTables(table.records, {**rest.typed, **staged}, rest.dead_letters)
        else:
            rest = FlushTables(table.records, arrow, table.dead_letters).without(exclude)
            flush = FlushTables(rest.records, {**rest.typed, **staged}, rest.dead_letters)
        spark_rows = flush.num_rows - sum(t.num_rows for t in [flush.records, *staged.values()]
                                          if isinstance(t, StagedRecords))
        if spark_rows:
            # Small appends are faster as a LocalRelation planned on the driver
            # (measured 0.24 s vs 0.45 s median for 3,200 rows); large ones as
            # Arrow batches shipped to executors (~2x faster for 100k rows). Writes
            # are serialised, so setting the SQL conf per write is safe.
            threshold = "0" if spark_rows >= LOCAL_RELATION_MAX_ROWS else str(LOCAL_RELATION_MAX_BYTES)
            self._sink.spark.conf.set("spark.sql.execution.arrow.localRelationThreshold", threshold)
        if self._holds_shared():  # the caller's shared hold: it writes again, exclusively, if it must
            self._sink.catalog.write_flush(flush, exclude, spark_appends=False)
            return
        if self.commits_shared(flush):
            try:
                with self.hold_table(shared=True):
                    self._sink.catalog.write_flush(flush, exclude, spark_appends=False)
                return
            except SparkAppendNeeded as exc:  # raised before anything of the flush was written
                log.info("a commit holds the tables exclusively after all: %s", exc)
        with self.hold_table():
            self._sink.catalog.write_flush(flush, exclude)

    def commits_shared(self, table: FlushTables) -> bool:
        """Whether writing ``table`` may hold the tables shared with other brokers' commits
        (``hold_table(shared=True)``), as far as the catalog knows without asking Spark
        (``TableCatalog.may_write_shared``): it changes no table (the records table's rows are
        staged files; each typed topic's are known to fit its table, ``takes_staged``; a Spark
        append goes through this broker's staging directory). The write checks the rest under the
        hold (``TableCatalog.shared_write_blocker``). False for tables of this process alone
        (nothing to share).

        Raises:
            OSError: a staged file could not be read.
        """
        if self._table_lock is None and self._lock is None:
            return False
        return self._sink.catalog.may_write_shared(table)

    def publish_live(self, bootstrap_servers: str, ends: dict[tuple[str, int], int], closing: bool) -> None:
        """Publish the live view (``pipeline.table.live``) at this broker's prefix ends ``ends``
        (``BatchingPersister.prefix_ends``), merged with every other broker's: each writes its own,
        and whether it is stopping, to ``DATA_DIR/_pipeline/live/<its state directory's hash>.json``
        first (atomically), and the view takes the largest per partition (``merge_ends``). The view is
        ``stopped`` (no tail: the table holds everything) when every broker's file says it stopped
        cleanly (``closing``): the last broker of a cluster to stop publishes that, holding the
        live view's lock (``_hold_live``) so that two brokers stopping at once do not both miss it.
        Not the tables' lock: a boundary is made of ends already committed, so a publication
        conflicts with no commit, and with writer preference (``table_lock``) the brokers'
        publications, each at most every ``PUBLISH_INTERVAL_S``, would hold back every commit.

        Raises:
            OSError: this broker's file could not be written.
            Whatever Spark raises for the catalog calls.
        """
        directory = Path(self._sink.data_dir) / "_pipeline" / LIVE_DIR
        directory.mkdir(parents=True, exist_ok=True)
        own = directory / (hashlib.sha256(os.path.abspath(self._state_dir).encode()).hexdigest()[:16] + ".json")
        with self._hold_live():
            tmp = own.with_suffix(".tmp")
            tmp.write_text(json.dumps({"ends": [[t, p, o] for (t, p), o in sorted(ends.items())],
                                       "stopped": closing}))
            os.replace(tmp, own)
            every, stopped = [ends], closing
            for path in directory.glob("*.json"):
                if path != own:
                    try:
                        other = json.loads(path.read_text())
                        every.append({(str(t), int(p)): int(o) for t, p, o in other["ends"]})
                        stopped = stopped and bool(other["stopped"])
                    except (OSError, KeyError, ValueError, TypeError) as exc:  # not a file of this version
                        log.warning("live view: skipping %s: %s", path, exc)
            catalog = self._sink.catalog
            typed = frozenset(self._formats) | frozenset(catalog.registry_topics())
            merged = merge_ends(*every)
            catalog.publish_live(Boundary(merged, typed, catalog.config.day_topics, stopped=stopped,
                                          brokers=bootstrap_servers))
        # Outside the hold: another broker's commits need not wait for these catalog calls, and an
        # older boundary published after a newer one is still exact (below it all is in the table).
        if typed:
            self._publish_live_typed(merged, stopped, bootstrap_servers)

    def _publish_live_typed(self, ends: dict[tuple[str, int], int], stopped: bool, bootstrap_servers: str) -> None:
        """Each typed topic's live view, and the dead letters', at ``ends``
        (``TableCatalog.publish_live_typed``), with the formats the last flush decoded values with; each
        once its ends or its formats changed. A topic whose format is ``NoSchema`` (its records are
        dead letters) has no view of its own; one whose registry is a PostgreSQL metadata store (the
        view would carry its credentials; a registry URL does not) has none, and then neither has
        ``dead_letters``. A failure is logged and leaves the other views as they are."""
        from pipeline.metadata.database import is_postgres_url
        from pipeline.table.live import format_to_json
        from pipeline.table.values import ValueFormat

        catalog = self._sink.catalog
        try:  # the last flush's (so no registry call here); before the first, now's
            formats = self._flush_formats if self._flush_formats is not None else self._current_formats()
        except Exception as exc:  # noqa: BLE001 - a registry unreachable: the typed views wait
            log.warning("live view: typed topics' views not published: %s", str(exc).splitlines()[0] if str(exc) else exc)
            return
        carried: dict[str, dict[str, Any]] = {}
        for topic, fmt in sorted(formats.items()):
            if isinstance(fmt, ValueFormat) and fmt.registry is not None and is_postgres_url(fmt.registry):
                continue
            carried[topic] = format_to_json(fmt)
            if isinstance(fmt, ValueFormat) and fmt.registry is not None and "://" not in fmt.registry:
                # the SQLite store: Spark's workers may not share the server's working directory
                carried[topic]["registry"] = os.path.abspath(fmt.registry)
        day, views = catalog.config.day_topics, []
        for topic, value_format in carried.items():
            if isinstance(formats[topic], ValueFormat):  # a NoSchema topic's records are all dead letters
                views.append((topic, Boundary({k: o for k, o in ends.items() if k[0] == topic}, frozenset(), day,
                                              stopped=stopped, brokers=bootstrap_servers, topic=topic,
                                              value_format=value_format)))
        if len(carried) == len(formats):  # every typed topic's dead letters can be told apart in the tail
            views.append((DEAD_LETTERS_TABLE, Boundary(ends, frozenset(), day, stopped=stopped,
                                                       brokers=bootstrap_servers, dead_letter_formats=carried)))
        for name, boundary in views:
            text = boundary.encode()
            if self._live_published.get(name) == text:
                continue
            try:
                if catalog.publish_live_typed(boundary):
                    self._live_published[name] = text
            except Exception as exc:  # noqa: BLE001 - the records view and the table side go on
                log.warning("live view of %r not published: %s", name, str(exc).splitlines()[0] if str(exc) else exc)

    @property
    def catalog(self) -> TableCatalog:
        """The ``TableCatalog`` (after ``start``)."""
        return self._sink.catalog

    def present_offsets(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> set[tuple[str, int, int]]:
        """Rows already in the table within [start, end) of each (topic, partition)."""
        return present_offsets(self._sink.catalog.read_positions(), ranges)

    def end_offsets(self, topics: Collection[str] | None = None) -> dict[tuple[str, int], int]:
        """(topic, partition) -> max(offset) + 1 over the whole table, or over the rows of ``topics``."""
        return end_offsets(self._sink.catalog.read_positions(topics))

    def drop_topic(self, topic: str) -> int:
        """Remove every row of a deleted topic from the tables (``TableCatalog.drop_topic``);
        blocking, run it in a worker thread. Returns the partitions dropped."""
        with self.hold_table():
            self._partitions_moved()  # before the drops too: a broker that dies within them leaves no cache valid
            try:
                return self._sink.catalog.drop_topic(topic)
            finally:
                self._partitions_moved()

    def maintain(self) -> MaintenanceResult:
        """Table maintenance (retention, compaction, deleting replaced files): ``TableCatalog.maintain``,
        which holds the shared tables (``hold_table``) exclusively only to change the catalog and
        shared while it plans and while Spark writes compacted files, so other brokers' commits go on."""
        if not self._shared:
            return self._sink.catalog.maintain()
        return self._sink.catalog.maintain(hold=self.hold_table, moved=self._partitions_moved)

    @property
    def _shared(self) -> bool:
        return self._table_lock is not None or self._lock is not None

    def _generation_path(self) -> Path:
        return Path(self._sink.data_dir) / "_pipeline" / PARTITION_GENERATION_FILE

    def _partition_generation(self) -> str:
        """The tables' partition generation (``PARTITION_GENERATION_FILE``; "" before any change)."""
        try:
            return self._generation_path().read_text()
        except FileNotFoundError:
            return ""

    def _partitions_moved(self) -> None:
        """Holding the tables exclusively, after partitions may have moved or gone: a new partition
        generation, so every broker's next commit asks the catalog for its partitions' directories
        (``TableCatalog.share_partitions``). Nothing for tables of this process alone (its catalog
        forgets its own cache).

        Raises:
            OSError: the file could not be written.
        """
        if not self._shared:
            return
        path = self._generation_path()
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        tmp.write_text(uuid.uuid4().hex)
        os.replace(tmp, path)
