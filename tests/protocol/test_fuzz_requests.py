"""Fuzzing the request path (issue 8): every served api, one version per
request wire format (``fuzz_corpus.FUZZED``), valid requests mutated (bytes
flipped, set, inserted, deleted, the frame cut anywhere, every length field
set to -1/0/huge/off by one, junk appended), random bytes after valid
headers, and Produce requests whose RecordBatches are mutated (length,
CRC, magic, counts, attributes/codec, record varints, compressed payloads
in gzip/snappy/lz4/zstd), all run through the server's per-request path
(``fuzz_corpus.serve``: header, decode, response builders, records
validation). Only ``InvalidRequestError`` (request) and
``RecordError`` (records) may escape, and records that validation accepts
must decode in the persister.

Bounded for CI: ``FUZZ_EXAMPLES`` (default 300) examples per
hypothesis test and 20x that many frames in the child process. A longer
run is documented in docs/benchmarks.md ("Fuzzing")."""

from __future__ import annotations

import signal
import subprocess
import sys
import zlib

from pathlib import Path

import cramjam
import lz4.frame
import pytest

from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from aiokafka import codec as aiokafka_codec
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from pipeline.protocol.compression import SNAPPY
from pipeline.protocol.compression import DecompressionError
from pipeline.protocol.compression import decompress_bounded
from pipeline.protocol.header import parse_request_header
from tests.protocol.fuzz_corpus import BATCHES
from tests.protocol.fuzz_corpus import CODECS
from tests.protocol.fuzz_corpus import FUZZED
from tests.protocol.fuzz_corpus import PRODUCE_VERSIONS
from tests.protocol.fuzz_corpus import VALID_FRAMES
from tests.protocol.fuzz_corpus import Op
from tests.protocol.fuzz_corpus import apply_ops
from tests.protocol.fuzz_corpus import apply_record_ops
from tests.protocol.fuzz_corpus import fuzz_examples
from tests.protocol.fuzz_corpus import length_fields
from tests.protocol.fuzz_corpus import ops_strategy
from tests.protocol.fuzz_corpus import produce_frame
from tests.protocol.fuzz_corpus import record_ops_strategy
from tests.protocol.fuzz_corpus import serve

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = fuzz_examples(300)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIELDS = {key: length_fields(frame) for key, frame in VALID_FRAMES.items()}

# Offsets inside a snappy batch built by kafka-python (xerial framing):
# the 61-byte batch header, then magic (8 bytes) and version (int32).
_XERIAL_VERSION_LOW_BYTE = 61 + 8 + 3


def test_corpus_is_valid() -> None:
    """Every unmutated corpus frame is answered, its records accepted."""
    for key, frame in VALID_FRAMES.items():
        outcome = serve(frame)
        assert outcome.request_error is None, key
        assert FIELDS[key], key
    for version in PRODUCE_VERSIONS:
        for codec in CODECS:
            outcome = serve(produce_frame(version, BATCHES[codec]))
            expected = "UnsupportedCompressionTypeError" if codec == 4 and version < 7 else "ok"
            assert outcome.partitions == [expected, "CorruptRecordError", expected], (version, codec)


@FUZZ
@given(st.sampled_from(FUZZED), ops_strategy())
@example((3, 11), [("length", 2, 2, 0)])  # Metadata topics: compact array length 2**35 - 2
@example((0, 9), [("length", 3, 2, 0)])  # Produce topic_data: the same
@example((0, 9), [("length", 9, 5, 0)])  # Produce records: length 1 past the frame end
@example((18, 3), [("length", 0, 7, 0)])  # client_id length -2
@example((22, 4), [("cut", 9)])  # inside the client id
def test_mutated_requests_raise_only_documented_errors(key: tuple[int, int], ops: list[Op]) -> None:
    serve(apply_ops(VALID_FRAMES[key], ops, FIELDS[key]))


@FUZZ
@given(st.sampled_from(FUZZED), st.binary(max_size=200))
def test_random_bytes_after_a_valid_header(key: tuple[int, int], body: bytes) -> None:
    frame = VALID_FRAMES[key]
    serve(frame[: parse_request_header(frame).body_offset] + body)


@FUZZ
@given(
    st.sampled_from(PRODUCE_VERSIONS),
    st.sampled_from(CODECS),
    record_ops_strategy(),
    st.none() | ops_strategy(max_ops=2),
)
# Regressions found by this test (pipeline/protocol/compression.py): each
# was accepted by validate_records, then failed in the persister's decoder.
# A xerial snappy header of version 2: read as xerial here, raw there.
@example(9, 2, [("byte", _XERIAL_VERSION_LOW_BYTE, 2, True)], None)
# Bytes after the gzip member: Python's gzip reads on ("Not a gzipped file").
@example(9, 1, [("append", b"\x00\x01")], None)
# The start of a second gzip member ("Compressed file ended before ...").
@example(9, 1, [("append", b"\x1f\x8b")], None)
# Bytes after the lz4 frame: cramjam reads them as another frame.
@example(9, 3, [("append", b"junk")], None)
def test_mutated_record_batches_in_produce(
    version: int, codec: int, record_ops: list[Op], request_ops: list[Op] | None
) -> None:
    frame = produce_frame(version, apply_record_ops(BATCHES[codec], record_ops))
    if request_ops:
        frame = apply_ops(frame, request_ops, length_fields(frame))
    serve(frame)


# ----------------------------------------------- the fixes, directly


def test_gzip_with_trailing_bytes_is_refused() -> None:
    data = kafka_codec.gzip_encode(b"records")
    assert decompress_bounded(1, data, 100) == b"records"
    with pytest.raises(DecompressionError, match="2 bytes after the gzip stream"):
        decompress_bounded(1, data + b"\x1f\x8b", 100)
    with pytest.raises(DecompressionError, match="bytes after the gzip stream"):
        decompress_bounded(1, data + kafka_codec.gzip_encode(b"more"), 100)
    # zlib itself is happy with the first member alone:
    assert zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(data + b"xx") == b"records"


def test_lz4_with_trailing_bytes_is_refused() -> None:
    data = lz4.frame.compress(b"records")
    assert decompress_bounded(3, data, 100) == b"records"
    with pytest.raises(DecompressionError, match="4 bytes after the lz4 frame"):
        decompress_bounded(3, data + b"junk", 100)
    with pytest.raises(DecompressionError, match="bytes after the lz4 frame"):
        decompress_bounded(3, data + lz4.frame.compress(b"more"), 100)


def test_snappy_xerial_header_must_be_v1_as_the_persister_reads_it() -> None:
    xerial = kafka_codec.snappy_encode(b"records" * 10, xerial_compatible=True)
    assert xerial[:16] == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"
    assert decompress_bounded(SNAPPY, xerial, 1000) == b"records" * 10
    other_version = xerial[:11] + b"\x02" + xerial[12:]
    with pytest.raises(DecompressionError):  # one raw block, as aiokafka reads it: corrupt
        decompress_bounded(SNAPPY, other_version, 1 << 20)
    with pytest.raises(cramjam.DecompressionError):
        aiokafka_codec.snappy_decode(other_version)  # what the persister would have hit


# ------------------------------------------ no abort, checked out of process


def test_hostile_frames_do_not_kill_the_process() -> None:
    """20 x FUZZ_EXAMPLES hostile frames (half of them Produce with
    mutated, often compressed records) in a child process: a native abort or
    segfault shows up as a negative return code instead of killing pytest."""
    count = 20 * EXAMPLES
    child = subprocess.run(
        [sys.executable, "-m", "tests.protocol.fuzz_child", "--seed", "8", "--count", str(count)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    died = f" (killed by {signal.Signals(-child.returncode).name})" if child.returncode < 0 else ""
    assert child.returncode == 0, f"child exited {child.returncode}{died}:\n{child.stderr[-3000:]}"
    assert child.stdout.startswith(f"ok: {count} frames"), child.stdout
