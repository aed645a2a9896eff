"""ACL apis and enforcement in-process: principals set directly on the channel.

The ACL apis are called as the admin api tests call theirs (a recording
connection, kio-encoded frames, kio-decoded answers). Produce and Fetch go
through the real request path of tests/requests/test_handler_trio.py and
tests/log/test_fetch_trio.py (KafkaChannel over memory streams, persister,
WAL, in-memory sink), with the authorizer switched on.
"""

from __future__ import annotations

import datetime

import pytest
import trio
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32

from pipeline.bench.frames import encode_request
from pipeline.protocol.header import parse_request_header
from pipeline.network.request_channel import Request
from pipeline.security.acl import (AclBinding, AclOperation, AclPermissionType, Authorizer,
                                   PatternType, ResourceType)
from pipeline.requests.acl_apis import AclApis
from pipeline.security.acl_store import AclStore
from tests.admin.test_apis_trio import Recorder, _build
from tests.e2e import raw_client as rc
from tests.log import test_fetch_trio as ft
from tests.requests.test_handler_trio import NO_TIMEOUT_MS, broker, eventually
from tests.coordinator.test_service_trio import patient_clock  # noqa: F401 (a fixture)

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader
from pipeline.protocol.header import response_header_version

pytestmark = pytest.mark.trio

NONE, TOPIC_AUTH, CLUSTER_AUTH, INVALID_REQUEST, SECURITY_DISABLED = 0, 29, 31, 42, 54
ADMIN, ALICE = "User:admin", "User:alice"
T, LIT, PRE = ResourceType.TOPIC, PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


class PrincipalRecorder(Recorder):
    def __init__(self, principal: str, host: str = "10.0.0.1") -> None:
        super().__init__()
        self.principal, self.peer_host = principal, host


async def call(acl_apis: AclApis, api_key: int, version: int, principal: str = ADMIN, **fields):
    entity = _build(load_request_schema(api_key, version), fields)
    frame = encode_request(entity, 1, "acl-test")[4:]
    connection = PrincipalRecorder(principal)
    handler = {29: acl_apis.describe_acls, 30: acl_apis.create_acls, 31: acl_apis.delete_acls}[api_key]
    await handler(Request(connection, parse_request_header(frame), frame, 0))
    assert len(connection.completed) == 1
    offset = 4 + (1 if response_header_version(api_key, version) >= 1 else 0)
    return entity_reader(load_response_schema(api_key, version))(connection.completed[0][1], offset)[0]


def creation(name, op, perm, principal=ALICE, pattern=LIT, rtype=T, host="*"):
    return {"resource_type": int(rtype), "resource_name": name, "resource_pattern_type": int(pattern),
            "principal": principal, "host": host, "operation": int(op), "permission_type": int(perm)}


def acl_filter(name=None, pattern=PatternType.ANY, principal=None, rtype=ResourceType.ANY):
    return {"resource_type_filter": int(rtype), "resource_name_filter": name, "pattern_type_filter": int(pattern),
            "principal_filter": principal, "host_filter": None, "operation": int(AclOperation.ANY),
            "permission_type": int(AclPermissionType.ANY)}


async def test_acl_apis_answer_security_disabled_without_an_authorizer():
    off = AclApis(None)
    assert int((await call(off, 29, 3, **acl_filter())).error_code) == SECURITY_DISABLED
    created = await call(off, 30, 3, creations=[creation("t", AclOperation.WRITE, ALLOW)])
    assert [int(r.error_code) for r in created.results] == [SECURITY_DISABLED]
    deleted = await call(off, 31, 3, filters=[acl_filter()])
    assert [int(r.error_code) for r in deleted.filter_results] == [SECURITY_DISABLED]


async def test_create_describe_delete_and_persistence(tmp_path):
    path = tmp_path / "_pipeline" / "acls.db"
    acl_apis = AclApis(Authorizer(super_users={ADMIN}), AclStore(path))
    created = await call(acl_apis, 30, 3, creations=[
        creation("orders", AclOperation.WRITE, ALLOW), creation("orders-", AclOperation.READ, ALLOW, pattern=PRE),
        creation("orders", AclOperation.WRITE, DENY, host="10.0.0.9"), creation("x", AclOperation.ANY, ALLOW),
        creation("x", AclOperation.READ, ALLOW, principal="alice")])
    assert [int(r.error_code) for r in created.results] == [NONE, NONE, NONE, INVALID_REQUEST, INVALID_REQUEST]

    # MATCH: every ACL that applies to topic "orders-eu".
    described = await call(acl_apis, 29, 3, **acl_filter("orders-eu", PatternType.MATCH, rtype=T))
    assert int(described.error_code) == NONE
    assert [(r.resource_name, int(r.pattern_type), [(a.principal, int(a.operation)) for a in r.acls])
            for r in described.resources] == [("orders-", int(PRE), [(ALICE, int(AclOperation.READ))])]
    everything = await call(acl_apis, 29, 1, **acl_filter())  # v1 too
    assert sum(len(r.acls) for r in everything.resources) == 3

    # Alice is neither a super user nor allowed CLUSTER Alter/Describe.
    refused = await call(acl_apis, 30, 3, principal=ALICE, creations=[creation("y", AclOperation.ALL, ALLOW)])
    assert [int(r.error_code) for r in refused.results] == [CLUSTER_AUTH]
    assert int((await call(acl_apis, 29, 3, principal=ALICE, **acl_filter())).error_code) == CLUSTER_AUTH
    assert [int(r.error_code) for r in (await call(acl_apis, 31, 3, principal=ALICE,
                                                   filters=[acl_filter()])).filter_results] == [CLUSTER_AUTH]

    deleted = await call(acl_apis, 31, 3, filters=[acl_filter("orders", LIT)])
    [result] = deleted.filter_results
    assert int(result.error_code) == NONE
    assert sorted((m.host, int(m.permission_type)) for m in result.matching_acls) == [
        ("*", int(ALLOW)), ("10.0.0.9", int(DENY))]

    # A restart: the store has exactly what the answered requests left.
    reopened = Authorizer(AclStore(path).load())
    assert reopened.acls == [AclBinding(T, "orders-", PRE, ALICE, "*", AclOperation.READ, ALLOW)]


async def test_cluster_alter_acl_lets_a_non_super_user_manage_acls():
    authorizer = Authorizer([AclBinding(ResourceType.CLUSTER, "kafka-cluster", LIT, ALICE, "*",
                                        AclOperation.ALTER, ALLOW)])
    acl_apis = AclApis(authorizer)
    created = await call(acl_apis, 30, 2, principal=ALICE, creations=[creation("t", AclOperation.READ, ALLOW)])
    assert [int(r.error_code) for r in created.results] == [NONE]
    # Describe is implied by Alter (AclAuthorizer).
    assert int((await call(acl_apis, 29, 2, principal=ALICE, **acl_filter())).error_code) == NONE


def two_topic_produce(correlation_id: int) -> bytes:
    request = ProduceRequest(
        transactional_id=None, acks=i16(-1), timeout=datetime.timedelta(milliseconds=NO_TIMEOUT_MS),
        topic_data=(
            TopicProduceData(name="t", partition_data=(
                PartitionProduceData(index=i32(0), records=rc.record_batch([b"denied-0"])),
                PartitionProduceData(index=i32(1), records=rc.record_batch([b"denied-1"])))),
            TopicProduceData(name="u", partition_data=(
                PartitionProduceData(index=i32(0), records=rc.record_batch([b"allowed"])),)),
        ))
    return rc.frame(request, correlation_id)


async def test_produce_without_write_is_refused_and_never_stored(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        await b.apis.catalog.create("u", 1, {})
        b.apis.authorizer = Authorizer([
            AclBinding(T, "*", LIT, ALICE, "*", AclOperation.WRITE, ALLOW),
            AclBinding(T, "t", LIT, ALICE, "*", AclOperation.WRITE, DENY)])
        client, channel = await b.connect()
        channel.authenticated(ALICE)
        await client.send(two_topic_produce(1))
        await client.wait_responses(1)
        response = rc.decode_produce_response(client.responses[0][1])
        results = {(t.name, int(p.index)): (int(p.error_code), int(p.base_offset))
                   for t in response.responses for p in t.partition_responses}
        assert results == {("t", 0): (TOPIC_AUTH, -1), ("t", 1): (TOPIC_AUTH, -1), ("u", 0): (NONE, 0)}
        await eventually(lambda: len(b.sink.rows()) == 1)
        await trio.sleep(5)
        assert [(r["topic"], r["value"]) for r in b.sink.rows()] == [("u", b"allowed")]
        assert b.apis.logs.log_end_offset("t", 0) == 0  # never sequenced

        # Another principal with no ACL at all: denied (allow.everyone.if.no.acl.found is false).
        other, other_channel = await b.connect()
        assert other_channel.principal == "User:ANONYMOUS"
        await other.send(rc.frame(rc.produce("u", [b"anon"], timeout_ms=NO_TIMEOUT_MS), 2))
        await other.wait_responses(1)
        assert int(rc.decode_produce_response(other.responses[0][1]).responses[0]
                   .partition_responses[0].error_code) == TOPIC_AUTH


async def test_metadata_hides_and_refuses_topics_without_describe(autojump_clock, tmp_path):
    from kio.schema.metadata.v9.response import MetadataResponse
    from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic

    def metadata(cid: int, *names: str | None) -> bytes:
        topics = None if names == (None,) else tuple(MetadataRequestTopic(name=n) for n in names)
        return rc.frame(MetadataRequest(topics=topics, allow_auto_topic_creation=True,
                                        include_cluster_authorized_operations=False,
                                        include_topic_authorized_operations=False), cid)

    def topics(body: bytes) -> dict[str, int]:
        assert body[0] == 0  # response header v1: no tagged fields
        response, _ = entity_reader(MetadataResponse)(body, 1)
        return {t.name: int(t.error_code) for t in response.topics}

    async with broker(tmp_path) as b:
        await b.apis.catalog.create("u", 1, {})
        b.apis.authorizer = Authorizer([AclBinding(T, "u", LIT, ALICE, "*", AclOperation.READ, ALLOW),
                                        AclBinding(T, "new", LIT, ALICE, "*", AclOperation.DESCRIBE, ALLOW)])
        client, channel = await b.connect()
        channel.authenticated(ALICE)
        await client.send(metadata(1, None) + metadata(2, "t", "u", "new"))
        await client.wait_responses(2)
        assert topics(client.responses[0][1]) == {"u": NONE}  # "t" left out of the listing
        # "t": no Describe; "new": Describe but neither CLUSTER nor TOPIC Create, so not auto-created.
        assert topics(client.responses[1][1]) == {"t": TOPIC_AUTH, "u": NONE, "new": TOPIC_AUTH}
        assert b.apis.catalog.partitions("new") is None


async def test_fetch_and_list_offsets_need_read_and_describe(autojump_clock, tmp_path):
    async with ft.broker(tmp_path) as b:
        await b.apis.catalog.create("u", 1, {})
        client, _ = await b.connect()
        await client.send(rc.frame(rc.produce("t", [b"secret"], timeout_ms=NO_TIMEOUT_MS), 1)
                          + rc.frame(rc.produce("u", [b"open"], timeout_ms=NO_TIMEOUT_MS), 2))
        await client.wait_responses(2)
        b.apis.authorizer = Authorizer([AclBinding(T, "u", LIT, ALICE, "*", AclOperation.READ, ALLOW)])
        reader, channel = await b.connect()
        channel.authenticated(ALICE)
        await reader.send(ft.fetch(3, ("t", 0, 0), ("u", 0, 0)))
        await reader.wait_responses(1)
        got = ft.fetched(reader.responses[0][1])
        assert got[("t", 0)][0] == TOPIC_AUTH and got[("t", 0)][2] == []
        assert got[("u", 0)][0] == NONE and got[("u", 0)][2] == [(0, b"open")]


async def test_transactions_need_transactional_id_write(patient_clock, tmp_path):  # noqa: F811
    # Kafka handleProduceRequest / handleInitProducerId: a transactional id needs TRANSACTIONAL_ID Write.
    from pipeline.coordinator.coordinator import GroupConfig
    from pipeline.coordinator.service import GroupCoordinatorService
    from pipeline.requests.txn_apis import TransactionApis
    from tests.coordinator.test_service_trio import GroupClient

    async with broker(tmp_path) as b:
        groups = GroupCoordinatorService(b.apis, GroupConfig(), tmp_path / "groups.db")
        groups.register()
        await b.nursery.start(groups.run)
        txn = TransactionApis(b.apis, groups, tmp_path / "transactions.db")
        txn.register()
        await b.nursery.start(txn.run)
        b.apis.authorizer = Authorizer([
            AclBinding(T, "*", LIT, ALICE, "*", AclOperation.WRITE, ALLOW),
            AclBinding(ResourceType.TRANSACTIONAL_ID, "mine", LIT, ALICE, "*", AclOperation.WRITE, ALLOW)])
        raw, channel = await b.connect()
        channel.authenticated(ALICE)
        c = GroupClient(raw)
        timeout = datetime.timedelta(seconds=60)
        refused = await c.call("init_producer_id", 5, transactional_id="theirs", transaction_timeout=timeout,
                               producer_id=-1, producer_epoch=-1)
        assert int(refused.error_code) == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        allowed = await c.call("init_producer_id", 5, transactional_id="mine", transaction_timeout=timeout,
                               producer_id=-1, producer_epoch=-1)
        assert int(allowed.error_code) == NONE
        produce = ProduceRequest(
            transactional_id="theirs", acks=i16(-1), timeout=datetime.timedelta(milliseconds=NO_TIMEOUT_MS),
            topic_data=(TopicProduceData(name="t", partition_data=(
                PartitionProduceData(index=i32(0), records=rc.record_batch([b"x"])),)),))
        await raw.send(rc.frame(produce, 99))
        await raw.wait_until(lambda: any(cid == 99 for cid, _ in raw.responses))
        body = next(p for cid, p in raw.responses if cid == 99)
        assert int(rc.decode_produce_response(body).responses[0].partition_responses[0].error_code) == 53
        assert b.apis.logs.log_end_offset("t", 0) == 0  # never sequenced
        txn.close()
        groups.close()
        await groups.wait_closed()
