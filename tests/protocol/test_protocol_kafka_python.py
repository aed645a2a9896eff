"""Interop with kafka-python 3's own protocol classes (the wire code its
clients use, generated from Kafka's JSON schemas): its request bytes decode
here (every served api, every version both sides have), our response bytes
decode there (the producer's apis), and the versions it negotiates from our
ApiVersions answer are the ones we serve. No network: bytes in, bytes out."""

from __future__ import annotations

import dataclasses
import datetime
import uuid

import pytest

from kafka.protocol.admin import CreateAclsRequest
from kafka.protocol.admin import CreatePartitionsRequest
from kafka.protocol.admin import DeleteAclsRequest
from kafka.protocol.admin import DescribeAclsRequest
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.admin import DeleteGroupsRequest
from kafka.protocol.admin import DeleteTopicsRequest
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.admin import DescribeConfigsRequest
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.admin import IncrementalAlterConfigsRequest
from kafka.protocol.admin import ListGroupsRequest
from kafka.protocol.admin import AlterUserScramCredentialsRequest
from kafka.protocol.admin import DescribeUserScramCredentialsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest
from kafka.protocol.sasl import SaslHandshakeRequest
from kafka.protocol.broker_version_data import BrokerVersionData
from kafka.protocol.consumer import ConsumerProtocolSubscription
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.consumer import HeartbeatRequest
from kafka.protocol.consumer import JoinGroupRequest
from kafka.protocol.consumer import LeaveGroupRequest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.consumer import OffsetForLeaderEpochRequest
from kafka.protocol.consumer import OffsetCommitRequest
from kafka.protocol.consumer import OffsetDeleteRequest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.consumer import SyncGroupRequest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.admin import DescribeTransactionsRequest
from kafka.protocol.admin import ListTransactionsRequest
from kafka.protocol.admin import DescribeProducersRequest
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest
from kafka.protocol.producer import AddOffsetsToTxnRequest
from kafka.protocol.producer import AddPartitionsToTxnRequest
from kafka.protocol.producer import EndTxnRequest
from kafka.protocol.producer import InitProducerIdRequest
from kafka.protocol.producer import TxnOffsetCommitRequest
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
from tests.protocol.protocol_helpers import consumer_subscription
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
    # The highest version both sides have (ranges from SUPPORTED_VERSIONS).
    assert data.api_version(ApiVersionsRequest) == both(18)[-1]
    assert data.api_version(MetadataRequest) == both(3)[-1]
    assert data.api_version(produce) == both(0)[-1]
    assert data.api_version(init) == both(22)[-1]
    # kafka-python enables idempotence only for brokers >= 0.11 and zstd for
    # >= 2.1; the version it infers from our answer clears both.
    assert data.broker_version >= (2, 1)


def test_kip511_fallback_as_kafka_python_reads_it() -> None:
    frame = raw_header(18, 7, 44) + b"\x00\x02kp" + b"\x00" + b"\x03ab\x03cd\x00"
    response, _ = api_versions_response(parse_request_header(frame), frame)
    # kafka-python decodes an errored ApiVersions body as v0 whatever it sent.
    decoded = ApiVersionsResponse.decode(response, version=4, header=True)
    assert decoded.error_code == 35
    assert {k.api_key: k.max_version for k in decoded.api_keys}[18] == SUPPORTED_VERSIONS[18][1]


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


# ------------------------------------ read, group and admin apis: kafka-python
# encodes (from its copy of Kafka's JSON schemas), we decode, and every field
# of the decoded kio entity must equal what kafka-python was given.


def versions_in_both(request_cls: type) -> list[int]:
    """The versions we serve that kafka-python's schema also has."""
    low, high = SUPPORTED_VERSIONS[request_cls.API_KEY]
    theirs_low, theirs_high = request_cls.valid_versions
    return list(range(max(low, theirs_low), min(high, theirs_high) + 1))


def decode_theirs(request) -> object:
    frame = framed(request)
    header = parse_request_header(frame)
    assert (header.api_key, header.api_version) == (request.API_KEY, request.API_VERSION)
    return decode_request(header, frame)


def assert_same(ours: object, theirs: object, path: str) -> None:
    """Compare kio entity ``ours`` field by field with kafka-python's
    ``theirs`` (kio names durations without the ``_ms`` suffix and types them
    as timedeltas)."""
    for field in dataclasses.fields(ours):
        value = getattr(ours, field.name)
        where = f"{path}.{field.name}"
        if isinstance(value, datetime.timedelta):
            assert value == datetime.timedelta(milliseconds=getattr(theirs, field.name + "_ms")), where
            continue
        expected = getattr(theirs, field.name)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            assert len(value) == len(expected), where
            for index, (mine, other) in enumerate(zip(value, expected)):
                assert_same(mine, other, f"{where}[{index}]")
        elif dataclasses.is_dataclass(value):
            assert_same(value, expected, where)
        else:
            if isinstance(value, tuple) and expected is not None:
                expected = tuple(expected)
            assert value == expected, (where, value, expected)


def check_decodes_as_given(request) -> object:
    """Decode kafka-python's ``request`` frame; every field must be as given."""
    decoded = decode_theirs(request)
    assert type(decoded).__name__ == request.name
    assert_same(decoded, request, request.name)
    return decoded


@pytest.mark.parametrize("version", versions_in_both(FetchRequest))
def test_fetch(version: int) -> None:
    topic, forgotten = FetchRequest.FetchTopic, FetchRequest.ForgottenTopic
    partition = topic.FetchPartition
    request = FetchRequest(
        version=version,
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=77,
        session_epoch=3,
        topics=[
            topic(topic="events", partitions=[
                partition(partition=0, current_leader_epoch=2, fetch_offset=42, partition_max_bytes=1 << 20),
                partition(partition=2, current_leader_epoch=2, fetch_offset=0, partition_max_bytes=1 << 20),
            ]),
            topic(topic="audit", partitions=[partition(partition=1, fetch_offset=7, partition_max_bytes=4096)]),
        ],
        forgotten_topics_data=[forgotten(topic="old", partitions=[0, 3])],
        rack_id="rack-a",
    )
    decoded = check_decodes_as_given(request)
    assert [(t.topic, [p.fetch_offset for p in t.partitions]) for t in decoded.topics] == [
        ("events", [42, 0]),
        ("audit", [7]),
    ]
    assert decoded.max_wait == datetime.timedelta(milliseconds=500)
    if version >= 7:
        assert (decoded.session_id, decoded.session_epoch) == (77, 3)
        assert decoded.forgotten_topics_data[0].partitions == (0, 3)


@pytest.mark.parametrize("version", versions_in_both(ListOffsetsRequest))
def test_list_offsets(version: int) -> None:
    topic = ListOffsetsRequest.ListOffsetsTopic
    partition = topic.ListOffsetsPartition
    timestamps = [-2, -1, 1_700_000_000_000] + ([-3] if version >= 7 else [])  # earliest, latest, time, max
    request = ListOffsetsRequest(
        version=version,
        replica_id=-1,
        isolation_level=1,
        topics=[topic(name="events", partitions=[
            partition(partition_index=index, current_leader_epoch=-1, timestamp=timestamp)
            for index, timestamp in enumerate(timestamps)
        ])],
    )
    decoded = check_decodes_as_given(request)
    assert [p.timestamp for p in decoded.topics[0].partitions] == timestamps


@pytest.mark.parametrize("version", versions_in_both(JoinGroupRequest))
def test_join_group(version: int) -> None:
    subscription = ConsumerProtocolSubscription(topics=["events", "audit"], user_data=None)
    metadata = bytes(subscription.encode(version=0))
    assert metadata == consumer_subscription("events", "audit")  # our sample's metadata bytes
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    request = JoinGroupRequest(
        version=version,
        group_id="orders",
        session_timeout_ms=45_000,
        rebalance_timeout_ms=300_000,
        member_id="kafka-python-1-0f3c",
        group_instance_id="orders-1",
        protocol_type="consumer",
        protocols=[protocol(name="range", metadata=metadata), protocol(name="roundrobin", metadata=b"")],
        reason="joining",
    )
    decoded = check_decodes_as_given(request)
    assert [(p.name, p.metadata) for p in decoded.protocols] == [("range", metadata), ("roundrobin", b"")]


@pytest.mark.parametrize("version", versions_in_both(SyncGroupRequest))
def test_sync_group(version: int) -> None:
    assignment = SyncGroupRequest.SyncGroupRequestAssignment
    request = SyncGroupRequest(
        version=version,
        group_id="orders",
        generation_id=4,
        member_id="leader-1",
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments=[
            assignment(member_id="leader-1", assignment=b"\x00\x00\x00\x00\x00\x01"),
            assignment(member_id="follower-2", assignment=b""),
        ],
    )
    decoded = check_decodes_as_given(request)
    assert [a.member_id for a in decoded.assignments] == ["leader-1", "follower-2"]


@pytest.mark.parametrize("version", versions_in_both(OffsetCommitRequest))
def test_offset_commit(version: int) -> None:
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    partition = topic.OffsetCommitRequestPartition
    request = OffsetCommitRequest(
        version=version,
        group_id="orders",
        generation_id_or_member_epoch=4,
        member_id="kafka-python-1-0f3c",
        group_instance_id="orders-1",
        retention_time_ms=-1,
        topics=[topic(name="events", partitions=[
            partition(partition_index=0, committed_offset=42, committed_leader_epoch=2, committed_metadata=""),
            partition(partition_index=1, committed_offset=7, committed_leader_epoch=-1, committed_metadata=None),
        ])],
    )
    decoded = check_decodes_as_given(request)
    assert [(p.committed_offset, p.committed_metadata) for p in decoded.topics[0].partitions] == [
        (42, ""),
        (7, None),
    ]


@pytest.mark.parametrize("version", versions_in_both(OffsetFetchRequest))
def test_offset_fetch(version: int) -> None:
    if version >= 8:  # several groups per request (KIP-709)
        group = OffsetFetchRequest.OffsetFetchRequestGroup
        topics = group.OffsetFetchRequestTopics
        request = OffsetFetchRequest(version=version, require_stable=True, groups=[
            group(group_id="orders", topics=[topics(name="events", partition_indexes=[0, 1])]),
            group(group_id="billing", topics=None),  # null: every topic
        ])
    else:
        topic = OffsetFetchRequest.OffsetFetchRequestTopic
        request = OffsetFetchRequest(
            version=version,
            group_id="orders",
            topics=[topic(name="events", partition_indexes=[0, 1])],
            require_stable=True,
        )
    decoded = check_decodes_as_given(request)
    topic = decoded.groups[0].topics[0] if version >= 8 else decoded.topics[0]
    assert (topic.name, topic.partition_indexes) == ("events", (0, 1))


@pytest.mark.parametrize("version", versions_in_both(CreateTopicsRequest))
def test_create_topics(version: int) -> None:
    topic = CreateTopicsRequest.CreatableTopic
    request = CreateTopicsRequest(
        version=version,
        topics=[
            topic(name="events", num_partitions=3, replication_factor=1, assignments=[], configs=[
                topic.CreatableTopicConfig(name="retention.ms", value="604800000"),
                topic.CreatableTopicConfig(name="segment.bytes", value=None),
            ]),
            topic(name="manual", num_partitions=-1, replication_factor=-1, configs=[], assignments=[
                topic.CreatableReplicaAssignment(partition_index=0, broker_ids=[1]),
            ]),
        ],
        timeout_ms=30_000,
        validate_only=True,
    )
    decoded = check_decodes_as_given(request)
    assert [(c.name, c.value) for c in decoded.topics[0].configs] == [
        ("retention.ms", "604800000"),
        ("segment.bytes", None),
    ]


@pytest.mark.parametrize("version", versions_in_both(IncrementalAlterConfigsRequest))
def test_incremental_alter_configs(version: int) -> None:
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    config = resource.AlterableConfig
    request = IncrementalAlterConfigsRequest(
        version=version,
        resources=[resource(resource_type=2, resource_name="events", configs=[
            config(name="retention.ms", config_operation=0, value="86400000"),  # SET
            config(name="cleanup.policy", config_operation=1, value=None),  # DELETE
        ])],
        validate_only=False,
    )
    decoded = check_decodes_as_given(request)
    assert [c.config_operation for c in decoded.resources[0].configs] == [0, 1]


# The rest: one request each, every field compared.
OTHER_REQUESTS = {
    HeartbeatRequest: dict(group_id="orders", generation_id=4, member_id="m-1", group_instance_id="orders-1"),
    LeaveGroupRequest: dict(group_id="orders", member_id="m-1", members=[
        LeaveGroupRequest.MemberIdentity(member_id="m-1", group_instance_id="orders-1", reason="shutdown"),
    ]),
    FindCoordinatorRequest: dict(key="orders", key_type=0, coordinator_keys=["orders", "billing"]),
    DescribeGroupsRequest: dict(groups=["orders", "billing"], include_authorized_operations=True),
    ListGroupsRequest: dict(states_filter=["Stable", "Empty"], types_filter=["classic"]),
    DeleteGroupsRequest: dict(groups_names=["orders", "billing"]),
    OffsetDeleteRequest: dict(group_id="orders", topics=[
        OffsetDeleteRequest.OffsetDeleteRequestTopic(name="events", partitions=[
            OffsetDeleteRequest.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=2),
        ]),
    ]),
    DeleteTopicsRequest: dict(topic_names=["events", "audit"], timeout_ms=30_000, topics=[
        DeleteTopicsRequest.DeleteTopicState(name="events", topic_id=uuid.UUID(int=7)),
    ]),
    DescribeConfigsRequest: dict(include_synonyms=True, include_documentation=True, resources=[
        DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=2, resource_name="events", configuration_keys=["retention.ms"]),
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name="1", configuration_keys=None),
    ]),
    CreatePartitionsRequest: dict(timeout_ms=30_000, validate_only=False, topics=[
        CreatePartitionsRequest.CreatePartitionsTopic(name="events", count=6, assignments=None),
        CreatePartitionsRequest.CreatePartitionsTopic(name="audit", count=2, assignments=[
            CreatePartitionsRequest.CreatePartitionsTopic.CreatePartitionsAssignment(broker_ids=[1]),
        ]),
    ]),
    DescribeClusterRequest: dict(include_cluster_authorized_operations=True, endpoint_type=1),
    DescribeAclsRequest: dict(resource_type_filter=2, resource_name_filter="events", pattern_type_filter=4,
                              principal_filter="User:alice", host_filter=None, operation=4, permission_type=3),
    CreateAclsRequest: dict(creations=[CreateAclsRequest.AclCreation(
        resource_type=2, resource_name="events", resource_pattern_type=3, principal="User:alice", host="*",
        operation=4, permission_type=3)]),
    DeleteAclsRequest: dict(filters=[DeleteAclsRequest.DeleteAclsFilter(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter="User:alice",
        host_filter="10.0.0.1", operation=1, permission_type=2)]),
    AddPartitionsToTxnRequest: dict(
        v3_and_below_transactional_id="app", v3_and_below_producer_id=1234, v3_and_below_producer_epoch=3,
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="events", partitions=[0, 2])]),
    AddOffsetsToTxnRequest: dict(transactional_id="app", producer_id=1234, producer_epoch=3, group_id="orders"),
    EndTxnRequest: dict(transactional_id="app", producer_id=1234, producer_epoch=3, committed=True),
    TxnOffsetCommitRequest: dict(
        transactional_id="app", group_id="orders", producer_id=1234, producer_epoch=3, generation_id=7,
        member_id="m-1", group_instance_id=None, topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
            name="events", partitions=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                partition_index=1, committed_offset=42, committed_leader_epoch=-1, committed_metadata="m")])]),
    DescribeTransactionsRequest: dict(transactional_ids=["app", "other"]),
    ListTransactionsRequest: dict(state_filters=["Ongoing"], producer_id_filters=[1234]),
    DescribeProducersRequest: dict(topics=[DescribeProducersRequest.TopicRequest(name="events",
                                                                               partition_indexes=[0, 2])]),
    WriteTxnMarkersRequest: dict(markers=[WriteTxnMarkersRequest.WritableTxnMarker(
        producer_id=1234, producer_epoch=3, transaction_result=False, coordinator_epoch=-1,
        topics=[WriteTxnMarkersRequest.WritableTxnMarker.WritableTxnMarkerTopic(name="events",
                                                                             partition_indexes=[2])])]),
    OffsetForLeaderEpochRequest: dict(replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
        topic="events", partitions=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=2, current_leader_epoch=5, leader_epoch=3)])]),
    SaslHandshakeRequest: dict(mechanism="SCRAM-SHA-256"),
    SaslAuthenticateRequest: dict(auth_bytes=b"n,,n=alice,r=abc"),
    DescribeUserScramCredentialsRequest: dict(users=[DescribeUserScramCredentialsRequest.UserName(name="alice")]),
    AlterUserScramCredentialsRequest: dict(
        deletions=[AlterUserScramCredentialsRequest.ScramCredentialDeletion(name="bob", mechanism=2)],
        upsertions=[AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
            name="alice", mechanism=1, iterations=8192, salt=b"s" * 16, salted_password=b"p" * 32)]),
}


@pytest.mark.parametrize(
    ("request_cls", "version"),
    [(cls, version) for cls in OTHER_REQUESTS for version in versions_in_both(cls)],
    ids=lambda value: value.__name__ if isinstance(value, type) else str(value),
)
def test_other_requests(request_cls: type, version: int) -> None:
    check_decodes_as_given(request_cls(version=version, **OTHER_REQUESTS[request_cls]))


def test_every_served_api_is_checked_against_kafka_python() -> None:
    checked = {cls.API_KEY for cls in OTHER_REQUESTS} | {
        cls.API_KEY
        for cls in (FetchRequest, ListOffsetsRequest, JoinGroupRequest, SyncGroupRequest, OffsetCommitRequest,
                    OffsetFetchRequest, CreateTopicsRequest, IncrementalAlterConfigsRequest)
    }
    assert checked | set(KAFKA_PYTHON_MAX) == set(SUPPORTED_VERSIONS)
