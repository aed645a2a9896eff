"""Request header parsing and response header encoding (sans-I/O).

Every Kafka request frame (after the 4-byte size prefix, which the network
layer strips) starts with a request header whose *version* is not on the
wire: it follows from the api key and api version, exactly as Kafka's
generated ``ApiMessageType.requestHeaderVersion`` computes it:

* v0: ``api_key:int16 api_version:int16 correlation_id:int32``
  (only ControlledShutdown v0 uses it);
* v1: v0 + ``client_id:nullable int16-length string``;
* v2: v1 + tagged fields (used when that request version is "flexible").
  The client id stays a non-compact string in v2.

kio has the v1/v2 header schemas, but its entity reader rejects unknown
tagged fields (``KeyError: Unknown tagged field tag``) where Kafka skips
them, and it has no v0 header; so the header is read here, with the
pure-Python readers of :mod:`.guard` (nothing native may see an untrusted
length: kio's Rust readers can abort the process, see guard.py). Response
headers are v0 (``correlation_id:int32``) or v1 (v0 + empty tagged fields);
they are packed with ``struct`` because kio's ``entity_writer`` costs ~5 us
per call for these 4-5 bytes on the hot path.
"""

from __future__ import annotations

import functools
import struct

from dataclasses import dataclass

from kio.index import KioIndexError
from kio.index import load_request_schema
from kio.schema.index import api_key_map
from kio.schema.index import schema_name_map

from .errors import InvalidRequestError
from .errors import UnsupportedVersionError
from .guard import read_nullable_legacy_string
from .guard import read_unsigned_varint
from ..fastinit import fast_frozen_init

__all__ = (
    "API_VERSIONS_KEY",
    "FAST_PATH_TABLE",
    "RAW_SASL_TOKEN",
    "RAW_SASL_TOKEN_VERSION",
    "RequestHeader",
    "SASL_AUTHENTICATE_KEY",
    "SASL_HANDSHAKE_KEY",
    "encode_response",
    "is_flexible",
    "parse_request_header",
    "readonly_buffer",
    "request_header_version",
    "response_header_version",
)

API_VERSIONS_KEY = 18
SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
_CONTROLLED_SHUTDOWN_KEY = 7
# Api keys kio does not model, with their first flexible version (Kafka's
# ControlledShutdownRequest.json: "flexibleVersions": "3+"). Only needed so
# that ControlledShutdown v0 gets header v0; we never serve it.
_FIRST_FLEXIBLE_NOT_IN_KIO: dict[int, int] = {_CONTROLLED_SHUTDOWN_KEY: 3}

_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_RESPONSE_V0 = struct.Struct(">i")
_RESPONSE_V1 = struct.Struct(">iB")  # correlation_id, 0 tagged fields


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class RequestHeader:
    """A parsed request header.

    ``body_offset`` is the index in the frame where the request body starts
    (after the client id, and after the tagged fields for header v2).
    ``client_id`` is None when the client sent a null string, and for
    header v0 which has no client id.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int


RAW_SASL_TOKEN_VERSION = -1
"""The api version of ``RAW_SASL_TOKEN``: no request on the wire has it."""

RAW_SASL_TOKEN = RequestHeader(SASL_AUTHENTICATE_KEY, RAW_SASL_TOKEN_VERSION, -1, None, -1, 0)
"""The header a raw SASL token travels under (its frame is the token, no header in it).

After a SaslHandshake v0 the client sends its SASL tokens as bare size-prefixed
frames and expects bare size-prefixed tokens back, not SaslAuthenticate requests
and responses (KIP-43; Kafka ``SaslServerAuthenticator`` with
``enableKafkaSaslAuthenticateHeaders`` false). The network layer decides that a
frame is such a token (``pipeline.network.connection_state``) and hands it on
under this header, so it reaches the SaslAuthenticate handler
(``pipeline.requests.sasl_apis``) the way requests do; its response payload is
the server's token, with no response header. Not counted in the request
metrics: Kafka counts no authentication frame as a request."""

_FIXED_CLIENT = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_UNKNOWN = object()
_FIRST_FLEXIBLE: dict[int, int | None] = {}
"""``_first_flexible_version`` of the api keys seen so far (at most the known api keys):
what ``parse_request_header``'s fast path looks up."""

FAST_PATH_SLOW: int = 0xFF
"""``FAST_PATH_TABLE``: this api key's headers go through ``parse_request_header``."""
FAST_PATH_NOT_FLEXIBLE: int = 0xFE
"""``FAST_PATH_TABLE``: no version of this api key is flexible (header v1)."""
FAST_PATH_TABLE = bytearray([FAST_PATH_SLOW]) * 256
"""api key -> its first flexible version, ``FAST_PATH_NOT_FLEXIBLE``, or ``FAST_PATH_SLOW``:
the header fast path of ``pipeline._frames.cut`` (the Processor's read path), filled like
``_FIRST_FLEXIBLE`` as api keys are seen. ControlledShutdown (its v0 header) and SaslHandshake
(v0 switches the connection to raw SASL tokens, KIP-43) always take the slow path."""


@functools.cache
def _first_flexible_version(api_key: int) -> int | None:
    """First flexible request version of ``api_key``, or None if none is.

    Taken from kio's generated schemas (``__flexible__``); Kafka's message
    JSON always declares flexibleVersions as "N+", so one number suffices.

    :raises UnsupportedVersionError: if neither kio nor this module knows
        the api key.
    """
    if api_key in _FIRST_FLEXIBLE_NOT_IN_KIO:
        return _FIRST_FLEXIBLE_NOT_IN_KIO[api_key]
    name = api_key_map.get(api_key)
    if name is None:
        raise UnsupportedVersionError(f"unknown api key {api_key}")
    for version in sorted(schema_name_map[name]):
        try:
            cls = load_request_schema(api_key, version)
        except KioIndexError:  # pragma: no cover - kio lists only real versions
            continue
        if cls.__flexible__:
            return version
    return None


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether ``api_version`` of ``api_key`` uses the flexible encoding.

    Versions newer than kio knows count as flexible if the api has any
    flexible version (Kafka's flexibleVersions are open-ended "N+"), so an
    ApiVersions v9 header still parses (KIP-511).

    :raises UnsupportedVersionError: unknown api key.
    """
    first = _first_flexible_version(api_key)
    return first is not None and api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header version (0, 1 or 2) for a request, as Kafka derives it.

    :raises UnsupportedVersionError: unknown api key.
    """
    if api_key == _CONTROLLED_SHUTDOWN_KEY and api_version == 0:
        return 0
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version: 1 if the api version is flexible, else 0.

    ApiVersions responses always use header v0, whatever the version, so a
    client can read the error of a version it sent too new (KIP-511).

    :raises UnsupportedVersionError: unknown api key.
    """
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def readonly_buffer(frame: bytes | bytearray | memoryview) -> bytes | memoryview:
    """``frame`` as something kio's native readers accept.

    kio refuses writable buffers ("Received writable byte buffer where
    read-only was expected"), e.g. a bytearray from a receive buffer; a
    read-only memoryview over it is accepted and costs no copy.
    """
    if type(frame) is bytes:
        return frame
    return memoryview(frame).toreadonly()


def _skip_tagged_fields(frame: bytes | memoryview, offset: int) -> int:
    """Skip a tagged-field section starting at ``offset``; return the end.

    Kafka ignores unknown tags but requires them strictly ascending
    (``Readable.readUnknownTaggedField``/generated ``read`` methods).

    :raises InvalidRequestError: truncated or malformed section.
    """
    end = len(frame)
    try:
        count, size = read_unsigned_varint(frame, offset)
        offset += size
        previous = -1
        for _ in range(count):
            tag, size = read_unsigned_varint(frame, offset)
            offset += size
            if tag <= previous:
                raise InvalidRequestError(
                    f"request header tagged fields out of order: tag {tag} after {previous}"
                )
            previous = tag
            length, size = read_unsigned_varint(frame, offset)
            offset += size + length
            if offset > end:
                raise InvalidRequestError("request header tagged field runs past the frame end")
    except ValueError as exc:
        raise InvalidRequestError(f"malformed request header tagged fields: {exc}") from None
    return offset


def parse_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """Parse the request header at the start of ``frame`` (no size prefix).

    Unknown tagged fields in a v2 header are skipped. The api version is not
    checked against what we support (that is :func:`decode_request`'s job),
    only the api key must be known to pick the header version.

    :raises UnsupportedVersionError: unknown api key.
    :raises InvalidRequestError: frame shorter than the header, client id
        truncated or not UTF-8, malformed tagged fields.
    """
    frame = readonly_buffer(frame)
    length = len(frame)
    if length < _FIXED.size:
        raise InvalidRequestError(
            f"request frame of {length} bytes is shorter than the {_FIXED.size}-byte request header"
        )
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame, 0)
    first_flexible = _FIRST_FLEXIBLE.get(api_key, _UNKNOWN)
    client_id: str | None  # nullable in header v1 and v2
    if first_flexible is not _UNKNOWN and api_key != _CONTROLLED_SHUTDOWN_KEY and length >= _FIXED_CLIENT.size:
        # Fast path, every request but the first of each api key: the
        # header version from a dict, and a v2 header's usual empty
        # tagged-field section read as one byte. Same checks as below.
        client_length = _FIXED_CLIENT.unpack_from(frame, 0)[3]
        start = _FIXED_CLIENT.size
        end = start + client_length
        if client_length >= 0 and end < length:
            try:
                client_id = str(frame[start:end], "utf-8")
            except ValueError:
                pass  # the general path raises with the full message
            else:
                if first_flexible is None or api_version < first_flexible:
                    return RequestHeader(api_key, api_version, correlation_id, client_id, 1, end)
                if frame[end] == 0:  # no tagged fields
                    return RequestHeader(api_key, api_version, correlation_id, client_id, 2, end + 1)
    header_version = request_header_version(api_key, api_version)
    if api_key not in _FIRST_FLEXIBLE:
        first = _FIRST_FLEXIBLE[api_key] = _first_flexible_version(api_key)  # known: it did not raise
        if (0 <= api_key < len(FAST_PATH_TABLE) and api_key not in (_CONTROLLED_SHUTDOWN_KEY, SASL_HANDSHAKE_KEY)
                and (first is None or first < FAST_PATH_NOT_FLEXIBLE)):
            FAST_PATH_TABLE[api_key] = FAST_PATH_NOT_FLEXIBLE if first is None else first
    if header_version == 0:
        return RequestHeader(api_key, api_version, correlation_id, None, 0, _FIXED.size)
    try:
        client_id, size = read_nullable_legacy_string(frame, _FIXED.size)
    except ValueError as exc:
        raise InvalidRequestError(
            f"bad client_id in request header (api_key={api_key}, correlation_id={correlation_id}): {exc}"
        ) from None
    offset = _FIXED.size + size
    if header_version == 2:
        offset = _skip_tagged_fields(frame, offset)
    return RequestHeader(api_key, api_version, correlation_id, client_id, header_version, offset)


def encode_response(header: RequestHeader, body: bytes) -> bytes:
    """Response header for ``header``'s request followed by ``body``.

    Returns the frame *without* the 4-byte size prefix (the network layer
    adds it).
    """
    if response_header_version(header.api_key, header.api_version) == 0:
        return _RESPONSE_V0.pack(header.correlation_id) + body
    return _RESPONSE_V1.pack(header.correlation_id, 0) + body
