"""Property tests: whatever bytes follow a valid header, the parsers raise
only their documented exceptions (a client cannot crash a handler task)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.protocol import SUPPORTED_VERSIONS
from pipeline.protocol import InvalidRequestError
from pipeline.protocol import RecordError
from pipeline.protocol import api_versions_response
from pipeline.protocol import decode_request
from pipeline.protocol import parse_request_header
from pipeline.protocol import validate_records
from tests.protocol.protocol_helpers import encode_entity
from tests.protocol.protocol_helpers import one_per_wire_format
from tests.protocol.protocol_helpers import request_class
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import sample_request
from tests.protocol.protocol_helpers import served_versions

ALL_SUPPORTED = served_versions()
# What the property tests draw from: one version per request wire format.
FUZZED = one_per_wire_format(ALL_SUPPORTED)
FUZZ = settings(max_examples=400, deadline=None)


def valid_header(api_key: int, version: int) -> bytes:
    header_cls = request_class(api_key, version).__header_schema__
    return encode_entity(
        header_cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=1,
            client_id="fuzz",
        )
    )


def decode_or_invalid(frame: bytes) -> None:
    header = parse_request_header(frame)
    try:
        decode_request(header, frame)
    except InvalidRequestError:
        pass


@FUZZ
@given(st.sampled_from(FUZZED), st.binary(max_size=400))
def test_random_body_after_valid_header(key_version: tuple[int, int], body: bytes) -> None:
    decode_or_invalid(valid_header(*key_version) + body)


@st.composite
def mutated_requests(draw: st.DrawFn) -> bytes:
    """A valid request frame with a few bytes overwritten, inserted or cut,
    which reaches deeper into the parser than random bytes do."""
    api_key, version = draw(st.sampled_from(FUZZED))
    frame = bytearray(request_frame(sample_request(api_key, version)))
    header_size = parse_request_header(bytes(frame)).body_offset
    for _ in range(draw(st.integers(1, 4))):
        if len(frame) <= header_size:
            break
        position = draw(st.integers(header_size, len(frame) - 1))
        action = draw(st.sampled_from(["set", "insert", "cut"]))
        if action == "set":
            frame[position] = draw(st.integers(0, 255))
        elif action == "insert":
            frame[position:position] = draw(st.binary(min_size=1, max_size=4))
        else:
            del frame[position:]
    return bytes(frame)


@FUZZ
@given(mutated_requests())
def test_mutated_request_bodies(frame: bytes) -> None:
    decode_or_invalid(frame)


@FUZZ
@given(st.binary(max_size=64))
def test_random_frames_parse_or_raise_invalid_request(frame: bytes) -> None:
    try:
        header = parse_request_header(frame)
    except InvalidRequestError:
        return
    assert header.body_offset <= len(frame)


@FUZZ
@given(st.integers(*SUPPORTED_VERSIONS[18]), st.binary(max_size=100))
def test_api_versions_random_body(version: int, body: bytes) -> None:
    frame = valid_header(18, version) + body
    try:
        api_versions_response(parse_request_header(frame), frame)
    except InvalidRequestError:
        pass


def _batch() -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, 7, 0, 0, 1 << 20)
    for i in range(3):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"x" * 10, headers=[])
    return bytes(builder.build())


BATCH = _batch()


@FUZZ
@given(st.data())
def test_validate_records_mutations(data: st.DataObject) -> None:
    records = bytearray(BATCH * data.draw(st.integers(1, 2)))
    for _ in range(data.draw(st.integers(0, 3))):
        position = data.draw(st.integers(0, len(records) - 1))
        records[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(records)))
    try:
        info = validate_records(bytes(records[:cut]))
    except RecordError:
        return
    assert info.record_count >= 1


@FUZZ
@given(st.binary(max_size=200))
def test_validate_records_random_bytes(records: bytes) -> None:
    try:
        validate_records(records)
    except RecordError:
        pass


def test_header_struct_sanity() -> None:
    # The fixed header prefix the fuzzers rely on: api_key, api_version, correlation_id.
    assert struct.unpack_from(">hhi", valid_header(0, 9)) == (0, 9, 1)
