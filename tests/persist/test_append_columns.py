"""The decode worker hand-off as columns (issue 13): same appends, same flush tables."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from pipeline.bench.frames import record_batch
from pipeline.log.batch import PartitionAppend, from_columns, to_columns
from pipeline.table.typed import build_flush, build_flush_from_columns


def _appends() -> list[PartitionAppend]:
    return [PartitionAppend("events", p, 10 * i, record_batch(p, i, 3, 16, 1_700_000_000_000 + i), 3,
                            1_700_000_000_500, producer_id=7 if p else -1, producer_epoch=1 if p else -1,
                            base_sequence=i if p else -1, uncompressed_bytes=0)
            for i in range(6) for p in range(2)]


def test_columns_round_trip_every_field_in_order() -> None:
    appends = _appends()
    assert from_columns(to_columns(appends)) == appends
    assert from_columns(to_columns([])) == []


def test_the_worker_builds_the_same_flush_from_columns() -> None:
    appends = _appends()
    expected = build_flush(appends, {})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        got = pool.submit(build_flush_from_columns, to_columns(appends), {}).result()
    assert got.num_rows == expected.num_rows == 36
    assert got.records.equals(expected.records)
    assert got.typed.keys() == expected.typed.keys()
    assert got.dead_letters.equals(expected.dead_letters)
