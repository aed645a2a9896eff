"""``pipeline.bench.consume_bench``'s pure parts: the offset check, the read-only WAL scan, the options."""

from __future__ import annotations

import argparse
from array import array

import pytest

from pipeline.bench.consume_bench import check_offsets, records_in_wal, resolve_consume
from pipeline.bench.options import add_bench_arguments
from pipeline.log.batch import PartitionAppend
from pipeline.log.wal import WalPosition, WriteAheadLog, encode_appends


def test_check_offsets_exact():
    check = check_offsets({0: 3, 1: 2}, {0: array("q", [0, 1, 2]), 1: array("q", [0, 1])})
    assert check.ok and (check.expected, check.consumed, check.unique) == (5, 5, 5)


def test_check_offsets_missing_duplicate_unexpected():
    check = check_offsets({0: 4, 1: 1}, {0: array("q", [0, 1, 1, 3, 7]), 2: array("q", [0])})
    assert not check.ok
    assert (check.consumed, check.unique, check.missing, check.duplicates, check.unexpected) == (6, 3, 2, 1, 2)


def test_records_in_wal_finds_the_lowest_retained_offset_per_partition(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", segment_bytes=200)
    wal.open()
    wal.append([encode_appends([PartitionAppend("t", 0, 0, b"a" * 150, 10, 0),
                                PartitionAppend("other", 0, 0, b"b", 1, 0)])])
    wal.append([encode_appends([PartitionAppend("t", 0, 10, b"c" * 150, 5, 0),
                                PartitionAppend("t", 1, 0, b"d", 1, 0)])])
    wal.append([encode_appends([PartitionAppend("t", 0, 15, b"e", 1, 0)])])
    assert len(wal.segments) == 3
    assert records_in_wal(tmp_path / "wal", "t") == {0: 0, 1: 0}
    wal.truncate_before(WalPosition(wal.segments[1], 0))
    assert records_in_wal(tmp_path / "wal", "t") == {0: 10, 1: 0}
    wal.close()
    assert records_in_wal(tmp_path / "missing", "t") == {}


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    return p.parse_args(["--consume", *argv])


def test_resolve_consume_defaults_and_smoke(tmp_path):
    opts = resolve_consume(_args())
    assert (opts.records, opts.record_bytes, opts.partitions, opts.rate) == (200_000, 1024, 4, 1000.0)
    assert str(opts.out) == "bench-results/consume" and opts.clients == ["confluent", "kafka-python"] and opts.table
    smoke = resolve_consume(_args("--smoke", "--out", str(tmp_path), "--consumers", "confluent", "--no-table-phase"))
    assert smoke.records == 3000 and smoke.out == tmp_path and smoke.clients == ["confluent"] and not smoke.table


@pytest.mark.parametrize("argv", [["--consumers", "java"], ["--consume-records", "0"], ["--rate", "0.5"],
                                  ["--partitions", "100"]])
def test_resolve_consume_refuses_out_of_range(argv):
    with pytest.raises(ValueError):
        resolve_consume(_args(*argv))
