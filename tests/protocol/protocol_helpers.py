"""Helpers shared by the protocol tests: building real request frames with
kio's writers and reading responses back with kio's readers.

Named uniquely (not conftest.py) so test modules can import it without
clashing with other test packages' helpers."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import typing
import uuid

from typing import Any

from kio.index import load_payload_module
from kio.index import load_request_schema
from kio.index import load_response_schema
from kio.schema.request_header.v1 import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader
from kio.serial import entity_writer
from kio.serial._introspect import EntityField
from kio.serial._introspect import EntityTupleField
from kio.serial._introspect import classify_field
from kio.static.constants import EntityType
from kio.static.primitive import Records
from kio.static.primitive import i16
from kio.static.primitive import i32
from kio.static.primitive import i32Timedelta
from kio.static.primitive import i64Timedelta

from pipeline.protocol import SUPPORTED_VERSIONS
from pipeline.protocol import apis


def encode_entity(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def request_frame(
    request: Any, correlation_id: int = 7, client_id: str | None = "test-client"
) -> bytes:
    """A request frame (no size prefix) for kio request entity ``request``,
    with the header version kio's schema declares for it."""
    header_cls = request.__header_schema__
    assert header_cls in (RequestHeaderV1, RequestHeaderV2)
    header = header_cls(
        request_api_key=i16(request.__api_key__),
        request_api_version=i16(request.__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    return encode_entity(header) + encode_entity(request)


def raw_header(api_key: int, api_version: int, correlation_id: int = 7) -> bytes:
    """Header v1/v2 prefix built by hand (for versions kio does not know)."""
    return struct.pack(">hhi", api_key, api_version, correlation_id)


def read_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """Split a response frame into (correlation_id, kio response entity),
    using the response header version kio's schema declares; asserts the
    whole frame is consumed."""
    cls = load_response_schema(api_key, version)
    header_cls = cls.__header_schema__
    header, offset = entity_reader(header_cls)(frame, 0)
    body, size = entity_reader(cls)(frame, offset)
    assert offset + size == len(frame), "response has trailing bytes"
    return header.correlation_id, body


def served_versions() -> list[tuple[int, int]]:
    """Every served (api key, version), in order, from ``SUPPORTED_VERSIONS``
    (whatever its ranges are today)."""
    return [
        (api_key, version)
        for api_key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
        for version in range(low, high + 1)
    ]


def one_per_wire_format(keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The first (api key, version) of ``keys`` for each distinct request
    wire format of its api: versions whose request bodies the guard walks
    alike (``apis._REQUEST_PLANS``: the same fields, lengths and nesting;
    e.g. Fetch v5 and v6 differ only in the response) are one format.

    For the fuzzers, whose cost grows with the number of versions they
    iterate or whose depth shrinks with the number they sample from; every
    version is still decoded by the per-version tests."""
    first: dict[tuple[int, str], tuple[int, int]] = {}
    for key in keys:
        first.setdefault((key[0], repr(apis._REQUEST_PLANS[key])), key)
    return list(first.values())


def request_class(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


# ---------------------------------------------------------------- sample requests


def make(cls: type, **values: Any) -> Any:
    """Instantiate kio entity ``cls`` with the ``values`` it has fields for."""
    names = cls.__dataclass_fields__
    return cls(**{k: v for k, v in values.items() if k in names})


def ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def request_module(api_key: int, version: int) -> Any:
    return load_payload_module(api_key, version, EntityType.request)


def sample_request(api_key: int, version: int, records: bytes = b"\x00" * 70) -> Any:
    """A representative kio request entity for a served (api_key, version).

    Hand-written for the apis whose shape matters to a reader (several
    topics and partitions, special values); every other api gets
    :func:`generic_entity`. Tagged fields keep their defaults, so the frames
    carry no tagged fields (the fuzz corpus relies on it).
    """
    module = request_module(api_key, version)
    if api_key == 0:
        return make(
            module.ProduceRequest,
            transactional_id=None,
            acks=-1,
            timeout=ms(30_000),
            topic_data=(
                module.TopicProduceData(
                    name="events",
                    partition_data=(
                        module.PartitionProduceData(index=0, records=Records(records)),
                        module.PartitionProduceData(index=3, records=None),
                    ),
                ),
                module.TopicProduceData(
                    name="audit",
                    partition_data=(module.PartitionProduceData(index=1, records=Records(records)),),
                ),
            ),
        )
    if api_key == 3:
        topic = make(module.MetadataRequestTopic, name="events", topic_id=None)
        return make(
            module.MetadataRequest,
            topics=(topic,),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    if api_key == 18:
        return make(
            module.ApiVersionsRequest,
            client_software_name="confluent-kafka-python",
            client_software_version="2.16.1-rdkafka-2.16.0",
        )
    if api_key == 22:
        return make(
            module.InitProducerIdRequest,
            transactional_id=None,
            transaction_timeout=ms(60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
    sample = _SAMPLES.get(api_key)
    if sample is not None:
        return sample(module, version)
    return generic_entity(request_class(api_key, version))


def _fetch(m: Any, version: int) -> Any:
    """An incremental fetch (session 1234, epoch 5; v7+) of two topics,
    forgetting two partitions of a third; read_committed."""

    def partition(index: int, offset: int) -> Any:
        return make(
            m.FetchPartition,
            partition=index,
            current_leader_epoch=0,
            fetch_offset=offset,
            last_fetched_epoch=0,
            log_start_offset=-1,
            partition_max_bytes=1_048_576,
        )

    return make(
        m.FetchRequest,
        replica_id=-1,
        max_wait=ms(500),
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=1234,
        session_epoch=5,
        topics=(
            m.FetchTopic(topic="events", partitions=(partition(0, 0), partition(1, 42), partition(3, 1_000_000))),
            m.FetchTopic(topic="audit", partitions=(partition(0, 7),)),
        ),
        # Fetch sessions (KIP-227) start at v7.
        forgotten_topics_data=(m.ForgottenTopic(topic="old", partitions=(2, 5)),) if version >= 7 else (),
        rack_id="rack-a",
    )


EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3  # Kafka ListOffsetsRequest special timestamps


def _list_offsets(m: Any, version: int) -> Any:
    """Earliest, latest and by-timestamp lookups (and max timestamp, v7+)."""
    timestamps = [EARLIEST, LATEST, 1_700_000_000_000] + ([MAX_TIMESTAMP] if version >= 7 else [])
    return make(
        m.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=0,
        topics=(
            m.ListOffsetsTopic(
                name="events",
                partitions=tuple(
                    make(m.ListOffsetsPartition, partition_index=index, current_leader_epoch=-1, timestamp=timestamp)
                    for index, timestamp in enumerate(timestamps)
                ),
            ),
        ),
    )


def consumer_subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0 (version, topics, null user data): what
    a consumer puts in JoinGroup protocol metadata."""
    encoded = b"".join(struct.pack(">h", len(t)) + t.encode() for t in topics)
    return struct.pack(">hi", 0, len(topics)) + encoded + struct.pack(">i", -1)


def _join_group(m: Any, version: int) -> Any:
    """A static member (v5+) joining with two assignors."""
    subscription = consumer_subscription("events", "audit")
    return make(
        m.JoinGroupRequest,
        group_id="orders",
        session_timeout=ms(45_000),
        rebalance_timeout=ms(300_000),
        member_id="consumer-1-5a6b",
        group_instance_id="orders-instance-1",
        protocol_type="consumer",
        protocols=(
            m.JoinGroupRequestProtocol(name="cooperative-sticky", metadata=subscription),
            m.JoinGroupRequestProtocol(name="range", metadata=subscription),
        ),
        reason="rebalance: metadata changed",
    )


def _offset_commit(m: Any, version: int) -> Any:
    """Offsets for three partitions of two topics (one with null metadata)."""

    def partition(index: int, offset: int, metadata: str | None) -> Any:
        return make(
            m.OffsetCommitRequestPartition,
            partition_index=index,
            committed_offset=offset,
            committed_leader_epoch=0,
            committed_metadata=metadata,
        )

    return make(
        m.OffsetCommitRequest,
        group_id="orders",
        generation_id_or_member_epoch=3,
        member_id="consumer-1-5a6b",
        group_instance_id=None,
        retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),  # broker default
        topics=(
            m.OffsetCommitRequestTopic(name="events", partitions=(partition(0, 42, ""), partition(1, 7, None))),
            m.OffsetCommitRequestTopic(name="audit", partitions=(partition(0, 1_000, "meta"),)),
        ),
    )


def _create_topics(m: Any, version: int) -> Any:
    """One topic with configs, one with a manual replica assignment."""
    return make(
        m.CreateTopicsRequest,
        topics=(
            m.CreatableTopic(
                name="events",
                num_partitions=3,
                replication_factor=1,
                assignments=(),
                configs=(
                    m.CreatableTopicConfig(name="retention.ms", value="604800000"),
                    m.CreatableTopicConfig(name="cleanup.policy", value="delete"),
                    m.CreatableTopicConfig(name="segment.bytes", value=None),
                ),
            ),
            m.CreatableTopic(
                name="manual",
                num_partitions=-1,
                replication_factor=-1,
                assignments=(
                    m.CreatableReplicaAssignment(partition_index=0, broker_ids=(1,)),
                    m.CreatableReplicaAssignment(partition_index=1, broker_ids=(1,)),
                ),
                configs=(),
            ),
        ),
        timeout=ms(30_000),
        validate_only=False,
    )


TOPIC_RESOURCE, SET, DELETE = 2, 0, 1  # Kafka ConfigResource.Type, AlterConfigOp.OpType


def _incremental_alter_configs(m: Any, version: int) -> Any:
    """SET one topic config, DELETE another (null value)."""
    return m.IncrementalAlterConfigsRequest(
        resources=(
            m.AlterConfigsResource(
                resource_type=TOPIC_RESOURCE,
                resource_name="events",
                configs=(
                    m.AlterableConfig(name="retention.ms", config_operation=SET, value="86400000"),
                    m.AlterableConfig(name="cleanup.policy", config_operation=DELETE, value=None),
                ),
            ),
        ),
        validate_only=False,
    )


_SAMPLES = {
    1: _fetch,
    2: _list_offsets,
    8: _offset_commit,
    11: _join_group,
    19: _create_topics,
    44: _incremental_alter_configs,
}


def generic_entity(cls: type) -> Any:
    """An instance of kio entity ``cls`` with every field filled in from its
    schema: strings are the field's name, ints count up from 1 (so a swapped
    field shows in a roundtrip), booleans True, bytes the name's bytes,
    uuids a uuid5 of the name, durations whole seconds; arrays have one
    element; nullable strings, bytes and arrays are None; tagged fields keep
    their defaults.

    :raises AssertionError: a kafka type this builder does not know.
    """
    counter = iter(range(1, 1 << 15))
    return _generic(cls, counter)


def _generic(cls: type, counter: Any) -> Any:
    values = {}
    for field in dataclasses.fields(cls):
        if "tag" in field.metadata:
            continue
        kind = classify_field(field)
        nullable = type(None) in typing.get_args(field.type)
        # kio types uuids as nullable, but writes None as the zero uuid.
        if nullable and field.metadata.get("kafka_type") != "uuid":
            values[field.name] = None
        elif isinstance(kind, (EntityField, EntityTupleField)):
            entity = _generic(kind.type_, counter)
            values[field.name] = (entity,) if kind.is_array else entity
        else:
            value = _primitive(field.metadata["kafka_type"], kind.type_, field.name, counter)
            values[field.name] = (value,) if kind.is_array else value
    return cls(**values)


def _primitive(kafka_type: str, type_: type, name: str, counter: Any) -> Any:
    if kafka_type == "string":
        return type_(name)
    if kafka_type in ("int8", "int16", "int32", "int64"):
        return type_(next(counter))
    if kafka_type == "bool":
        return True
    if kafka_type == "bytes":
        return name.encode()
    if kafka_type == "uuid":
        return uuid.uuid5(uuid.NAMESPACE_URL, name)
    if kafka_type == "timedelta_i32":
        return i32Timedelta.parse(datetime.timedelta(seconds=next(counter)))
    if kafka_type == "timedelta_i64":
        return i64Timedelta.parse(datetime.timedelta(seconds=next(counter)))
    raise AssertionError(f"no generic value for kafka type {kafka_type!r} (field {name})")


def metadata_request(version: int, names: list[str] | None, auto_create: bool = True) -> Any:
    """Metadata request entity; ``names=None`` is the null list (v1+)."""
    module = request_module(3, version)
    topics = (
        None
        if names is None
        else tuple(make(module.MetadataRequestTopic, name=n, topic_id=None) for n in names)
    )
    return make(
        module.MetadataRequest,
        topics=topics,
        allow_auto_topic_creation=auto_create,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def metadata_request_by_id(topic_id: uuid.UUID) -> Any:
    module = request_module(3, 12)
    return module.MetadataRequest(
        topics=(module.MetadataRequestTopic(topic_id=topic_id, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
