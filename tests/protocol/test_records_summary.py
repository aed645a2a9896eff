"""``summarize_records`` (C, ``pipeline._records.summarize``) against ``validate_records``' Python walk.

The C summary stands in front of the Python check of every produced partition
(issue 23). For any records, valid or not: it either declines (None) or returns
exactly the RecordsInfo the Python walk returns, and whenever the Python walk
refuses records (any RecordError) the C summary declines them, so produce
accepts and refuses what it did before, with the same error codes and
messages. Valid uncompressed records are summarized in C; compressed ones are
always left to Python (which inflates them).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.protocol import RecordError
from pipeline.protocol import records as records_module
from pipeline.protocol.records import MAX_TIMESTAMP_MS
from pipeline.protocol.records import MIN_TIMESTAMP_MS
from pipeline.protocol.records import RecordsInfo
from pipeline.protocol.records import summarize_records
from pipeline.protocol.records import validate_records

INT32_MAX = 2**31 - 1


def python_walk(records: bytes, version: int = 9) -> RecordsInfo | RecordError:
    """validate_records without its C summary in front: the reference."""
    summarize = records_module.summarize_records
    records_module.summarize_records = lambda _records: None
    try:
        return validate_records(records, version)
    except RecordError as exc:
        return exc
    finally:
        records_module.summarize_records = summarize


def agree(records: bytes) -> RecordsInfo | None:
    """Assert the C summary and the Python walk agree on ``records``; the C summary."""
    fast = summarize_records(records)
    reference = python_walk(records)
    if isinstance(reference, RecordError):
        assert fast is None, (records, reference)
    elif fast is not None:
        assert fast == reference
    return fast


def batch(*, producer_id: int = -1, epoch: int = -1, sequence: int = -1, transactional: bool = False,
          codec: int = 0, count: int = 3, timestamp: int = 1_700_000_000_000, deltas: tuple[int, ...] = (),
          headers: bool = False, key: bytes | None = b"k", value: bytes | None = b"v" * 20) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, transactional, producer_id, epoch, sequence, 1 << 20)
    for i in range(count):
        delta = deltas[i] if i < len(deltas) else i
        builder.append(i, timestamp=timestamp + delta, key=key, value=value,
                       headers=[("h", b"x"), ("é", None)] if headers else [])
    return bytes(builder.build())


VALID = [
    batch(),
    batch(count=1, key=None, value=None),
    batch(headers=True),
    batch(producer_id=7, epoch=2, sequence=5),
    batch(producer_id=7, epoch=2, sequence=INT32_MAX - 1, count=4),  # the sequence wraps to 0
    batch(producer_id=9, epoch=0, sequence=0, transactional=True),
    batch(deltas=(5, -3, 0)),  # records out of time order
    batch(timestamp=MAX_TIMESTAMP_MS, count=1),
    batch(timestamp=MIN_TIMESTAMP_MS, count=1),
    batch() + batch(count=5),
    batch(producer_id=7, epoch=2, sequence=0) + batch(producer_id=7, epoch=2, sequence=3, count=2),
]


@pytest.mark.parametrize("index", range(len(VALID)))
def test_valid_uncompressed_records_are_summarized_in_c_exactly_as_python_does(index: int) -> None:
    assert agree(VALID[index]) is not None


def test_the_sequence_wraps_and_the_last_batch_gives_the_last_sequence() -> None:
    info = summarize_records(batch(producer_id=7, epoch=2, sequence=INT32_MAX - 1, count=4))
    assert info is not None and info.last_sequence == 1  # INT32_MAX - 1, INT32_MAX, 0, 1
    two = summarize_records(batch(producer_id=7, epoch=2, sequence=0) + batch(producer_id=7, epoch=2, sequence=3))
    assert two is not None and (two.base_sequence, two.last_sequence, two.batch_count, two.record_count) == (0, 5, 2, 6)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compressed_records_are_left_to_python(codec: int) -> None:
    records = batch(codec=codec, count=10)
    assert summarize_records(records) is None
    assert isinstance(python_walk(records), RecordsInfo)


INVALID = {
    "empty": b"",
    "trailing bytes": batch() + b"\x00",
    "truncated": batch()[:-1],
    "a timestamp past the table's range": batch(timestamp=MAX_TIMESTAMP_MS, deltas=(1,), count=1),
    "a timestamp before it": batch(timestamp=MIN_TIMESTAMP_MS, deltas=(-1,), count=1),
    "two producers": batch(producer_id=7, epoch=2, sequence=0) + batch(producer_id=8, epoch=2, sequence=0),
    "two epochs": batch(producer_id=7, epoch=2, sequence=0) + batch(producer_id=7, epoch=3, sequence=0),
    "transactional and not": batch(producer_id=7, epoch=2, sequence=0, transactional=True)
    + batch(producer_id=7, epoch=2, sequence=3),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_what_python_refuses_c_declines(case: str) -> None:
    records = INVALID[case]
    assert isinstance(python_walk(records), RecordError) or case == "empty"
    assert summarize_records(records) is None


def test_every_single_byte_change_and_cut_gives_the_same_outcome() -> None:
    rng = random.Random(23)
    for base in VALID:
        mutants = [base[:cut] for cut in range(len(base))]
        for _ in range(300):
            m = bytearray(base)
            for _ in range(rng.randint(1, 2)):
                m[rng.randrange(len(m))] = rng.choice((0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, rng.randrange(256)))
            mutants.append(bytes(m))
        for mutant in mutants:
            agree(mutant)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=300))
def test_random_bytes_give_the_same_outcome(records: bytes) -> None:
    agree(records)


@settings(max_examples=200, deadline=None)
@given(producer_id=st.integers(-1, 2**63 - 1), epoch=st.integers(-1, 2**15 - 1),
       sequence=st.integers(-1, INT32_MAX), transactional=st.booleans(), count=st.integers(1, 20),
       timestamp=st.integers(MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS),
       deltas=st.lists(st.integers(-2**40, 2**40), max_size=20), headers=st.booleans(),
       key=st.none() | st.binary(max_size=40), value=st.none() | st.binary(max_size=200))
def test_generated_batches_give_the_same_outcome(producer_id: int, epoch: int, sequence: int, transactional: bool,
                                                 count: int, timestamp: int, deltas: list[int], headers: bool,
                                                 key: bytes | None, value: bytes | None) -> None:
    records = batch(producer_id=producer_id, epoch=epoch, sequence=sequence, transactional=transactional,
                    count=count, timestamp=timestamp, deltas=tuple(deltas), headers=headers, key=key, value=value)
    fast = agree(records)
    if isinstance(python_walk(records), RecordsInfo):
        assert fast is not None  # valid and uncompressed: summarized in C
