"""Kafka wire protocol, sans-I/O: request headers, the apis we serve, and
record batch validation. Bytes in, entities/bytes out; no sockets, no clocks.

Modules: ``errors`` (exceptions, ``ErrorCode``), ``header`` (request and
response headers), ``apis`` (supported versions, request decoding, response
building), ``records`` (RecordBatch v2 validation).
"""

from .apis import ADVERTISED_VERSIONS
from .apis import SUPPORTED_VERSIONS
from .apis import BrokerInfo
from .apis import PartitionResult
from .apis import ProducePartition
from .apis import ProduceRequestView
from .apis import TopicResolver
from .apis import api_versions_response
from .apis import decode_request
from .apis import init_producer_id_response
from .apis import metadata_response
from .apis import produce_response
from .apis import produce_view
from .apis import validate_topic_name
from .errors import CorruptRecordError
from .errors import ErrorCode
from .errors import InvalidRecordError
from .errors import InvalidRequestError
from .errors import InvalidTimestampError
from .errors import RecordError
from .errors import RecordTooLargeError
from .errors import UnsupportedCompressionTypeError
from .errors import UnsupportedVersionError
from .header import RequestHeader
from .header import encode_response
from .header import parse_request_header
from .header import response_header_version
from .records import RecordsInfo
from .records import validate_records

__all__ = (
    "ADVERTISED_VERSIONS",
    "SUPPORTED_VERSIONS",
    "BrokerInfo",
    "CorruptRecordError",
    "ErrorCode",
    "InvalidRecordError",
    "InvalidRequestError",
    "InvalidTimestampError",
    "PartitionResult",
    "ProducePartition",
    "ProduceRequestView",
    "RecordError",
    "RecordTooLargeError",
    "RecordsInfo",
    "RequestHeader",
    "TopicResolver",
    "UnsupportedCompressionTypeError",
    "UnsupportedVersionError",
    "api_versions_response",
    "decode_request",
    "encode_response",
    "init_producer_id_response",
    "metadata_response",
    "parse_request_header",
    "produce_response",
    "produce_view",
    "response_header_version",
    "validate_records",
    "validate_topic_name",
)
