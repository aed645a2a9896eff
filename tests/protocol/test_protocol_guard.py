"""The bounds pre-check in front of kio's native readers (pipeline/protocol/guard.py).

kio 0.6.5 sizes arrays with ``Vec::with_capacity(wire length)``; a huge
length aborts the whole process (SIGABRT), so these frames must be turned
into InvalidRequestError before kio sees them. The subprocess test at the
end is the one that would notice an abort without taking pytest down."""

from __future__ import annotations

import datetime
import io
import signal
import struct
import subprocess
import sys

from pathlib import Path

import pytest

from hypothesis import given
from hypothesis import settings
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32Timedelta

from pipeline.protocol import InvalidRequestError
from pipeline.protocol import decode_request
from pipeline.protocol import apis
from pipeline.protocol import parse_request_header
from pipeline.protocol.guard import check_body
from pipeline.protocol.guard import compile_plan
from pipeline.protocol.guard import is_rust_panic
from tests.protocol.protocol_helpers import metadata_request
from tests.protocol.protocol_helpers import raw_header
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import sample_request
from tests.protocol.test_protocol_fuzz import ALL_SUPPORTED
from tests.protocol.test_protocol_fuzz import mutated_requests
from tests.protocol.test_protocol_fuzz import valid_header
from tests.protocol.test_protocol_header import legacy_string

REPO = Path(__file__).resolve().parents[2]

# The frame that aborted the server (findcrash.py seed 3): Metadata v11,
# topics compact array length 13_547_171_610 ("memory allocation of
# 108377372880 bytes failed").
METADATA_V11_CRASH = bytes.fromhex(
    "0003000b00000001000466757a7a00"  # header v2, client "fuzz", no tags
    "9bdee5bb3225d81ba9b45368d419222082aa86064449aaf0504055d99906fb333b0c60bb"
)
UVARINT_MAX32 = b"\xff\xff\xff\xff\x0f"  # 2**32 - 1
TXN_NULL_ACKS_TIMEOUT_V7 = b"\xff\xff" + struct.pack(">hi", -1, 30_000)
TXN_NULL_ACKS_TIMEOUT_V9 = b"\x00" + struct.pack(">hi", -1, 30_000)


def decode(frame: bytes) -> object:
    return decode_request(parse_request_header(frame), frame)


# ------------------------------------------------------------ regressions


def test_metadata_v11_crash_frame_is_invalid_request() -> None:
    with pytest.raises(InvalidRequestError) as info:
        decode(METADATA_V11_CRASH)
    message = str(info.value)
    assert "cannot parse metadata v11" in message
    assert "MetadataRequest.topics" in message
    assert "13547171610" in message
    assert "bytes remaining" in message


@pytest.mark.parametrize(
    ("version", "body"),
    [
        (7, TXN_NULL_ACKS_TIMEOUT_V7 + struct.pack(">i", 0x7FFFFFFF)),
        (9, TXN_NULL_ACKS_TIMEOUT_V9 + UVARINT_MAX32),
    ],
)
def test_produce_huge_topic_array_is_invalid_request(version: int, body: bytes) -> None:
    with pytest.raises(InvalidRequestError, match=r"ProduceRequest\.topic_data: .*array length \d{10}"):
        decode(valid_header(0, version) + body)


@pytest.mark.parametrize(
    ("version", "body"),
    [
        (
            7,
            TXN_NULL_ACKS_TIMEOUT_V7
            + struct.pack(">i", 1)
            + legacy_string("t")
            + struct.pack(">ii", 1, 0)
            + struct.pack(">i", 0x7FFFFFFF)
            + b"\x00" * 16,
        ),
        (
            9,
            TXN_NULL_ACKS_TIMEOUT_V9
            + b"\x02\x02t"
            + b"\x02"
            + struct.pack(">i", 0)
            + UVARINT_MAX32
            + b"\x00" * 16,
        ),
    ],
)
def test_produce_huge_records_length_is_invalid_request(version: int, body: bytes) -> None:
    expected = r"partition_data\[\]\.records: .*length \d{10} exceeds the 16 bytes remaining"
    with pytest.raises(InvalidRequestError, match=expected):
        decode(valid_header(0, version) + body)


@pytest.mark.parametrize(
    ("version", "body"),
    [
        # topics: one topic "t", partition_data null (-1 / 0): kio would hand
        # back None and the Produce handler would fail iterating it.
        (
            7,
            TXN_NULL_ACKS_TIMEOUT_V7 + struct.pack(">i", 1) + legacy_string("t") + struct.pack(">i", -1),
        ),
        (9, TXN_NULL_ACKS_TIMEOUT_V9 + b"\x02\x02t" + b"\x00" + b"\x00" + b"\x00"),
    ],
)
def test_null_non_nullable_array_is_invalid_request(version: int, body: bytes) -> None:
    with pytest.raises(InvalidRequestError, match="partition_data: .*not nullable"):
        decode(valid_header(0, version) + body)


@pytest.mark.parametrize("version", [1, 11])
def test_null_nullable_array_still_decodes(version: int) -> None:
    assert decode(request_frame(metadata_request(version, None))).topics is None


@pytest.mark.parametrize(
    "body",
    [
        b"\x80\x80\x80\x80\x80\x01",  # over-long varint (6 bytes)
        b"\x80\x80",  # truncated varint
        b"\x02",  # one topic announced, none present
    ],
)
def test_malformed_varints_are_invalid_request(body: bytes) -> None:
    with pytest.raises(InvalidRequestError, match="cannot parse metadata v11 .*MetadataRequest.topics"):
        decode(valid_header(3, 11) + body)


def test_huge_client_id_length_is_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="client_id.*32767 exceeds"):
        parse_request_header(raw_header(0, 9) + struct.pack(">h", 0x7FFF) + b"abc")


def test_huge_header_tagged_field_is_invalid_request() -> None:
    frame = raw_header(0, 9) + legacy_string("c") + b"\x01\x00" + UVARINT_MAX32
    with pytest.raises(InvalidRequestError, match="tagged field"):
        parse_request_header(frame)


# --------------------------------------------------- rust panics (pyo3)


class PanicException(BaseException):
    """Stand-in for pyo3's PanicException (same name, BaseException)."""


def test_rust_panic_becomes_invalid_request(monkeypatch: pytest.MonkeyPatch) -> None:
    def panicking_reader(buffer: object, offset: int) -> tuple[object, int]:
        raise PanicException("index out of bounds")

    assert is_rust_panic(PanicException())
    monkeypatch.setitem(apis._REQUEST_READERS, (0, 9), panicking_reader)
    with pytest.raises(InvalidRequestError, match="PanicException: index out of bounds"):
        decode(request_frame(sample_request(0, 9)))


def test_keyboard_interrupt_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted_reader(buffer: object, offset: int) -> tuple[object, int]:
        raise KeyboardInterrupt

    assert not is_rust_panic(KeyboardInterrupt())
    monkeypatch.setitem(apis._REQUEST_READERS, (0, 9), interrupted_reader)
    with pytest.raises(KeyboardInterrupt):
        decode(request_frame(sample_request(0, 9)))


# ------------------------------------------ the guard follows kio's path


@pytest.mark.parametrize(("api_key", "version"), ALL_SUPPORTED)
def test_guard_ends_where_kio_ends(api_key: int, version: int) -> None:
    frame = request_frame(sample_request(api_key, version))
    offset = parse_request_header(frame).body_offset
    _, size = apis._REQUEST_READERS[(api_key, version)](frame, offset)
    end = check_body(apis._REQUEST_PLANS[(api_key, version)], frame, offset)
    assert end == offset + size == len(frame)


@settings(max_examples=400, deadline=None)
@given(mutated_requests())
def test_guard_agrees_with_kio_on_mutated_bodies(frame: bytes) -> None:
    header = parse_request_header(frame)
    key = (header.api_key, header.api_version)
    try:
        end = check_body(apis._REQUEST_PLANS[key], frame, header.body_offset)
    except InvalidRequestError:
        return  # kio never runs on these
    try:
        _, size = apis._REQUEST_READERS[key](frame, header.body_offset)
    except Exception:  # noqa: BLE001 - kio rejects what the guard does not check (UTF-8, ...)
        return
    assert end == header.body_offset + size


def _produce_response_v10() -> tuple[type, bytes]:
    """No request we serve has tagged fields; ProduceResponse v10 has two
    (current_leader, node_endpoints), and the guard is schema-generic."""
    module = load_payload_module(0, 10, EntityType.response)
    partition = module.PartitionProduceResponse(
        index=0,
        error_code=ErrorCode.none,
        base_offset=5,
        log_append_time=None,
        log_start_offset=0,
        record_errors=(),
        error_message=None,
        current_leader=module.LeaderIdAndEpoch(leader_id=3, leader_epoch=4),
    )
    response = module.ProduceResponse(
        responses=(module.TopicProduceResponse(name="t", partition_responses=(partition,)),),
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        node_endpoints=(module.NodeEndpoint(node_id=1, host="h", port=9, rack=None),),
    )
    buffer = io.BytesIO()
    entity_writer(module.ProduceResponse)(buffer, response)
    return module.ProduceResponse, buffer.getvalue()


def test_tagged_fields_are_walked_like_kio() -> None:
    cls, data = _produce_response_v10()
    _, size = entity_reader(cls)(data, 0)
    assert check_body(compile_plan(cls), data, 0) == size == len(data)
    # The last tagged section: 1 field, tag 0 (node_endpoints), size, array.
    tail = data.rindex(b"\x01\x00\x0d\x02")
    huge = data[:tail] + b"\x01\x00\x0d" + UVARINT_MAX32 + data[tail + 4 :]
    expected = r"ProduceResponse\.node_endpoints: compact array length"
    with pytest.raises(InvalidRequestError, match=expected):
        check_body(compile_plan(cls), huge, 0)
    unknown = data[:tail] + b"\x01\x05\x0d" + data[tail + 3 :]
    with pytest.raises(InvalidRequestError, match="unknown tagged field tag 5"):
        check_body(compile_plan(cls), unknown, 0)
    oversized = data[:tail] + b"\x01\x00\x7f" + data[tail + 3 :]
    with pytest.raises(InvalidRequestError, match="tagged field size 127 exceeds"):
        check_body(compile_plan(cls), oversized, 0)


# ------------------------------------------ no abort, checked out of process


@pytest.mark.parametrize("seed", [1, 2])
def test_thousands_of_hostile_bodies_do_not_kill_the_process(seed: int) -> None:
    """2000 hostile bodies per served request wire format (~150,000 in all)
    in a child process; a native abort shows up as a negative return code
    (-SIGABRT) instead of killing pytest."""
    child = subprocess.run(
        [sys.executable, "-m", "tests.protocol.guard_child", "--seed", str(seed), "--count", "2000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    died = f" (killed by {signal.Signals(-child.returncode).name})" if child.returncode < 0 else ""
    assert child.returncode == 0, f"child exited {child.returncode}{died}:\n{child.stderr[-3000:]}"
    assert child.stdout.startswith("ok:")
