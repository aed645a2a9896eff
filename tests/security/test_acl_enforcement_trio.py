"""ACL enforcement on the group, admin and SCRAM-credential apis, in-process.

The group apis go through the real request path of
tests/coordinator/test_service_trio.py (KafkaChannel over memory streams,
KafkaApis, GroupCoordinatorService with its SQLite store) with the
authorizer switched on and the channel's principal set as SASL would. The
admin apis run on tests/admin/test_apis_trio.py's ``Admin`` registered on a
real ``KafkaApis`` (so they authorize through ``KafkaApis.authorize``); the
SCRAM-credential apis on tests/security/test_sasl_apis_trio.py's ``Broker``.
"""

from __future__ import annotations

import pytest

from pipeline.admin.apis import _CLUSTER_OPERATIONS
from pipeline.coordinator import coordinator as gc
from pipeline.log.manager import LogManager
from pipeline.protocol.apis import BrokerInfo
from pipeline.requests.handler import KafkaApis
from pipeline.security.acl import AclBinding, AclOperation, AclPermissionType, Authorizer, PatternType, ResourceType
from tests.admin.test_apis_trio import MS, Admin, creatable
from tests.coordinator.test_service_trio import GroupClient, coordinator, nested, patient_clock  # noqa: F401 (fixture)
from tests.security.test_sasl_apis_trio import ALTER_SCRAM, DESCRIBE_SCRAM, Broker, Connection

pytestmark = pytest.mark.trio

NONE, TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH = 0, 29, 30, 31
ADMIN, ALICE = "User:admin", "User:alice"
G, T, C = ResourceType.GROUP, ResourceType.TOPIC, ResourceType.CLUSTER
LIT, PRE, ALLOW = PatternType.LITERAL, PatternType.PREFIXED, AclPermissionType.ALLOW


def allow(rtype: ResourceType, name: str, *operations: AclOperation, pattern: PatternType = LIT) -> list[AclBinding]:
    return [AclBinding(rtype, name, pattern, ALICE, "*", op, ALLOW) for op in operations]


async def test_group_apis_need_group_and_topic_acls(patient_clock, tmp_path):
    """Kafka KafkaApis.handle{FindCoordinator,JoinGroup,SyncGroup,Heartbeat,LeaveGroup,OffsetCommit,
    OffsetFetch,DescribeGroups,ListGroups,DeleteGroups,OffsetDelete}Request: alice may Read and Describe
    group "g", Delete group "d" and Read topic "t"; group "h" and topic "u" are not hers."""
    async with coordinator(tmp_path) as (b, _service, _connect):
        await b.apis.catalog.create("u", 1, {})
        b.apis.authorizer = Authorizer(
            allow(G, "g", AclOperation.READ, AclOperation.DESCRIBE) + allow(G, "d", AclOperation.DELETE)
            + allow(T, "t", AclOperation.READ), super_users={ADMIN})

        async def connect(principal: str) -> GroupClient:
            client, channel = await b.connect()
            channel.principal = principal
            return GroupClient(client)

        admin, alice = await connect(ADMIN), await connect(ALICE)
        # The super user makes group "h" (a live member) and "d" (offsets only).
        h = await admin.join("h")
        assert h.error_code == gc.NONE
        assert await admin.commit("d", {("t", 0): 3, ("u", 0): 4}) == {("t", 0): gc.NONE, ("u", 0): gc.NONE}

        found = await alice.call("find_coordinator", 4, key_type=0, coordinator_keys=("g", "h"))
        assert [(c.key, int(c.error_code)) for c in found.coordinators] == [("g", NONE), ("h", GROUP_AUTH)]
        found_v3 = await alice.call("find_coordinator", 3, key="h", key_type=0)
        assert (int(found_v3.error_code), int(found_v3.node_id)) == (GROUP_AUTH, -1)

        denied_join = await alice.response(await alice.send_join("h", "some-member"))
        assert (int(denied_join.error_code), denied_join.member_id) == (GROUP_AUTH, "some-member")
        assert int((await alice.sync("h", h.generation_id, h.member_id)).error_code) == GROUP_AUTH
        assert await alice.heartbeat("h", h.generation_id, h.member_id) == GROUP_AUTH
        left = await alice.call("leave_group", 5, group_id="h", members=(
            nested("leave_group", 5, "MemberIdentity", member_id=h.member_id),))
        assert (int(left.error_code), left.members) == (GROUP_AUTH, ())
        assert await admin.heartbeat("h", h.generation_id, h.member_id) == gc.NONE  # still a member

        mine = await alice.join("g")
        assert mine.error_code == gc.NONE
        assert int((await alice.sync("g", mine.generation_id, mine.member_id, {mine.member_id: b""})).error_code) \
            == gc.NONE
        committed = await alice.commit("g", {("t", 0): 7, ("u", 0): 8}, mine.generation_id, mine.member_id)
        assert committed == {("t", 0): gc.NONE, ("u", 0): TOPIC_AUTH}
        assert await alice.commit("h", {("t", 0): 1}) == {("t", 0): GROUP_AUTH}

        fetched = await alice.call("offset_fetch", 8, require_stable=False, groups=(
            nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id="g", topics=None),
            nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id="h", topics=None)))
        assert [(g.group_id, int(g.error_code)) for g in fetched.groups] == [("g", NONE), ("h", GROUP_AUTH)]
        assert {(t.name, int(p.committed_offset)) for t in fetched.groups[0].topics for p in t.partitions} == {
            ("t", 7)}
        # Before v8 the group's error is the response's; asked partitions of a topic alice may
        # not Describe ("u") are TOPIC_AUTHORIZATION_FAILED.
        old = await alice.call("offset_fetch", 7, group_id="d", require_stable=False, topics=None)
        assert int(old.error_code) == GROUP_AUTH
        named = await alice.call("offset_fetch", 7, group_id="g", require_stable=False, topics=tuple(
            nested("offset_fetch", 7, "OffsetFetchRequestTopic", name=n, partition_indexes=(0,)) for n in "tu"))
        assert int(named.error_code) == NONE
        assert {(t.name, int(p.error_code), int(p.committed_offset)) for t in named.topics for p in t.partitions} \
            == {("t", NONE, 7), ("u", TOPIC_AUTH, -1)}

        described = await alice.call("describe_groups", 5, groups=("g", "h"),
                                     include_authorized_operations=False)
        assert [(d.group_id, int(d.error_code)) for d in described.groups] == [("g", NONE), ("h", GROUP_AUTH)]
        assert described.groups[0].group_state == "Stable" and len(described.groups[0].members) == 1
        assert (described.groups[1].group_state, described.groups[1].members) == ("", ())

        listed = await alice.call("list_groups", 4, states_filter=())
        # "h" left out, not refused; "d" listed: Delete implies Describe (AclAuthorizer).
        assert sorted(g.group_id for g in listed.groups) == ["d", "g"]
        everything = await admin.call("list_groups", 4, states_filter=())
        assert sorted(g.group_id for g in everything.groups) == ["d", "g", "h"]

        deleted = await alice.call("delete_groups", 2, groups_names=("h", "d"))
        assert [(r.group_id, int(r.error_code)) for r in deleted.results] == [("h", GROUP_AUTH), ("d", NONE)]
        # OffsetDelete: GROUP Delete on "g" is missing; on "d" (now gone) Delete is allowed.
        refused = await alice.call("offset_delete", 0, group_id="g", topics=(
            nested("offset_delete", 0, "OffsetDeleteRequestTopic", name="t",
                   partitions=(nested("offset_delete", 0, "OffsetDeleteRequestPartition", partition_index=0),)),))
        assert (int(refused.error_code), refused.topics) == (GROUP_AUTH, ())


async def test_offset_delete_needs_topic_read(patient_clock, tmp_path):
    """Kafka KafkaApis.handleOffsetDeleteRequest: with GROUP Delete, topics without TOPIC Read are
    TOPIC_AUTHORIZATION_FAILED per partition and keep their offsets."""
    async with coordinator(tmp_path) as (b, service, _connect):
        await b.apis.catalog.create("u", 1, {})
        b.apis.authorizer = Authorizer(allow(G, "d", AclOperation.DELETE) + allow(T, "t", AclOperation.READ),
                                       super_users={ADMIN})
        admin_client, admin_channel = await b.connect()
        admin_channel.principal = ADMIN
        alice_client, alice_channel = await b.connect()
        alice_channel.principal = ALICE
        admin, alice = GroupClient(admin_client), GroupClient(alice_client)
        await admin.commit("d", {("t", 0): 3, ("u", 0): 4})

        def topic(name: str):
            return nested("offset_delete", 0, "OffsetDeleteRequestTopic", name=name, partitions=(
                nested("offset_delete", 0, "OffsetDeleteRequestPartition", partition_index=0),))

        result = await alice.call("offset_delete", 0, group_id="d", topics=(topic("t"), topic("u")))
        assert int(result.error_code) == NONE
        assert {(t.name, int(p.error_code)) for t in result.topics for p in t.partitions} == {
            ("t", NONE), ("u", TOPIC_AUTH)}
        assert await admin.fetch("d", None) == {("u", 0): 4}


async def test_group_apis_unchanged_without_an_authorizer(autojump_clock, tmp_path):
    """No authorizer (the default): an anonymous principal may do everything."""
    async with coordinator(tmp_path) as (b, _service, connect):
        assert b.apis.authorizer is None
        c = await connect()
        assert await c.commit("any", {("t", 0): 1}) == {("t", 0): gc.NONE}
        assert [g.group_id for g in (await c.call("list_groups", 4, states_filter=())).groups] == ["any"]


def admin_with_authorizer(tmp_path, authorizer: Authorizer) -> tuple[Admin, KafkaApis]:
    a = Admin(tmp_path)
    kafka_apis = KafkaApis(BrokerInfo(7, "127.0.0.1", 9092, "cluster-x"), a.catalog, LogManager(),
                           persister=None, first_producer_id=1, authorizer=authorizer)  # type: ignore[arg-type]
    a.apis.register(kafka_apis)
    return a, kafka_apis


async def test_admin_apis_need_topic_and_cluster_acls(tmp_path, monkeypatch):
    """Kafka ControllerApis.createTopics/deleteTopics/createPartitions, KafkaApis.handleDescribeConfigsRequest,
    handleIncrementalAlterConfigsRequest and AuthHelper.computeDescribeClusterResponse."""
    authorizer = Authorizer(allow(T, "a-", AclOperation.CREATE, pattern=PRE) + allow(T, "a-1", AclOperation.DELETE),
                            super_users={ADMIN})
    a, _ = admin_with_authorizer(tmp_path, authorizer)
    from tests.admin import test_apis_trio
    from tests.security.test_acl_apis_trio import PrincipalRecorder

    principal = {"name": ALICE}
    monkeypatch.setattr(test_apis_trio, "Recorder", lambda: PrincipalRecorder(principal["name"]))

    created = await a.call(19, 7, timeout=MS, validate_only=False, topics=[creatable("a-1"), creatable("b-1")])
    results = {t.name: t for t in created.topics}
    assert {n: int(t.error_code) for n, t in results.items()} == {"a-1": NONE, "b-1": TOPIC_AUTH}
    assert results["b-1"].error_message == "Authorization failed."
    # Created, but alice may not DescribeConfigs it: no configs (KIP-525 topic_config_error_code).
    assert (int(results["a-1"].topic_config_error_code), results["a-1"].configs) == (TOPIC_AUTH, None)
    assert a.catalog.all_topics() == {"a-1": 2}

    principal["name"] = ADMIN  # a super user: CLUSTER Create
    assert int((await a.call(19, 7, timeout=MS, validate_only=False,
                             topics=[creatable("b-1")])).topics[0].error_code) == NONE
    principal["name"] = ALICE

    deleted = await a.call(20, 6, timeout=MS, topics=[{"name": "b-1", "topic_id": None},
                                                      {"name": "a-1", "topic_id": None}])
    assert [(r.name, int(r.error_code)) for r in deleted.responses] == [("b-1", TOPIC_AUTH), ("a-1", NONE)]
    assert a.catalog.all_topics() == {"b-1": 2}

    more = await a.call(37, 3, timeout=MS, validate_only=False, topics=[{"name": "b-1", "count": 4,
                                                                          "assignments": None}])
    assert int(more.results[0].error_code) == TOPIC_AUTH and a.catalog.partitions("b-1") == 2

    described = await a.call(32, 4, include_synonyms=False, include_documentation=False, resources=[
        {"resource_type": 2, "resource_name": "b-1", "configuration_keys": None},
        {"resource_type": 4, "resource_name": "", "configuration_keys": None}])
    assert [(int(r.error_code), r.configs) for r in described.results] == [(TOPIC_AUTH, ()), (CLUSTER_AUTH, ())]

    altered = await a.call(44, 1, validate_only=False, resources=[
        {"resource_type": 2, "resource_name": "b-1",
         "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}]},
        {"resource_type": 4, "resource_name": "7", "configs": []}])
    assert [int(r.error_code) for r in altered.responses] == [TOPIC_AUTH, CLUSTER_AUTH]
    assert a.catalog.retention("b-1")[0] != 1

    # DescribeCluster is never refused; its KIP-430 operations need CLUSTER Describe.
    cluster = await a.call(60, 1, include_cluster_authorized_operations=True, endpoint_type=1)
    assert (int(cluster.error_code), int(cluster.cluster_authorized_operations)) == (NONE, 0)
    principal["name"] = ADMIN
    cluster = await a.call(60, 1, include_cluster_authorized_operations=True, endpoint_type=1)
    assert int(cluster.cluster_authorized_operations) == _CLUSTER_OPERATIONS


async def test_cluster_describe_config_acl_shows_broker_configs(tmp_path, monkeypatch):
    authorizer = Authorizer(allow(C, "kafka-cluster", AclOperation.DESCRIBE_CONFIGS)
                            + allow(C, "kafka-cluster", AclOperation.DESCRIBE))
    a, _ = admin_with_authorizer(tmp_path, authorizer)
    from tests.admin import test_apis_trio
    from tests.security.test_acl_apis_trio import PrincipalRecorder

    monkeypatch.setattr(test_apis_trio, "Recorder", lambda: PrincipalRecorder(ALICE))
    described = await a.call(32, 4, include_synonyms=False, include_documentation=False, resources=[
        {"resource_type": 4, "resource_name": "", "configuration_keys": ["num.partitions"]}])
    assert int(described.results[0].error_code) == NONE
    assert [c.name for c in described.results[0].configs] == ["num.partitions"]
    cluster = await a.call(60, 1, include_cluster_authorized_operations=True, endpoint_type=1)
    assert int(cluster.cluster_authorized_operations) == (1 << 8) | (1 << 10)


async def test_scram_credential_apis_need_cluster_describe_and_alter(tmp_path):
    """Kafka KafkaApis.handleDescribeUserScramCredentialsRequest (CLUSTER Describe) and
    ControllerApis.handleAlterUserScramCredentials (CLUSTER Alter)."""
    broker = Broker(tmp_path)
    broker.apis.authorizer = Authorizer(super_users={ADMIN})
    alice = Connection("PLAINTEXT")
    alice.principal = ALICE
    described = await broker.call(alice, DESCRIBE_SCRAM, 0, users=[{"name": "alice"}])
    assert int(described.error_code) == CLUSTER_AUTH
    assert [(r.user, int(r.error_code), r.credential_infos) for r in described.results] == [
        ("alice", CLUSTER_AUTH, ())]
    altered = await broker.call(alice, ALTER_SCRAM, 0, deletions=[{"name": "alice", "mechanism": 1}],
                                upsertions=[])
    assert [(r.user, int(r.error_code)) for r in altered.results] == [("alice", CLUSTER_AUTH)]
    assert broker.users.users() == {"alice": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 4096}}

    admin = Connection("PLAINTEXT")
    admin.principal = ADMIN
    assert int((await broker.call(admin, DESCRIBE_SCRAM, 0, users=None)).error_code) == NONE
    altered = await broker.call(admin, ALTER_SCRAM, 0, deletions=[{"name": "alice", "mechanism": 1}],
                                upsertions=[])
    assert [(r.user, int(r.error_code)) for r in altered.results] == [("alice", NONE)]
    assert broker.users.users() == {"alice": {"SCRAM-SHA-512": 4096}}
