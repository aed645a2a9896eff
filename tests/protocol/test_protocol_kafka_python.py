"""Interop with kafka-python 3's own protocol classes (the wire code its
producer uses): its request bytes decode here, our response bytes decode
there, and the versions it negotiates from our ApiVersions answer are the
ones we serve. No network: bytes in, bytes out."""

from __future__ import annotations

import pytest

from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.producer import InitProducerIdResponse
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.producer import ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from pipeline.protocol import SUPPORTED_VERSIONS
from pipeline.protocol.apis import ADVERTISED_VERSIONS
from pipeline.protocol import BrokerInfo
from pipeline.protocol import PartitionResult
from pipeline.protocol import api_versions_response
from pipeline.protocol import decode_request
from pipeline.protocol import init_producer_id_response
from pipeline.protocol import metadata_response
from pipeline.protocol import parse_request_header
from pipeline.protocol import produce_response
from pipeline.protocol import produce_view
from pipeline.protocol import validate_records
from tests.protocol.protocol_helpers import raw_header

# The caps kafka-python 3.0.12 puts on its producer-path requests
# (producer/sender.py, producer/transaction_manager.py) and its own maxima
# for ApiVersions/Metadata (schemas/resources/*.json).
KAFKA_PYTHON_MAX = {0: 9, 3: 13, 18: 4, 22: 4}
BROKER = BrokerInfo(node_id=1, host="localhost", port=9092, cluster_id="c")


def both(api_key: int) -> list[int]:
    low, high = SUPPORTED_VERSIONS[api_key]
    return list(range(low, min(high, KAFKA_PYTHON_MAX[api_key]) + 1))


def framed(request, correlation_id: int = 3) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="kafka-python-producer-1")
    return bytes(request.encode(header=True))


class OneTopic:
    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        return (0, 2) if name == "events" else (3, 0)

    def all_topics(self) -> dict[str, int]:
        return {"events": 2}


def our_api_versions(version: int = 4):
    request = ApiVersionsRequest(
        version=version, client_software_name="kafka-python", client_software_version="3.0.12"
    )
    frame = framed(request)
    response, software = api_versions_response(parse_request_header(frame), frame)
    return ApiVersionsResponse.decode(response, version=version, header=True), software


@pytest.mark.parametrize("version", both(18))
def test_api_versions(version: int) -> None:
    decoded, software = our_api_versions(version)
    assert decoded.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys} == ADVERTISED_VERSIONS
    assert software == (("kafka-python", "3.0.12") if version >= 3 else None)


def test_negotiated_versions_and_inferred_broker_version() -> None:
    decoded, _ = our_api_versions()
    data = BrokerVersionData(
        api_versions={k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys}
    )
    produce = ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=1, topic_data=[], min_version=0, max_version=9
    )
    init = InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout_ms=0,
        producer_id=-1,
        producer_epoch=-1,
        min_version=0,
        max_version=4,
    )
    assert data.api_version(ApiVersionsRequest) == 4
    assert data.api_version(MetadataRequest) == 12
    assert data.api_version(produce) == 9
    assert data.api_version(init) == 4
    # kafka-python enables idempotence only for brokers >= 0.11 and zstd for
    # >= 2.1; the version it infers from our answer clears both.
    assert data.broker_version >= (2, 1)


def test_kip511_fallback_as_kafka_python_reads_it() -> None:
    frame = raw_header(18, 7, 44) + b"\x00\x02kp" + b"\x00" + b"\x03ab\x03cd\x00"
    response, _ = api_versions_response(parse_request_header(frame), frame)
    # kafka-python decodes an errored ApiVersions body as v0 whatever it sent.
    decoded = ApiVersionsResponse.decode(response, version=4, header=True)
    assert decoded.error_code == 35
    assert {k.api_key: k.max_version for k in decoded.api_keys}[18] == 4


@pytest.mark.parametrize("version", both(3))
def test_metadata(version: int) -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name="events")]
    request = MetadataRequest(
        version=version,
        topics=topics,
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    frame = framed(request)
    header = parse_request_header(frame)
    decoded = decode_request(header, frame)
    assert [t.name for t in decoded.topics] == ["events"]
    response = MetadataResponse.decode(
        metadata_response(header, decoded, BROKER, OneTopic()), version=version, header=True
    )
    assert [b.node_id for b in response.brokers] == [1]
    (topic,) = response.topics
    assert (topic.error_code, topic.name, len(topic.partitions)) == (0, "events", 2)
    assert all(p.leader_id == 1 for p in topic.partitions)


@pytest.mark.parametrize("version", both(22))
def test_init_producer_id(version: int) -> None:
    request = InitProducerIdRequest(
        version=version,
        transactional_id=None,
        transaction_timeout_ms=0,
        producer_id=-1,
        producer_epoch=-1,
    )
    frame = framed(request)
    header = parse_request_header(frame)
    decoded = decode_request(header, frame)
    response = InitProducerIdResponse.decode(
        init_producer_id_response(header, decoded, 5000, 0), version=version, header=True
    )
    assert (response.error_code, response.producer_id, response.producer_epoch) == (0, 5000, 0)


@pytest.mark.parametrize("version", both(0))
def test_produce_idempotent_batch(version: int) -> None:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=16384)
    builder.set_producer_state(5000, 0, 0, False)
    for i in range(10):
        builder.append(timestamp=1_700_000_000_000 + i, key=None, value=b"v%d" % i)
    builder.close()
    records = bytes(builder.buffer())
    topic = ProduceRequest.TopicProduceData
    partition = topic.PartitionProduceData
    request = ProduceRequest(
        version=version,
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[topic(name="events", partition_data=[partition(index=1, records=records)])],
    )
    frame = framed(request, correlation_id=21)
    header = parse_request_header(frame)
    view = produce_view(decode_request(header, frame))
    assert (view.acks, view.timeout_ms) == (-1, 30_000)
    (part,) = view.partitions
    assert (part.topic, part.partition, part.records) == ("events", 1, records)
    info = validate_records(part.records)
    assert (info.record_count, info.producer_id, info.base_sequence, info.last_sequence) == (
        10,
        5000,
        0,
        9,
    )
    response = ProduceResponse.decode(
        produce_response(header, [PartitionResult("events", 1, 0, base_offset=0)]),
        version=version,
        header=True,
    )
    ((name, (p,)),) = [(t.name, t.partition_responses) for t in response.responses]
    assert (name, p.index, p.error_code, p.base_offset) == ("events", 1, 0, 0)
