"""Helpers shared by the protocol tests: building real request frames with
kio's writers and reading responses back with kio's readers.

Named uniquely (not conftest.py) so test modules can import it without
clashing with other test packages' helpers."""

from __future__ import annotations

import datetime
import io
import struct
import uuid

from typing import Any

from kio.index import load_payload_module
from kio.index import load_request_schema
from kio.index import load_response_schema
from kio.schema.request_header.v1 import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2 import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader
from kio.serial import entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import Records
from kio.static.primitive import i16
from kio.static.primitive import i32
from kio.static.primitive import i32Timedelta


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
    """A representative kio request entity for a served (api_key, version)."""
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
    raise AssertionError(f"no sample for api {api_key}")


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