"""A flush with typed topics' records split between the decode workers, and the parts merged back."""

from __future__ import annotations

import pyarrow as pa

from pipeline.log.batch import PartitionAppend
from pipeline.persist.group_sink import SPLIT_MIN_BYTES, merge_flushes, split_for_decoding
from pipeline.table.staging import StagedFile, StagedRecords
from pipeline.table.typed import DEAD_LETTER_SCHEMA, FlushTables, NoSchema
from pipeline.table.schema import ARROW_SCHEMA


def _append(topic: str, offset: int) -> PartitionAppend:
    return PartitionAppend(topic=topic, partition=0, base_offset=offset, records=b"", record_count=1,
                           log_append_time_ms=0)


def test_only_large_flushes_with_typed_records_are_split_at_append_boundaries():
    size = SPLIT_MIN_BYTES // 4
    appends = [_append("typed" if i == 5 else "raw", i) for i in range(8)]
    spans = [(0, i * size, size) for i in range(8)]
    formats = {"typed": NoSchema("any format")}
    parts = split_for_decoding(appends, spans, formats)
    assert [[a.base_offset for a in part] for part, _ in parts] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [s for _, part_spans in parts for s in part_spans] == spans  # every append once, in order
    assert len(split_for_decoding(appends, spans, {})) == 1  # raw only: one part, one file per partition
    assert len(split_for_decoding(appends[:3], spans[:3], formats)) == 1  # under SPLIT_MIN_BYTES
    assert len(split_for_decoding(appends, spans, formats, workers=1)) == 1
    uneven = split_for_decoding(appends[:2], [(0, 0, SPLIT_MIN_BYTES), (0, 1, 1)], {"raw": NoSchema("x")})
    assert [len(part) for part, _ in uneven] == [1, 1]


def test_merge_puts_staged_files_and_tables_together():
    def staged(name: str) -> StagedRecords:
        return StagedRecords((StagedFile(f"/staging/{name}", (("date", "2026-11-28"), ("hour", 1)), 1,
                                         (("t", 0, 0, 0),)),))

    dead = DEAD_LETTER_SCHEMA.empty_table()
    one = FlushTables(staged("r1"), {"t": staged("t1")}, dead)
    two = FlushTables(staged("r2"), {"t": staged("t2"), "u": ARROW_SCHEMA.empty_table()}, dead)
    merged = merge_flushes([one, two])
    assert [f.path for f in merged.records.files] == ["/staging/r1", "/staging/r2"]
    assert [f.path for f in merged.typed["t"].files] == ["/staging/t1", "/staging/t2"]
    assert isinstance(merged.typed["u"], pa.Table) and merged.dead_letters.num_rows == 0
    assert merge_flushes([one]) is one
