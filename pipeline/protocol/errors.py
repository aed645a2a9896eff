"""Errors raised by the sans-I/O protocol layer, and Kafka's error codes.

Two families, because the caller answers them differently:

* request-level (:class:`InvalidRequestError` and its subclass
  :class:`UnsupportedVersionError`): the frame is not a request we can
  answer, so the connection is closed, as Kafka's ``SocketServer`` does when
  ``RequestContext.parseRequest`` throws;
* partition-level (:class:`RecordError` and its subclasses, each with
  Kafka's ``error_code``): one partition's records are bad; only that
  partition gets an error code in an otherwise normal ProduceResponse.

``ErrorCode`` is kio's enum of Kafka's wire error codes (Kafka ``Errors``),
re-exported so callers need one import.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = (
    "CorruptRecordError",
    "ErrorCode",
    "InvalidRecordError",
    "InvalidRequestError",
    "InvalidTimestampError",
    "RecordError",
    "RecordTooLargeError",
    "UnsupportedCompressionTypeError",
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


class RecordError(Exception):
    """One partition's records are refused; ``error_code`` is Kafka's answer
    for that partition (the rest of the ProduceResponse is unaffected).

    Subclasses carry the code; the caller logs ``str(exc)`` and answers the
    partition with ``exc.error_code``. Nothing of the partition is stored.
    """

    error_code: int = ErrorCode.corrupt_message.value


class CorruptRecordError(RecordError):
    """The bytes are not a readable RecordBatch v2: bad CRC32C, a header
    smaller than 61 bytes, magic above 2, an unknown compression codec.

    ``ErrorCode.corrupt_message`` (2): Kafka's CorruptRecordException, from
    ``DefaultRecordBatch.ensureValid`` and
    ``ByteBufferLogInputStream.nextBatchSize``.
    """

    error_code = ErrorCode.corrupt_message.value


class InvalidRecordError(RecordError):
    """The batch reads, but breaks a rule: magic 0/1 on Produce v3+, record
    count against the offset range, records truncated or followed by extra
    bytes, a control batch from a client, producers differing between the
    batches of one partition, a batch length past the end of the records.

    ``ErrorCode.invalid_record`` (87): Kafka's InvalidRecordException, from
    ``ProduceRequest.validateRecords`` and ``LogValidator.validateBatch``.
    """

    error_code = ErrorCode.invalid_record.value


class InvalidTimestampError(RecordError):
    """A record's CreateTime cannot be stored in the table's timestamp column
    (outside 0001-01-01..9999-12-31 UTC).

    ``ErrorCode.invalid_timestamp`` (32): Kafka's InvalidTimestampException,
    from ``LogValidator.validateTimestamp``.
    """

    error_code = ErrorCode.invalid_timestamp.value


class RecordTooLargeError(RecordError):
    """A compressed batch would inflate past the server's limit
    (:data:`pipeline.protocol.records.MAX_UNCOMPRESSED_BATCH_BYTES`): a
    decompression bomb, or data too big to hold in memory at once.

    ``ErrorCode.message_too_large`` (10): Kafka's RecordTooLargeException.
    """

    error_code = ErrorCode.message_too_large.value


class UnsupportedCompressionTypeError(RecordError):
    """zstd on Produce v3-v6 (KIP-110: zstd needs Produce v7).

    ``ErrorCode.unsupported_compression_type`` (76), from
    ``ProduceRequest.validateRecords``.
    """

    error_code = ErrorCode.unsupported_compression_type.value
