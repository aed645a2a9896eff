"""Errors raised by the sans-I/O protocol layer, and Kafka's error codes.

Two families, because the caller answers them differently:

* request-level (:class:`InvalidRequestError` and its subclass
  :class:`UnsupportedVersionError`): the frame is not a request we can
  answer, so the connection is closed, as Kafka's ``SocketServer`` does when
  ``RequestContext.parseRequest`` throws;
* partition-level (:class:`CorruptRecordError`,
  :class:`UnsupportedRecordVersionError`): one partition's records are bad;
  only that partition gets an error code in an otherwise normal
  ProduceResponse.

``ErrorCode`` is kio's enum of Kafka's wire error codes (Kafka ``Errors``),
re-exported so callers need one import.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = (
    "CorruptRecordError",
    "ErrorCode",
    "InvalidRequestError",
    "UnsupportedRecordVersionError",
    "UnsupportedVersionError",
)


class InvalidRequestError(Exception):
    """The frame cannot be parsed as a request we answer.

    The caller closes the connection and logs ``str(exc)``; no response is
    sent (the correlation id may not even be readable).
    """


class UnsupportedVersionError(InvalidRequestError):
    """The api key is unknown, or its version is outside ``SUPPORTED_VERSIONS``.

    Not raised for ApiVersions: KIP-511 says an ApiVersions request of an
    unsupported version is answered (v0 body, ``UNSUPPORTED_VERSION``), see
    :func:`pipeline.protocol.apis.api_versions_response`.
    """


class CorruptRecordError(Exception):
    """One partition's records are malformed: bad CRC32C, truncated or
    inconsistent sizes, empty, or an invalid batch header.

    Answer that partition with ``ErrorCode.corrupt_message`` (2).
    """


class UnsupportedRecordVersionError(Exception):
    """A batch's magic byte is not 2 (only RecordBatch v2 is accepted).

    Answer that partition with ``ErrorCode.unsupported_for_message_format``
    (43).
    """
