"""TableReader: records written through the persister's write path (PartitionAppend -> build_flush ->
TableCatalog.write_flush, as SparkGroupSink does) read back as RecordBatch v2 bytes and decoded
with kafka-python's ``MemoryRecords``, against a real Spark session and real Parquet files.

The encoding rules (KIP-74, LogAppendTime batches, codecs) are also checked without Spark on
Arrow rows shaped like a chunk query's result.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq
import pytest
from kafka.record import MemoryRecords
from kafka.record.memory_records import MemoryRecordsBuilder

from pipeline.log.batch import PartitionAppend
from pipeline.table.schema import ARROW_SCHEMA
from pipeline.table.catalog import TableCatalog
from pipeline.table.table_config import TableConfig, TopicTableConfig
from pipeline.table.reader import READ_COLUMNS, TableReader, TableSlice
from pipeline.table.typed import build_flush
from tests.conftest import unique_database

UTC = timezone.utc
T0 = int(datetime(2026, 11, 20, 10, tzinfo=UTC).timestamp() * 1000)  # ms


# -- helpers ---------------------------------------------------------------------------------

def produce_batch(records: list[tuple]) -> bytes:
    """A producer's RecordBatch v2 of (timestamp ms, key, value, headers) records (kafka-python)."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 24)
    for ts, key, value, headers in records:
        assert builder.append(ts, key, value, headers) is not None
    builder.close()
    return bytes(builder.buffer())


def append(topic: str, partition: int, base: int, records: list[tuple]) -> PartitionAppend:
    return PartitionAppend(topic, partition, base, produce_batch(records), len(records), log_append_time_ms=0)


def record(i: int) -> tuple:
    """The i-th test record: null keys every 5th, null values every 7th, headers every 3rd (one null)."""
    key = None if i % 5 == 0 else b"k%d" % i
    value = None if i % 7 == 0 else b"value-%d" % i * (1 + i % 4)
    headers = [("h", b"%d" % i), ("empty", None)] if i % 3 == 0 else []
    return (T0 + i * 1000, key, value, headers)


def decode(data: bytes) -> list[tuple]:
    """(offset, timestamp, timestamp type, key, value, headers) of every record, each batch's CRC checked."""
    out = []
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        assert batch.magic == 2 and batch.validate_crc()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)))
    return out


def expected(offsets, topic_records=record) -> list[tuple]:
    return [(o, *_fields(topic_records(o))) for o in offsets]


def _fields(rec: tuple) -> tuple:
    ts, key, value, headers = rec
    return (ts, 0, key, value, list(headers))


def read_all(reader: TableReader, topic: str, partition: int, start: int, end: int, max_bytes: int) -> list[tuple]:
    """Fetch like a consumer from ``start`` until a read returns nothing."""
    out, offset = [], start
    while True:
        s = reader.read(topic, partition, offset, max_bytes, end=end)
        if not s.record_count:
            return out
        assert s.size_bytes == len(s.records) <= max(max_bytes, s.size_bytes if s.record_count == 1 else 0)
        out += decode(s.records)
        offset = s.next_offset


# -- without Spark: the encoding ---------------------------------------------------------------

def chunk(rows: list[dict]) -> pa.Table:
    schema = pa.schema([ARROW_SCHEMA.field(c) for c in READ_COLUMNS])
    return pa.Table.from_pylist(rows, schema=schema)


def row(offset, ts_ms, ts_type=0, key=b"k", value=b"v", headers=None) -> dict:
    return {"offset": offset, "timestamp": datetime.fromtimestamp(ts_ms / 1000, UTC), "timestampType": ts_type,
            "key": key, "value": value, "headers": headers}


def encode(rows: list[dict], offset=0, max_bytes=1 << 20, max_records=None, min_one=True,
           compression="none") -> TableSlice:
    return TableReader(None, None, compression=compression)._encode(  # type: ignore[arg-type]
        chunk(rows), offset, max_bytes, max_records, min_one)


def test_batches_carry_original_offsets_timestamps_and_timestamp_types():
    rows = [row(3, T0, 0, None, b"a", [{"key": "h", "value": None}]),
            row(4, T0 - 500, 0, b"b", None),         # CreateTime may go backwards
            row(9, -1, 0),                           # Kafka's "no timestamp"
            row(10, T0 + 7000, 1), row(11, T0 + 7000, 1),   # one LogAppendTime append
            row(12, T0 + 9000, 1),                   # a later append: its own batch
            row(13, T0 + 10, 0)]
    s = encode(rows, offset=2)
    assert (s.next_offset, s.record_count, s.size_bytes) == (14, 7, len(s.records))
    assert decode(s.records) == [
        (3, T0, 0, None, b"a", [("h", None)]), (4, T0 - 500, 0, b"b", None, []), (9, -1, 0, b"k", b"v", []),
        (10, T0 + 7000, 1, b"k", b"v", []), (11, T0 + 7000, 1, b"k", b"v", []),
        (12, T0 + 9000, 1, b"k", b"v", []), (13, T0 + 10, 0, b"k", b"v", [])]
    batches = MemoryRecords(s.records)
    spans = []
    while (b := batches.next_batch()) is not None:
        spans.append((b.base_offset, b.last_offset, b.timestamp_type, b.max_timestamp))
    assert spans == [(3, 9, 0, T0), (10, 11, 1, T0 + 7000), (12, 12, 1, T0 + 9000), (13, 13, 0, T0 + 10)]


def test_max_bytes_min_one_record_and_max_records():
    rows = [row(i, T0 + i, value=b"x" * 100) for i in range(10)]
    whole = encode(rows)
    one = len(encode(rows[:1]).records)           # one record in its own batch
    assert one > 100
    # KIP-74: the first record is returned whole even when it exceeds max_bytes ...
    s = encode(rows, max_bytes=10)
    assert (s.record_count, s.next_offset, s.size_bytes) == (1, 1, one)
    # ... unless this is not the first partition of the response
    assert encode(rows, max_bytes=10, min_one=False) == TableSlice(b"", 0, 0, 0)
    # otherwise whole records within max_bytes, as many as fit
    for limit in (one, one + 50, 3 * one, len(whole.records) - 1):
        s = encode(rows, max_bytes=limit)
        assert s.size_bytes <= limit and 1 <= s.record_count < 10
        more = encode(rows[:s.record_count + 1])
        assert more.size_bytes > limit  # the next record would not have fit
        assert decode(s.records) == decode(more.records)[:-1]
    assert encode(rows, max_bytes=len(whole.records)).record_count == 10
    assert encode(rows, max_records=4).next_offset == 4
    assert encode([], offset=5) == TableSlice(b"", 5, 0, 0)


def test_compressed_batches_decode_the_same():
    rows = [row(i, T0 + i, value=b"same bytes " * 20) for i in range(50)]
    plain, gz = encode(rows), encode(rows, compression="gzip")
    assert gz.size_bytes < plain.size_bytes
    assert decode(gz.records) == decode(plain.records)
    assert MemoryRecords(gz.records).next_batch().compression_type == 1


def test_arguments_are_checked():
    reader = TableReader(None, None)  # type: ignore[arg-type]
    for bad in [dict(offset=-1, max_bytes=1), dict(offset=0, max_bytes=-1), dict(offset=0, max_bytes=1, max_records=0)]:
        with pytest.raises(ValueError):
            reader.read("t", 0, end=10, **bad)
    assert reader.read("t", 0, 10, 100, end=10) == TableSlice(b"", 10, 0, 0)  # nothing below end: no query
    with pytest.raises(ValueError, match="compression"):
        TableReader(None, None, compression="brotli")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TableReader(None, None, chunk_rows=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestamp_ms"):
        reader.offset_for_timestamp("t", 0, -1)


# -- with Spark ------------------------------------------------------------------------------

N = 300


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory):
    """One catalog: 'orders' partition 0 offsets 0..N-1 in 6 flushes spread over 2 hours, partition 1 a few;
    'gappy' with offsets missing; 'lat' with LogAppendTime rows; typed 'pay' with dead letters."""
    catalog = TableCatalog(spark, tmp_path_factory.mktemp("reader") / "data", TableConfig(
        database=unique_database(), target_file_bytes=1 << 20, compaction_min_files=3, file_delete_delay_ms=0,
        topics={"pay": TopicTableConfig(value_format="json", value_schema="id BIGINT")}))
    catalog.ensure()
    formats = catalog.value_formats()
    step = N // 6
    for f in range(6):
        # each flush: two produce requests of partition 0, one of partition 1
        lo = f * step
        appends = [append("orders", 0, lo, [record(i) for i in range(lo, lo + step // 2)]),
                   append("orders", 0, lo + step // 2, [record(i) for i in range(lo + step // 2, lo + step)]),
                   append("orders", 1, 10 * f, [record(1000 + i) for i in range(10)])]
        catalog.write_flush(build_flush(appends, formats))
    # 'gappy': 0..9 and 50..59 and 200..204 (as after retention dropped time partitions)
    catalog.write_flush(build_flush([append("gappy", 0, 0, [record(i) for i in range(10)]),
                                     append("gappy", 0, 50, [record(i) for i in range(50, 60)]),
                                     append("gappy", 0, 200, [record(i) for i in range(200, 205)])], formats))
    # 'lat': LogAppendTime rows as the persister stores them (the broker's time per append)
    lat = pa.Table.from_pylist([
        {"key": b"k%d" % i, "value": b"v", "topic": "lat", "partition": 0, "offset": i,
         "timestamp": datetime.fromtimestamp((T0 + (0 if i < 3 else 5000)) / 1000, UTC),
         "timestampType": 1, "headers": None} for i in range(5)], schema=ARROW_SCHEMA)
    catalog.write(lat)
    # typed 'pay': good, bad (dead letter), null value (tombstone: typed row)
    pay = [(T0 + i, b"p%d" % i, v, []) for i, v in enumerate(
        [b'{"id": 1}', b"{oops", None, b'{"id": 4}', b'"not an object"', b'{"id": 6}'])]
    flush = build_flush([append("pay", 0, 0, pay[:3]), append("pay", 0, 3, pay[3:])], formats)
    assert flush.dead_letters.num_rows == 2 and flush.typed["pay"].num_rows == 4
    catalog.write_flush(flush)
    return catalog, pay


@pytest.fixture(params=[True, False], ids=["files", "spark"])
def direct(request) -> bool:
    """Read the Parquet files directly (pyarrow), or through Spark queries (the path for non-local files)."""
    return request.param


def row_groups_holding(catalog: TableCatalog, topic: str, partition: int) -> int:
    """Row groups of the topic's files (as the catalog lists them) with rows of ``partition``."""
    files = catalog.spark.table(catalog.records.name).where(f"topic = '{topic}'").inputFiles()
    n = 0
    for uri in files:
        pf = pq.ParquetFile(uri.removeprefix("file:"))
        n += sum(pa.compute.any(pa.compute.equal(pf.read_row_group(g, columns=["partition"]).column(0),
                                                 partition)).as_py() for g in range(pf.num_row_groups))
    return n


@pytest.mark.slow
def test_a_consumer_reads_every_record_back_exactly(tables, direct):
    catalog, _ = tables
    reader = TableReader(catalog.spark, catalog, cold_chunk_rows=64, direct=direct)
    got = read_all(reader, "orders", 0, 0, N, max_bytes=1024)   # ~25 records a read
    assert got == expected(range(N))
    if direct:
        # one listing; each row group holding the partition decoded once; the other reads hit the cache
        assert reader.listings == 1 and reader.decoded == row_groups_holding(catalog, "orders", 0)
        assert reader.misses <= reader.decoded and reader.hits >= 8
    else:
        # one cold chunk of 64 rows, then one chunk sized by bytes holds the rest; the other reads hit the cache
        assert reader.misses == 2 and reader.hits >= 8
    assert read_all(reader, "orders", 1, 0, 60, 1 << 20) == expected(range(60), lambda o: record(1000 + o % 10))
    # from the middle, one big read
    s = reader.read("orders", 0, 123, 1 << 20, end=N)
    assert decode(s.records) == expected(range(123, N)) and s.next_offset == N
    assert 0 < reader.cached_bytes <= reader.cache_bytes


@pytest.mark.slow
def test_the_end_bound_and_offsets_beyond_the_table(tables, direct):
    catalog, _ = tables
    reader = TableReader(catalog.spark, catalog, direct=direct)
    s = reader.read("orders", 0, 10, 1 << 20, end=25)
    assert [r[0] for r in decode(s.records)] == list(range(10, 25)) and s.next_offset == 25
    cached = reader.read("orders", 0, 20, 1 << 20, end=22)         # from the cache, still bounded
    assert [r[0] for r in decode(cached.records)] == [20, 21] and reader.hits == 1
    assert reader.read("orders", 0, N, 1 << 20, end=N + 100) == TableSlice(b"", N + 100, 0, 0)  # nothing held below end
    assert reader.read("nosuch", 0, 0, 1 << 20, end=100) == TableSlice(b"", 100, 0, 0)


@pytest.mark.slow
def test_gaps_are_skipped(tables, direct):
    catalog, _ = tables
    reader = TableReader(catalog.spark, catalog, cold_chunk_rows=4, direct=direct)  # chunks smaller than the gaps
    got = read_all(reader, "gappy", 0, 0, 1000, 1 << 20)
    offsets = [*range(10), *range(50, 60), *range(200, 205)]
    assert got == expected(offsets)
    s = reader.read("gappy", 0, 12, 1 << 20, end=1000)
    assert decode(s.records)[0][0] == 50
    assert reader.read("gappy", 0, 12, 1 << 20, end=50).record_count == 0  # nothing in [12, 50)
    assert reader.read("gappy", 0, 205, 1 << 20, end=1000) == TableSlice(b"", 1000, 0, 0)


@pytest.mark.slow
def test_log_append_time_records(tables, direct):
    catalog, _ = tables
    s = TableReader(catalog.spark, catalog, direct=direct).read("lat", 0, 0, 1 << 20, end=5)
    assert [(o, ts, t) for o, ts, t, *_ in decode(s.records)] == [
        (0, T0, 1), (1, T0, 1), (2, T0, 1), (3, T0 + 5000, 1), (4, T0 + 5000, 1)]


@pytest.mark.slow
def test_a_typed_topic_is_served_from_its_table_and_its_dead_letters(tables, direct):
    catalog, pay = tables
    reader = TableReader(catalog.spark, catalog, direct=direct)
    s = reader.read("pay", 0, 0, 1 << 20, end=100)
    assert decode(s.records) == [(i, *_fields(r)) for i, r in enumerate(pay)]
    assert s.next_offset == 6
    assert reader.earliest_offset("pay", 0) == 0
    assert reader.offset_for_timestamp("pay", 0, T0 + 1) == (1, T0 + 1)    # a dead letter
    assert reader.max_timestamp("pay", 0) == (5, T0 + 5)


@pytest.mark.slow
def test_list_offsets(tables):
    catalog, _ = tables
    reader = TableReader(catalog.spark, catalog)
    assert reader.earliest_offset("orders", 0) == 0
    assert reader.earliest_offset("nosuch", 0) is None
    assert reader.offset_for_timestamp("orders", 0, T0) == (0, T0)
    assert reader.offset_for_timestamp("orders", 0, T0 + 1) == (1, T0 + 1000)       # the next one
    assert reader.offset_for_timestamp("orders", 0, T0 + 150_500) == (151, T0 + 151_000)  # hour 10 -> 10, 11
    assert reader.offset_for_timestamp("orders", 0, T0 + (N - 1) * 1000) == (N - 1, T0 + (N - 1) * 1000)
    assert reader.offset_for_timestamp("orders", 0, T0 + N * 1000) is None
    assert reader.offset_for_timestamp("orders", 0, T0 + 100_000, end=100) is None
    assert reader.max_timestamp("orders", 0) == (N - 1, T0 + (N - 1) * 1000)
    assert reader.max_timestamp("orders", 0, end=10) == (9, T0 + 9000)
    assert reader.max_timestamp("lat", 0) == (3, T0 + 5000)                        # the first on a tie
    assert reader.earliest_offset("gappy", 0) == 0
    assert reader.offset_for_timestamp("gappy", 0, T0 + 11_000) == (50, T0 + 50_000)


@pytest.mark.slow
def test_concurrent_reads_and_a_small_cache(tables, direct):
    catalog, _ = tables
    reader = TableReader(catalog.spark, catalog, cold_chunk_rows=50, cache_bytes=20_000, direct=direct)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def consume(partition: int) -> None:
        try:
            results[partition] = read_all(reader, "orders", partition, 0, N if partition == 0 else 60, 2048)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(p,)) for p in (0, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert results[0] == expected(range(N))
    assert results[1] == expected(range(60), lambda o: record(1000 + o % 10))
    assert reader.cached_bytes <= 20_000


@pytest.mark.slow
def test_files_listed_before_a_commit_or_a_compaction(spark, tmp_path):
    """A reader's cached listing of the data files misses what a later commit added, and still names
    files a compaction replaced: neither shows in what it serves."""
    catalog = TableCatalog(spark, tmp_path / "data", TableConfig(
        database=unique_database(), target_file_bytes=1 << 20, compaction_min_files=3, file_delete_delay_ms=0))
    catalog.ensure()

    def commit(lo: int, hi: int) -> None:
        catalog.write_flush(build_flush([append("orders", 0, lo, [record(i) for i in range(lo, hi)])], {}))

    commit(0, 40)
    reader = TableReader(spark, catalog, warm=True)
    reader.warming.join(120)
    assert decode(reader.read("orders", 0, 0, 1 << 20, end=40).records) == expected(range(40))
    commit(40, 80)
    commit(80, 120)   # the cached listing holds neither
    assert read_all(reader, "orders", 0, 30, 120, 1 << 20) == expected(range(30, 120))
    assert reader.listings == 1   # the warm-up's listing, then one when the next commit's offsets were asked for
    commit(120, 160)
    # a read that starts in the listed files and goes on into the new ones sees no gap
    assert read_all(reader, "orders", 0, 100, 160, 1 << 20) == expected(range(100, 160))
    result = catalog.compact()   # new files; with file.delete.delay.ms 0 the listed ones are deleted
    assert result.compacted_partitions >= 1 and result.deleted_directories >= 1
    assert read_all(reader, "orders", 0, 0, 160, 1 << 20) == expected(range(160))
    fresh = TableReader(spark, catalog, cache_bytes=0)   # no decoded row group kept: every read opens files
    fresh.read("orders", 0, 0, 10, end=160)  # lists the compacted files
    catalog.write_flush(build_flush([append("orders", 0, 160, [record(160)])], {}))
    catalog.compact()
    assert read_all(fresh, "orders", 0, 0, 161, 1 << 20) == expected(range(161))  # listed files gone: listed again


@pytest.mark.slow
def test_another_brokers_commits_are_seen_after_invalidate_which_refreshes_at_the_next_read(spark, tmp_path):
    """Another broker's commit (another JVM's: a data file placed in a partition directory this session
    has listed, as a staged commit lands, ``SparkGroupSink``) is served after ``invalidate`` (a
    partition taken over, ``LeadershipService``). ``invalidate`` makes no Spark call; the next read
    refreshes each table it reads, once (``Catalog.refreshTable``: what the session cached of the
    table's relation, such as a schema another broker evolved). File listings themselves are never
    cached (``catalog_conf``: ``filesourcePartitionFileCacheSize=0``)."""
    catalog = TableCatalog(spark, tmp_path / "data", TableConfig(database=unique_database()))
    catalog.ensure()
    catalog.write_flush(build_flush([append("orders", 0, 0, [record(i) for i in range(40)])], {}))
    reader = TableReader(spark, catalog)
    assert read_all(reader, "orders", 0, 0, 40, 1 << 20) == expected(range(40))
    (written,) = spark.table(catalog.records.name).inputFiles()
    path = Path(written.removeprefix("file:"))
    rows = pq.read_table(path)
    later = rows.set_column(rows.schema.get_field_index("offset"), "offset",
                            pa.compute.add(rows.column("offset"), 40))
    pq.write_table(later, path.with_name("part-other-broker.parquet"))  # offsets 40..79, the same records again
    reader.invalidate("orders", 0)
    assert reader.refreshes == 0   # no catalog call on the caller's path
    got = read_all(reader, "orders", 0, 40, 80, 1 << 20)
    assert [r[0] for r in got] == list(range(40, 80)) and [r[1:] for r in got] == [r[1:] for r in expected(range(40))]
    assert reader.refreshes == 1   # the records table (no dead letter table exists), at the first read
    assert read_all(reader, "orders", 0, 60, 80, 1 << 20) == got[20:]
    assert reader.refreshes == 1


@pytest.mark.slow
def test_a_warm_reader_starts_from_the_listing_it_made_at_start(tables):
    catalog, pay = tables
    reader = TableReader(catalog.spark, catalog, warm=True)
    reader.warming.join(120)
    assert not reader.warming.is_alive()
    assert read_all(reader, "orders", 0, 0, N, 1 << 20) == expected(range(N))
    assert read_all(reader, "gappy", 0, 0, 1000, 1 << 20) == expected([*range(10), *range(50, 60), *range(200, 205)])
    # 'orders' never lists; 'gappy' lists again at its first gap and where its rows end below ``end``
    assert reader.listings == 2
    # a typed topic has more tables than the records table: its first read lists them all
    assert decode(reader.read("pay", 0, 0, 1 << 20, end=100).records) == [(i, *_fields(r)) for i, r in enumerate(pay)]
    assert reader.listings == 3


@pytest.mark.slow
def test_compacted_tables_read_the_same(spark, tmp_path):
    catalog = TableCatalog(spark, tmp_path / "data", TableConfig(
        database=unique_database(), target_file_bytes=1 << 20, compaction_min_files=3, file_delete_delay_ms=0))
    catalog.ensure()
    for f in range(5):
        catalog.write_flush(build_flush([append("orders", 0, 40 * f, [record(i) for i in range(40 * f, 40 * f + 40)])],
                                        {}))
    before = TableReader(spark, catalog).read("orders", 0, 0, 1 << 20, end=200)
    spark_before = TableReader(spark, catalog, direct=False).read("orders", 0, 0, 1 << 20, end=200)
    result = catalog.compact()
    assert result.compacted_partitions >= 1 and result.files_after < result.files_before
    after = TableReader(spark, catalog).read("orders", 0, 0, 1 << 20, end=200)
    assert decode(after.records) == decode(before.records) == expected(range(200))
    assert after == before == spark_before   # the same bytes from the files as through Spark


@pytest.mark.slow
def test_read_costs(spark, tmp_path):
    """The numbers in the module docstring: one topic-partition of 100,000 rows in 10 files."""
    catalog = TableCatalog(spark, tmp_path / "data", TableConfig(database=unique_database()))
    catalog.ensure()
    n, per = 100_000, 10_000
    value = b"v" * 100
    for f in range(n // per):
        rows = pa.table({
            "key": pa.array([b"key-%d" % i for i in range(f * per, (f + 1) * per)], pa.binary()),
            "value": pa.array([value] * per, pa.binary()),
            "topic": pa.array(["bench"] * per), "partition": pa.array([0] * per, pa.int32()),
            "offset": pa.array(range(f * per, (f + 1) * per), pa.int64()),
            "timestamp": pa.array([(T0 + i) * 1000 for i in range(f * per, (f + 1) * per)],
                                  pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type),
            "timestampType": pa.array([0] * per, pa.int32()),
            "headers": pa.array([[{"key": "h", "value": b"x"}]] * per, ARROW_SCHEMA.field("headers").type)},
            schema=ARROW_SCHEMA)
        catalog.write(rows)
    reader = TableReader(spark, catalog, cold_chunk_rows=10_000)
    reader.read("bench", 0, 0, 1 << 20, end=n)          # warm Spark's read path (class loading, JIT)
    reader.invalidate()
    started = time.perf_counter()
    cold = reader.read("bench", 0, 50_000, 1 << 20, end=n)
    cold_s = time.perf_counter() - started
    started = time.perf_counter()
    cached = reader.read("bench", 0, 50_000, 1 << 20, end=n)   # the same 1 MiB again, from the cache
    cached_s = time.perf_counter() - started
    print(f"\ncold read: {cold_s * 1000:.0f} ms ({cold.record_count} records, {cold.size_bytes} bytes); "
          f"cached read: {cached_s * 1000:.1f} ms ({cached.record_count} records); cache {reader.cached_bytes} bytes")
    # The second read came from the cache (no Spark query): counted, not timed; the times are
    # printed for the module docstring's figures (timing is the benchmarks' job, not a test's).
    assert reader.misses == 2 and reader.hits == 1
    assert cached == cold and decode(cold.records)[0][:4] == (50_000, T0 + 50_000, 0, b"key-50000")
