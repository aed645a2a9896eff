"""Request header parsing (v0/v1/v2) and response header encoding."""

from __future__ import annotations

import struct

import pytest

from kio.schema.request_header.v2 import RequestHeader as KioHeaderV2
from kio.serial import entity_reader

from pipeline.protocol import InvalidRequestError
from pipeline.protocol import RequestHeader
from pipeline.protocol import UnsupportedVersionError
from pipeline.protocol import encode_response
from pipeline.protocol import parse_request_header
from pipeline.protocol import response_header_version
from pipeline.protocol.header import request_header_version
from tests.protocol.protocol_helpers import encode_entity
from tests.protocol.protocol_helpers import raw_header
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import sample_request


def legacy_string(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">h", -1)
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def test_v1_header_produce_v3() -> None:
    frame = request_frame(sample_request(0, 3), correlation_id=1234, client_id="rdkafka")
    header = parse_request_header(frame)
    assert header == RequestHeader(
        api_key=0,
        api_version=3,
        correlation_id=1234,
        client_id="rdkafka",
        header_version=1,
        body_offset=8 + 2 + len("rdkafka"),
    )


def test_v2_header_produce_v9_matches_kio_reader() -> None:
    frame = request_frame(sample_request(0, 9), correlation_id=-5, client_id="kafka-python")
    header = parse_request_header(frame)
    kio_header, size = entity_reader(KioHeaderV2)(frame, 0)
    assert header.header_version == 2
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        kio_header.request_api_key,
        kio_header.request_api_version,
        kio_header.correlation_id,
        kio_header.client_id,
    )
    assert header.body_offset == size


def test_v2_header_null_client_id_and_unknown_tagged_fields_are_skipped() -> None:
    # Two tagged fields (tags 0 and 5, ascending), which kio's own entity
    # reader would reject as unknown; Kafka skips them.
    tags = bytes([2, 0, 3, 0xAA, 0xBB, 0xCC, 5, 1, 0xDD])
    frame = raw_header(0, 9, 42) + legacy_string(None) + tags + b"BODY"
    header = parse_request_header(frame)
    assert header.client_id is None
    assert header.header_version == 2
    assert frame[header.body_offset :] == b"BODY"


def test_v1_null_client_id() -> None:
    frame = raw_header(3, 1, 9) + legacy_string(None) + b"\xff\xff\xff\xff"
    header = parse_request_header(frame)
    assert header.client_id is None
    assert header.header_version == 1
    assert header.body_offset == 10


def test_v0_header_controlled_shutdown_v0() -> None:
    frame = raw_header(7, 0, 77) + struct.pack(">i", 1)
    header = parse_request_header(frame)
    assert header == RequestHeader(7, 0, 77, None, 0, 8)


def test_header_versions_follow_flexibility() -> None:
    assert request_header_version(7, 0) == 0
    assert request_header_version(7, 1) == 1
    assert request_header_version(7, 3) == 2
    assert request_header_version(0, 2) == 1  # older than kio knows: not flexible
    assert request_header_version(0, 8) == 1
    assert request_header_version(0, 9) == 2
    assert request_header_version(3, 8) == 1
    assert request_header_version(3, 9) == 2
    assert request_header_version(18, 2) == 1
    assert request_header_version(18, 3) == 2
    assert request_header_version(22, 1) == 1
    assert request_header_version(22, 2) == 2
    assert request_header_version(21, 2) == 2  # DeleteRecords: known to kio, not served


def test_api_versions_newer_than_kio_still_parses_kip511() -> None:
    frame = raw_header(18, 9, 3) + legacy_string("cli") + b"\x00" + b"\x07future\x02x\x00"
    header = parse_request_header(frame)
    assert (header.api_version, header.header_version, header.client_id) == (9, 2, "cli")
    assert header.body_offset == 8 + 2 + 3 + 1


def test_writable_buffers_are_accepted() -> None:
    frame = request_frame(sample_request(0, 9))
    expected = parse_request_header(frame)
    assert parse_request_header(bytearray(frame)) == expected
    assert parse_request_header(memoryview(bytearray(frame))) == expected


@pytest.mark.parametrize("length", range(8))
def test_short_frame(length: int) -> None:
    with pytest.raises(InvalidRequestError, match="shorter than"):
        parse_request_header(raw_header(0, 9)[:length])


@pytest.mark.parametrize("api_key", [4, 5, 6, 9999, -1, 32767])
def test_unknown_api_key(api_key: int) -> None:
    with pytest.raises(UnsupportedVersionError, match="unknown api key"):
        parse_request_header(raw_header(api_key, 0) + legacy_string("x"))


@pytest.mark.parametrize(
    "rest",
    [
        b"",  # no client id at all
        b"\x00",  # half a length
        struct.pack(">h", 5) + b"abc",  # truncated client id
        struct.pack(">h", -2),  # negative length other than null
        struct.pack(">h", 2) + b"\xff\xfe",  # not UTF-8
    ],
)
def test_bad_client_id(rest: bytes) -> None:
    with pytest.raises(InvalidRequestError, match="client_id"):
        parse_request_header(raw_header(0, 3) + rest)


@pytest.mark.parametrize(
    "tags",
    [
        b"",  # tagged-field count missing
        b"\x01",  # one field announced, none present
        b"\x01\x00\x05ab",  # field shorter than announced
        b"\x02\x05\x00\x05\x00",  # repeated tag
        b"\x02\x05\x00\x01\x00",  # descending tags
        b"\xff\xff\xff\xff\xff\x01",  # over-long varint
    ],
)
def test_bad_tagged_fields(tags: bytes) -> None:
    with pytest.raises(InvalidRequestError, match="tagged field"):
        parse_request_header(raw_header(0, 9) + legacy_string("c") + tags)


def test_response_header_version() -> None:
    for version in range(5):
        assert response_header_version(18, version) == 0  # KIP-511
    assert response_header_version(18, 100) == 0
    assert response_header_version(0, 8) == 0
    assert response_header_version(0, 9) == 1
    assert response_header_version(3, 8) == 0
    assert response_header_version(3, 12) == 1
    assert response_header_version(22, 1) == 0
    assert response_header_version(22, 2) == 1


def test_encode_response_header_v0_and_v1() -> None:
    v0 = RequestHeader(0, 8, 0x01020304, None, 1, 0)
    assert encode_response(v0, b"body") == b"\x01\x02\x03\x04body"
    v1 = RequestHeader(0, 9, -1, None, 2, 0)
    assert encode_response(v1, b"body") == b"\xff\xff\xff\xff\x00body"
    api_versions = RequestHeader(18, 3, 5, None, 2, 0)
    assert encode_response(api_versions, b"") == b"\x00\x00\x00\x05"


def test_kio_written_header_v2_with_null_client_id() -> None:
    kio_header = KioHeaderV2(
        request_api_key=3, request_api_version=12, correlation_id=8, client_id=None
    )
    frame = encode_entity(kio_header)
    header = parse_request_header(frame)
    assert header == RequestHeader(3, 12, 8, None, 2, len(frame))


def test_fast_path_agrees_with_the_general_parser() -> None:
    """parse_request_header's cached fast path (issue 13) returns what the general path does."""
    from pipeline.protocol import header as header_module

    def frame(api_key: int, version: int, client: bytes | None, tagged: bytes = b"", body: bytes = b"") -> bytes:
        fixed = struct.pack(">hhi", api_key, version, 77)
        cid = struct.pack(">h", -1) if client is None else struct.pack(">h", len(client)) + client
        return fixed + cid + tagged + body

    cases = [
        frame(0, 9, b"producer", b"\x00", b"body"),          # flexible, no tags
        frame(0, 9, b"producer", b"\x01\x00\x01x", b"b"),    # flexible, one tag
        frame(0, 8, b"producer", b"", b"body"),              # not flexible
        frame(0, 8, None, b"", b"body"),                     # null client id
        frame(0, 9, b"", b"\x00", b"b"),                     # empty client id
        frame(18, 3, b"c", b"\x00"),                         # header ends at the frame end
        frame(18, 0, b"c"),
    ]
    for raw in cases:
        header_module._FIRST_FLEXIBLE.clear()
        general = header_module.parse_request_header(raw)
        fast = header_module.parse_request_header(raw)   # api key now cached
        assert fast == general, raw
        assert header_module.parse_request_header(bytearray(raw)) == general
    header_module._FIRST_FLEXIBLE.clear()
    header_module.parse_request_header(frame(0, 9, b"p", b"\x00", b"b"))
    with pytest.raises(InvalidRequestError):
        header_module.parse_request_header(frame(0, 9, b"\xff\xfe", b"\x00", b"b"))  # not UTF-8
    with pytest.raises(InvalidRequestError):
        header_module.parse_request_header(frame(0, 9, b"p", b"\x05", b""))  # tags past the end
