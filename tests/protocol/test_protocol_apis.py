"""Request decoding for every served (api key, version) and response building
for ApiVersions, Metadata, InitProducerId and Produce, checked by reading the
bytes back with kio. (The other apis' responses are built by their handlers
in pipeline/log, pipeline/coordinator and pipeline/admin.)"""

from __future__ import annotations

import uuid

import pytest

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from pipeline.protocol import SUPPORTED_VERSIONS
from pipeline.protocol.apis import ADVERTISED_VERSIONS
from pipeline.protocol import BrokerInfo
from pipeline.protocol import InvalidRequestError
from pipeline.protocol import PartitionResult
from pipeline.protocol import ProducePartition
from pipeline.protocol import UnsupportedVersionError
from pipeline.protocol import api_versions_response
from pipeline.protocol import decode_request
from pipeline.protocol import init_producer_id_response
from pipeline.protocol import metadata_response
from pipeline.protocol import parse_request_header
from pipeline.protocol import produce_response
from pipeline.protocol import produce_view
from pipeline.protocol import validate_topic_name
from pipeline.protocol.apis import topic_id_for
from pipeline.protocol.header import request_header_version
from tests.protocol.protocol_helpers import metadata_request
from tests.protocol.protocol_helpers import metadata_request_by_id
from tests.protocol.protocol_helpers import ms
from tests.protocol.protocol_helpers import raw_header
from tests.protocol.protocol_helpers import read_response
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import request_module
from tests.protocol.protocol_helpers import sample_request
from tests.protocol.protocol_helpers import served_versions

ALL_SUPPORTED = served_versions()
# ApiVersions v0-v2 requests have an empty body, nothing to truncate.
WITH_BODY = [(k, v) for k, v in ALL_SUPPORTED if not (k == 18 and v < 3)]
BROKER = BrokerInfo(node_id=1, host="broker.local", port=9092, cluster_id="pipeline-cluster")


def versions(api_key: int) -> list[int]:
    low, high = SUPPORTED_VERSIONS[api_key]
    return list(range(low, high + 1))


def roundtrip(request: object, correlation_id: int = 7) -> tuple:
    frame = request_frame(request, correlation_id=correlation_id)
    header = parse_request_header(frame)
    return header, decode_request(header, frame)


# ------------------------------------------------------------------- dispatch


def test_advertised_is_exactly_supported() -> None:
    # Honest ApiVersions (issue 10): nothing is listed that is not served.
    assert ADVERTISED_VERSIONS == SUPPORTED_VERSIONS
    assert SUPPORTED_VERSIONS[0] == (3, 11) and SUPPORTED_VERSIONS[1][0] == 4


def overlaps(api_key: int, low: int, high: int) -> bool:
    """librdkafka's rd_kafka_ApiVersion_check: advertised range overlaps."""
    advertised = ADVERTISED_VERSIONS.get(api_key)
    return advertised is not None and low <= advertised[1] and advertised[0] <= high


def test_advertised_versions_enable_librdkafka_features() -> None:
    # librdkafka rdkafka_feature.c feature map, for the features a producer uses.
    assert overlaps(0, 3, 3) and overlaps(1, 4, 4)  # MsgVer2 (RecordBatch v2)
    assert overlaps(0, 7, 7) and overlaps(1, 10, 10)  # ZSTD
    assert overlaps(10, 0, 0)  # KLZ4
    assert overlaps(22, 0, 0)  # IdempotentProducer
    assert overlaps(18, 0, 0)  # ApiVersion


@pytest.mark.parametrize("api_key", [21, 43, 57])  # DeleteRecords, ElectLeaders, UpdateFeatures
def test_apis_not_served_are_refused(api_key: int) -> None:
    assert api_key not in ADVERTISED_VERSIONS
    frame = raw_header(api_key, 0) + b"\x00\x01c" + b"\x00" * 32
    with pytest.raises(UnsupportedVersionError, match="is not served"):
        decode_request(parse_request_header(frame), frame)


@pytest.mark.parametrize(("api_key", "version"), ALL_SUPPORTED)
def test_decode_roundtrip_every_supported_version(api_key: int, version: int) -> None:
    request = sample_request(api_key, version)
    header, decoded = roundtrip(request, correlation_id=1000 + version)
    assert (header.api_key, header.api_version, header.correlation_id) == (
        api_key,
        version,
        1000 + version,
    )
    assert decoded == request
    assert type(decoded) is type(request)


@pytest.mark.parametrize(("api_key", "version"), ALL_SUPPORTED)
def test_trailing_bytes_are_ignored_as_kafka_ignores_them(api_key: int, version: int) -> None:
    request = sample_request(api_key, version)
    frame = request_frame(request) + b"\x01\x00\x00"
    assert decode_request(parse_request_header(frame), frame) == request


def test_librdkafka_all_topics_metadata_v12_is_answered() -> None:
    # confluent-kafka 2.16 AdminClient.list_topics(): null topics, two false flags,
    # no tagged fields, then 3 more bytes (captured from the client).
    frame = raw_header(3, 12) + b"\xff\xff\x00" + bytes.fromhex("00000000010000")  # null client id, no tags
    body = decode_request(parse_request_header(frame), frame)
    assert body.topics is None and not body.allow_auto_topic_creation


@pytest.mark.parametrize(("api_key", "version"), WITH_BODY)
def test_truncated_body_is_invalid(api_key: int, version: int) -> None:
    frame = request_frame(sample_request(api_key, version))
    header = parse_request_header(frame)
    with pytest.raises(InvalidRequestError, match="cannot parse"):
        decode_request(header, frame[:-1])


def test_decode_accepts_writable_buffers() -> None:
    request = sample_request(0, 9)
    frame = bytearray(request_frame(request))
    header = parse_request_header(frame)
    assert decode_request(header, frame) == request
    assert decode_request(header, memoryview(frame)) == request


# Just outside each served range (ApiVersions' is answered, KIP-511, but
# decode_request itself refuses it), and a negative version.
JUST_OUTSIDE = sorted(
    {(key, low - 1) for key, (low, high) in SUPPORTED_VERSIONS.items() if low > 0}
    | {(key, high + 1) for key, (low, high) in SUPPORTED_VERSIONS.items()}
    | {(18, -1)}
)


@pytest.mark.parametrize(("api_key", "version"), JUST_OUTSIDE)
def test_unsupported_versions(api_key: int, version: int) -> None:
    frame = raw_header(api_key, version) + b"\x00\x01c" + b"\x00" * 16
    header = parse_request_header(frame)
    with pytest.raises(UnsupportedVersionError, match=f"v{version} is not supported"):
        decode_request(header, frame)


def header_rest(api_key: int, version: int) -> bytes:
    """What follows the fixed header prefix: a null client id (header v1+)
    and no tagged fields (v2)."""
    return (b"", b"\xff\xff", b"\xff\xff\x00")[request_header_version(api_key, version)]


# Every api kio models that we do not serve, at v0 (header v1 or v2), and
# ControlledShutdown (7), which kio does not model, for header v0.
NOT_SERVED = sorted((set(api_key_map) | {7}) - set(SUPPORTED_VERSIONS))


@pytest.mark.parametrize("api_key", NOT_SERVED)
def test_apis_we_do_not_serve(api_key: int) -> None:
    frame = raw_header(api_key, 0) + header_rest(api_key, 0)
    header = parse_request_header(frame)
    with pytest.raises(UnsupportedVersionError, match="is not served"):
        decode_request(header, frame)


def test_unknown_tagged_field_in_body_is_invalid_request() -> None:
    frame = request_frame(sample_request(22, 4))
    assert frame[-1] == 0  # empty tagged fields of the body
    frame = frame[:-1] + bytes([1, 7, 0])  # one unknown tag, empty
    with pytest.raises(InvalidRequestError, match="cannot parse"):
        decode_request(parse_request_header(frame), frame)


# ---------------------------------------------------------------- ApiVersions


@pytest.mark.parametrize("version", versions(18))
def test_api_versions_response(version: int) -> None:
    request = sample_request(18, version)
    frame = request_frame(request, correlation_id=99)
    response, software = api_versions_response(parse_request_header(frame), frame)
    correlation_id, body = read_response(18, version, response)
    assert correlation_id == 99
    assert body.error_code == ErrorCode.none
    assert {(k.api_key, k.min_version, k.max_version) for k in body.api_keys} == {
        (key, low, high) for key, (low, high) in ADVERTISED_VERSIONS.items()
    }
    if version >= 1:
        assert body.throttle_time.total_seconds() == 0
    if version >= 3:
        assert software == ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0")
    else:
        assert software is None
    # Response header is v0 even for flexible versions: 4 bytes then body.
    assert response[:4] == (99).to_bytes(4, "big")


@pytest.mark.parametrize("version", [5, 9, 127])
def test_api_versions_kip511_fallback(version: int) -> None:
    # A future ApiVersions request: header v2, body we cannot know.
    frame = raw_header(18, version, 31) + b"\x00\x03cli" + b"\x00" + b"\x0bfuture-body\x00"
    response, software = api_versions_response(parse_request_header(frame), frame)
    assert software is None
    correlation_id, body = read_response(18, 0, response)
    assert correlation_id == 31
    assert body.error_code == ErrorCode.unsupported_version == 35
    assert (18, 0, 4) in {(k.api_key, k.min_version, k.max_version) for k in body.api_keys}


def test_api_versions_invalid_software_name_gets_invalid_request() -> None:
    module = request_module(18, 3)
    request = module.ApiVersionsRequest(
        client_software_name="bad name!", client_software_version="1.0"
    )
    frame = request_frame(request)
    response, software = api_versions_response(parse_request_header(frame), frame)
    assert software is None
    _, body = read_response(18, 3, response)
    assert body.error_code == ErrorCode.invalid_request
    assert body.api_keys == ()


def test_api_versions_malformed_supported_version_raises() -> None:
    frame = raw_header(18, 3) + b"\x00\x01c" + b"\x00" + b"\x05ab"
    with pytest.raises(InvalidRequestError):
        api_versions_response(parse_request_header(frame), frame)


# ------------------------------------------------------------------- Metadata


class Topics:
    """A TopicResolver over a dict, recording describe() calls."""

    def __init__(self, topics: dict[str, int], auto_create_partitions: int = 0) -> None:
        self.topics = dict(topics)
        self.auto_create_partitions = auto_create_partitions
        self.calls: list[tuple[str, bool]] = []

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        self.calls.append((name, auto_create))
        if name in self.topics:
            return 0, self.topics[name]
        if auto_create and self.auto_create_partitions:
            self.topics[name] = self.auto_create_partitions
            return ErrorCode.leader_not_available, 0
        return ErrorCode.unknown_topic_or_partition, 0

    def all_topics(self) -> dict[str, int]:
        return dict(self.topics)


def metadata(version: int, request: object, topics: Topics) -> object:
    frame = request_frame(request, correlation_id=5)
    header = parse_request_header(frame)
    decoded = decode_request(header, frame)
    correlation_id, body = read_response(3, version, metadata_response(header, decoded, BROKER, topics))
    assert correlation_id == 5
    return body


def partitions_of(body: object) -> dict[str | None, tuple[int, list[int]]]:
    return {
        t.name: (int(t.error_code), [p.partition_index for p in t.partitions]) for t in body.topics
    }


@pytest.mark.parametrize("version", versions(3))
def test_metadata_named_topics(version: int) -> None:
    topics = Topics({"events": 3, "audit": 1})
    body = metadata(version, metadata_request(version, ["events", "missing"]), topics)
    assert partitions_of(body) == {"events": (0, [0, 1, 2]), "missing": (3, [])}
    broker = body.brokers[0]
    assert (broker.node_id, broker.host, broker.port) == (1, "broker.local", 9092)
    events = body.topics[0]
    for partition in events.partitions:
        assert partition.error_code == ErrorCode.none
        assert partition.leader_id == 1
        assert tuple(partition.replica_nodes) == (1,)
        assert tuple(partition.isr_nodes) == (1,)
        if version >= 7:
            assert partition.leader_epoch == 0
    if version >= 1:
        assert body.controller_id == 1
        assert events.is_internal is False
    if version >= 2:
        assert body.cluster_id == "pipeline-cluster"
    if version >= 10:
        assert events.topic_id == topic_id_for("events")
        assert body.topics[1].topic_id in (None, uuid.UUID(int=0))


@pytest.mark.parametrize("version", versions(3))
def test_metadata_all_topics(version: int) -> None:
    topics = Topics({"events": 2, "audit": 1})
    names: list[str] | None = [] if version == 0 else None
    body = metadata(version, metadata_request(version, names), topics)
    assert partitions_of(body) == {"events": (0, [0, 1]), "audit": (0, [0])}
    assert topics.calls == []


@pytest.mark.parametrize("version", versions(3)[1:])
def test_metadata_empty_list_means_no_topics_from_v1(version: int) -> None:
    body = metadata(version, metadata_request(version, []), Topics({"events": 2}))
    assert body.topics == ()
    assert len(body.brokers) == 1


@pytest.mark.parametrize("version", versions(3))
@pytest.mark.parametrize("allow", [True, False])
def test_metadata_auto_create_honoured(version: int, allow: bool) -> None:
    topics = Topics({}, auto_create_partitions=4)
    body = metadata(version, metadata_request(version, ["new"], auto_create=allow), topics)
    expected = allow if version >= 4 else True  # field exists from v4
    assert topics.calls == [("new", expected)]
    error = ErrorCode.leader_not_available if expected else ErrorCode.unknown_topic_or_partition
    assert partitions_of(body) == {"new": (error, [])}


@pytest.mark.parametrize("version", [0, 4, 9, 12])
@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad/name", "tópico", "sp ace"])
def test_metadata_invalid_topic_name(version: int, name: str) -> None:
    topics = Topics({})
    body = metadata(version, metadata_request(version, [name, "ok"]), topics)
    assert partitions_of(body)[name] == (ErrorCode.invalid_topic_exception, [])
    assert topics.calls == [("ok", True)]


def test_metadata_duplicates_are_answered_once() -> None:
    body = metadata(9, metadata_request(9, ["events", "events"]), Topics({"events": 1}))
    assert [t.name for t in body.topics] == ["events"]


def test_metadata_v12_lookup_by_topic_id() -> None:
    topics = Topics({"events": 2})
    body = metadata(12, metadata_request_by_id(topic_id_for("events")), topics)
    assert partitions_of(body) == {"events": (0, [0, 1])}
    assert body.topics[0].topic_id == topic_id_for("events")

    unknown = uuid.UUID("00000000-0000-0000-0000-000000000042")
    body = metadata(12, metadata_request_by_id(unknown), topics)
    assert partitions_of(body) == {None: (ErrorCode.unknown_topic_id, [])}
    assert body.topics[0].topic_id == unknown


def test_metadata_v10_null_topic_name_is_invalid_request() -> None:
    module = request_module(3, 10)
    request = module.MetadataRequest(
        topics=(module.MetadataRequestTopic(topic_id=uuid.uuid4(), name=None),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    frame = request_frame(request)
    header = parse_request_header(frame)
    with pytest.raises(InvalidRequestError, match="null"):
        metadata_response(header, decode_request(header, frame), BROKER, Topics({}))


def test_topic_id_is_deterministic_and_distinct() -> None:
    assert topic_id_for("events") == topic_id_for("events")
    assert topic_id_for("events") != topic_id_for("audit")
    assert topic_id_for("events") != uuid.UUID(int=0)


@pytest.mark.parametrize("name", ["a", "events", "A-b_c.9", "a" * 249, "..."])
def test_validate_topic_name_accepts(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "a b", "a/b", "é", "a\x00"])
def test_validate_topic_name_rejects(name: str) -> None:
    with pytest.raises(ValueError, match="topic name"):
        validate_topic_name(name)


# ------------------------------------------------------------- InitProducerId


@pytest.mark.parametrize("version", versions(22))
def test_init_producer_id_response(version: int) -> None:
    frame = request_frame(sample_request(22, version), correlation_id=12)
    header = parse_request_header(frame)
    request = decode_request(header, frame)
    assert request.transactional_id is None
    response = init_producer_id_response(header, request, producer_id=4000, producer_epoch=0)
    correlation_id, body = read_response(22, version, response)
    assert correlation_id == 12
    assert (body.error_code, body.producer_id, body.producer_epoch) == (ErrorCode.none, 4000, 0)
    assert body.throttle_time.total_seconds() == 0


def test_init_producer_id_error() -> None:
    frame = request_frame(sample_request(22, 4))
    header = parse_request_header(frame)
    response = init_producer_id_response(
        header, decode_request(header, frame), -1, -1, ErrorCode.cluster_authorization_failed
    )
    _, body = read_response(22, 4, response)
    assert (body.error_code, body.producer_id, body.producer_epoch) == (
        ErrorCode.cluster_authorization_failed,
        -1,
        -1,
    )


# -------------------------------------------------------------------- Produce


@pytest.mark.parametrize("version", versions(0))
def test_produce_view(version: int) -> None:
    records = bytes(range(70))
    _, request = roundtrip(sample_request(0, version, records=records))
    view = produce_view(request)
    assert (view.acks, view.timeout_ms, view.transactional_id) == (-1, 30_000, None)
    assert view.partitions == [
        ProducePartition("events", 0, records),
        ProducePartition("events", 3, None),
        ProducePartition("audit", 1, records),
    ]
    # The records are kio's bytes objects, not further copies.
    assert view.partitions[0].records is request.topic_data[0].partition_data[0].records


def test_produce_view_transactional_and_acks_zero() -> None:
    module = request_module(0, 7)
    request = module.ProduceRequest(
        transactional_id="txn-1",
        acks=0,
        timeout=ms(1500),
        topic_data=(),
    )
    _, decoded = roundtrip(request)
    view = produce_view(decoded)
    assert (view.acks, view.timeout_ms, view.transactional_id, view.partitions) == (
        0,
        1500,
        "txn-1",
        [],
    )


@pytest.mark.parametrize("version", versions(0))
def test_produce_response(version: int) -> None:
    header = parse_request_header(request_frame(sample_request(0, version), correlation_id=77))
    results = [
        PartitionResult("events", 0, 0, base_offset=100, log_start_offset=0),
        PartitionResult("audit", 1, ErrorCode.corrupt_message, error_message="CRC32C mismatch"),
        PartitionResult("events", 3, 0, base_offset=7, log_append_time_ms=1_700_000_000_123),
    ]
    correlation_id, body = read_response(0, version, produce_response(header, results))
    assert correlation_id == 77
    assert body.throttle_time.total_seconds() == 0
    assert [t.name for t in body.responses] == ["events", "audit"]
    events, audit = body.responses
    p0, p3 = events.partition_responses
    (p1,) = audit.partition_responses
    assert (p0.index, p0.error_code, p0.base_offset, p0.log_append_time) == (0, 0, 100, None)
    assert (p1.index, p1.error_code, p1.base_offset) == (1, ErrorCode.corrupt_message, -1)
    assert (p3.index, p3.base_offset) == (3, 7)
    assert int(p3.log_append_time.timestamp() * 1000) == 1_700_000_000_123
    if version >= 5:
        assert (p0.log_start_offset, p1.log_start_offset) == (0, -1)
    if version >= 8:
        assert p1.error_message == "CRC32C mismatch"
        assert p0.error_message is None
        assert p1.record_errors == ()


def test_produce_response_empty() -> None:
    header = parse_request_header(request_frame(sample_request(0, 9)))
    _, body = read_response(0, 9, produce_response(header, []))
    assert body.responses == ()


def test_produce_response_rejects_unknown_error_code() -> None:
    header = parse_request_header(request_frame(sample_request(0, 9)))
    with pytest.raises(ValueError):
        produce_response(header, [PartitionResult("t", 0, 31_000)])


def test_withheld_apis_are_not_listed() -> None:
    # A cluster of brokers runs no transaction coordinator: ApiVersions leaves its apis out.
    from pipeline.requests.handler import TRANSACTION_APIS

    frame = raw_header(18, 0) + b"\x00\x01c"
    header = parse_request_header(frame)
    listed = _listed(api_versions_response(header, frame)[0])
    assert TRANSACTION_APIS <= listed
    assert not TRANSACTION_APIS & _listed(api_versions_response(header, frame, withheld=TRANSACTION_APIS)[0])


def _listed(payload: bytes) -> set[int]:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse
    from kio.serial import entity_reader

    body, _ = entity_reader(ApiVersionsResponse)(payload, 4)  # after the v0 response header (correlation id)
    return {int(k.api_key) for k in body.api_keys}


@pytest.mark.parametrize("version", [1, 9, 12])
def test_a_repeated_metadata_body_is_decoded_once_and_a_bad_one_still_names_its_request(version):
    """``decode_request`` keeps Metadata entities by body (the cache is keyed on the bytes after
    the header, so the correlation id does not matter); errors are not kept."""
    request = metadata_request(version, ["orders", "payments"])
    first = request_frame(request, correlation_id=1)
    second = request_frame(request, correlation_id=2, client_id="another-client")
    entity = decode_request(parse_request_header(first), first)
    assert entity == request
    assert decode_request(parse_request_header(second), second) is entity
    other = request_frame(metadata_request(version, ["orders"]), correlation_id=3)
    assert decode_request(parse_request_header(other), other) == metadata_request(version, ["orders"])
    truncated = first[:-3]
    for _ in range(2):  # twice: a failure is not kept as a result
        with pytest.raises(InvalidRequestError, match="correlation_id=1"):
            decode_request(parse_request_header(truncated), truncated)
