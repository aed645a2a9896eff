"""The group apis in-process: KafkaChannel -> RequestChannel -> RequestHandler -> KafkaApis -> GroupCoordinatorService.

The server's middle comes from ``tests.requests.test_handler_trio.broker``
(real channels over memory streams, topic "t" with 2 partitions); the
coordinator service runs in its nursery with a real SQLite store in
tmp_path. Requests are kio entities of the exact version under test.

Time is a MockClock. Offset writes run in a worker thread, and pytest-trio's
``autojump_clock`` would jump to the next coordinator deadline (a session
timeout) while one runs; tests that commit inside a live group use
``patient_clock`` (jumps only after 0.3 s of real idleness) instead.
"""

from __future__ import annotations

import datetime
import importlib
import itertools
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberMetadata_v0
from kio.serial import entity_reader
from kio.static.constants import EntityType

from pipeline.coordinator import coordinator as gc
from pipeline.coordinator.coordinator import GroupConfig, GroupCoordinator
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.protocol import apis
from tests.e2e import raw_client as rc
from tests.requests.test_handler_trio import broker

pytestmark = pytest.mark.trio

SUBSCRIPTION = ConsumerProtocolMemberMetadata_v0(0, ["t"], b"").encode()


@pytest.fixture
def patient_clock():
    return trio.testing.MockClock(autojump_threshold=0.3)


def _module(api: str, version: int, kind: str) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def _entity(module: Any, kind: EntityType) -> type:
    return next(v for v in vars(module).values()
                if isinstance(v, type) and getattr(v, "__type__", None) is kind and v.__module__ == module.__name__)


def req(api: str, version: int, **fields: Any) -> Any:
    """The request entity of ``api`` at ``version``; fields the version lacks are dropped."""
    return apis.make(_entity(_module(api, version, "request"), EntityType.request), **fields)


def nested(api: str, version: int, entity_name: str, **fields: Any) -> Any:
    return apis.make(getattr(_module(api, version, "request"), entity_name), **fields)


def decode(api: str, version: int, payload: bytes) -> Any:
    cls = _entity(_module(api, version, "response"), EntityType.response)
    offset = 1 if cls.__flexible__ else 0  # response header v1: empty tagged fields
    entity, _ = entity_reader(cls)(payload, offset)
    return entity


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class GroupClient:
    """One connection speaking raw group requests."""

    _ids = itertools.count(1)

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: dict[int, tuple[str, int]] = {}

    async def send(self, api: str, version: int, entity: Any, client_id: str = "client") -> int:
        cid = next(self._ids)
        self.sent[cid] = (api, version)
        await self.client.send(rc.frame(entity, cid, client_id))
        return cid

    def answered(self, cid: int) -> bool:
        return any(c == cid for c, _ in self.client.responses)

    async def response(self, cid: int) -> Any:
        await self.client.wait_until(lambda: self.answered(cid) or self.client.eof)
        payload = next(p for c, p in self.client.responses if c == cid)
        return decode(*self.sent[cid], payload)

    async def call(self, api: str, version: int, **fields: Any) -> Any:
        return await self.response(await self.send(api, version, req(api, version, **fields)))

    # -- the classic protocol, latest versions

    async def send_join(self, group: str, member_id: str = "", *, version: int = 9, session: int = 10_000,
                        instance_id: str | None = None, protocols: tuple = ()) -> int:
        protocols = protocols or (nested("join_group", version, "JoinGroupRequestProtocol",
                                         name="range", metadata=SUBSCRIPTION),)
        return await self.send("join_group", version, req(
            "join_group", version, group_id=group, session_timeout=ms(session), rebalance_timeout=ms(30_000),
            member_id=member_id, group_instance_id=instance_id, protocol_type="consumer", protocols=protocols))

    async def join(self, group: str, **kw: Any) -> Any:
        """JoinGroup v9 with the KIP-394 round trip; returns the final answer."""
        first = await self.response(await self.send_join(group, **kw))
        assert first.error_code == gc.MEMBER_ID_REQUIRED and first.member_id
        return await self.response(await self.send_join(group, first.member_id, **kw))

    async def sync(self, group: str, generation: int, member_id: str, assignments: dict[str, bytes] | None = None,
                   version: int = 5) -> Any:
        return await self.call("sync_group", version, group_id=group, generation_id=generation, member_id=member_id,
                               protocol_type="consumer", protocol_name="range", assignments=tuple(
                                   nested("sync_group", version, "SyncGroupRequestAssignment", member_id=m,
                                          assignment=a) for m, a in (assignments or {}).items()))

    async def heartbeat(self, group: str, generation: int, member_id: str, version: int = 4) -> int:
        r = await self.call("heartbeat", version, group_id=group, generation_id=generation, member_id=member_id)
        return int(r.error_code)

    async def commit(self, group: str, offsets: dict[tuple[str, int], int], generation: int = -1,
                     member_id: str = "", version: int = 8) -> dict[tuple[str, int], int]:
        by_topic: dict[str, list] = {}
        for (t, p), o in offsets.items():
            by_topic.setdefault(t, []).append(nested("offset_commit", version, "OffsetCommitRequestPartition",
                                                     partition_index=p, committed_offset=o,
                                                     committed_metadata="meta"))
        r = await self.call("offset_commit", version, group_id=group, generation_id_or_member_epoch=generation,
                            member_id=member_id, topics=tuple(
                                nested("offset_commit", version, "OffsetCommitRequestTopic", name=t,
                                       partitions=tuple(ps)) for t, ps in by_topic.items()))
        return {(t.name, int(p.partition_index)): int(p.error_code) for t in r.topics for p in t.partitions}

    async def fetch(self, group: str, partitions: list[tuple[str, int]] | None,
                    version: int = 8) -> dict[tuple[str, int], int]:
        topics = None
        if partitions is not None:
            topic_cls = "OffsetFetchRequestTopics" if version >= 8 else "OffsetFetchRequestTopic"
            by_topic: dict[str, list[int]] = {}
            for t, p in partitions:
                by_topic.setdefault(t, []).append(p)
            topics = tuple(nested("offset_fetch", version, topic_cls, name=t, partition_indexes=tuple(ps))
                           for t, ps in by_topic.items())
        if version >= 8:
            r = await self.call("offset_fetch", version, groups=(
                nested("offset_fetch", version, "OffsetFetchRequestGroup", group_id=group, topics=topics),))
            assert len(r.groups) == 1 and r.groups[0].error_code == gc.NONE
            result_topics = r.groups[0].topics
        else:
            r = await self.call("offset_fetch", version, group_id=group, topics=topics)
            result_topics = r.topics
        return {(t.name, int(p.partition_index)): int(p.committed_offset) for t in result_topics for p in t.partitions}


@asynccontextmanager
async def coordinator(tmp_path, *, delay_ms: int = 0, store: str = "groups.db", max_buffer_bytes: int = 64 << 20):
    """(broker, service, connect) with the service registered and running."""
    async with broker(tmp_path, max_buffer_bytes=max_buffer_bytes) as b:
        counter = itertools.count()
        state = GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=delay_ms),
                                 new_member_id=lambda prefix: f"{prefix}-{next(counter)}")
        service = GroupCoordinatorService(b.apis, state.config, tmp_path / store, coordinator=state)
        service.register()
        await b.nursery.start(service.run)

        async def connect() -> GroupClient:
            client, _channel = await b.connect()
            return GroupClient(client)

        try:
            yield b, service, connect
        finally:
            service.close()
            await service.wait_closed()


async def test_two_members_join_after_the_initial_delay_sync_and_heartbeat(patient_clock, tmp_path):
    # patient_clock, as the module docstring advises for live groups: under load this test hung once
    # with the autojump clock (600 s, the traceback in the coordinator's timer loop).
    async with coordinator(tmp_path, delay_ms=3000) as (_b, _s, connect):
        c1, c2 = await connect(), await connect()
        start = trio.current_time()
        first1 = await c1.response(await c1.send_join("g"))
        assert first1.error_code == gc.MEMBER_ID_REQUIRED
        j1 = await c1.send_join("g", first1.member_id)
        first2 = await c2.response(await c2.send_join("g"))
        j2 = await c2.send_join("g", first2.member_id)
        r1, r2 = await c1.response(j1), await c2.response(j2)
        # group.initial.rebalance.delay.ms (3 s), extended once by 3 s because a second
        # member arrived during it (Kafka InitialDelayedJoin).
        assert trio.current_time() - start == pytest.approx(6.0)
        assert r1.error_code == r2.error_code == gc.NONE
        assert r1.generation_id == r2.generation_id == 1
        assert r1.leader == r2.leader == r1.member_id
        assert r1.protocol_name == "range" and r1.protocol_type == "consumer"
        assert sorted(m.member_id for m in r1.members) == sorted([r1.member_id, r2.member_id])
        assert r2.members == ()
        # The follower's SyncGroup waits for the leader's.
        s2 = await c2.send("sync_group", 5, req("sync_group", 5, group_id="g", generation_id=1,
                                                 member_id=r2.member_id, assignments=()))
        await trio.sleep(1)
        assert not c2.answered(s2)
        s1 = await c1.sync("g", 1, r1.member_id, {r1.member_id: b"one", r2.member_id: b"two"})
        assert (s1.error_code, s1.assignment) == (gc.NONE, b"one")
        s2r = await c2.response(s2)
        assert (s2r.error_code, s2r.assignment, s2r.protocol_name) == (gc.NONE, b"two", "range")
        assert await c1.heartbeat("g", 1, r1.member_id) == gc.NONE
        assert await c2.heartbeat("g", 0, r2.member_id) == gc.ILLEGAL_GENERATION


async def test_a_pending_join_blocks_neither_its_connection_nor_others(autojump_clock, tmp_path):
    """The handler moves on while JoinGroup waits; responses stay in request order per connection."""
    async with coordinator(tmp_path, delay_ms=5000) as (_b, _s, connect):
        c1, c2 = await connect(), await connect()
        join = await c1.send_join("g", version=3)  # v3: no KIP-394 round trip, waits for the delay
        hb = await c1.send("heartbeat", 4, req("heartbeat", 4, group_id="g", generation_id=0, member_id="x"))
        started = trio.current_time()
        found = await c2.call("find_coordinator", 4, key_type=0, coordinator_keys=("g",))
        assert trio.current_time() == started  # the other connection is answered at once
        assert (found.coordinators[0].node_id, found.coordinators[0].port) == (0, 9092)
        assert not c1.answered(join) and not c1.answered(hb)  # hb handled, but answered after the join
        r = await c1.response(join)
        assert r.error_code == gc.NONE and trio.current_time() - started == pytest.approx(5.0)
        assert int((await c1.response(hb)).error_code) == gc.UNKNOWN_MEMBER_ID
        assert [cid for cid, _ in c1.client.responses] == [join, hb]


async def test_silent_member_is_removed_after_its_session_timeout(patient_clock, tmp_path):
    # patient_clock: the SyncGroup answers wait for the membership's write in a worker thread, over which
    # the autojump clock would run the sessions out.
    async with coordinator(tmp_path) as (_b, _s, connect):
        c1, c2 = await connect(), await connect()
        j1 = await c1.response(await c1.send_join("g", version=3, session=6000))
        assert j1.error_code == gc.NONE
        # c2 joins: rebalance; c1 rejoins; both in generation 2.
        pending = await c2.send_join("g", version=3, session=6000)
        assert await c1.heartbeat("g", 1, j1.member_id) == gc.REBALANCE_IN_PROGRESS
        j1b = await c1.response(await c1.send_join("g", j1.member_id, version=3, session=6000))
        j2 = await c2.response(pending)
        assert j1b.generation_id == j2.generation_id == 2
        follower_sync = await c2.send("sync_group", 5, req("sync_group", 5, group_id="g", generation_id=2,
                                                           member_id=j2.member_id, assignments=()))
        await c1.sync("g", 2, j1.member_id, {j1.member_id: b"a", j2.member_id: b"b"})
        assert (await c2.response(follower_sync)).assignment == b"b"
        t0 = trio.current_time()
        # c1 heartbeats every 2 s, c2 is silent from now on.
        errors = []
        while trio.current_time() - t0 < 8:
            await trio.sleep(2)
            errors.append(await c1.heartbeat("g", 2, j1.member_id))
        assert errors[:2] == [gc.NONE, gc.NONE] and gc.REBALANCE_IN_PROGRESS in errors
        j1c = await c1.response(await c1.send_join("g", j1.member_id, version=3, session=6000))
        assert j1c.generation_id == 3 and [m.member_id for m in j1c.members] == [j1.member_id]


async def test_offsets_commit_fetch_unknown_topic_and_survive_a_new_service(autojump_clock, tmp_path):
    async with coordinator(tmp_path) as (_b, service, connect):
        c = await connect()
        assert await c.fetch("simple", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): -1}
        errors = await c.commit("simple", {("t", 0): 42, ("t", 1): 7, ("nope", 0): 1, ("t", 5): 3})
        assert errors == {("t", 0): gc.NONE, ("t", 1): gc.NONE, ("nope", 0): gc.UNKNOWN_TOPIC_OR_PARTITION,
                          ("t", 5): gc.UNKNOWN_TOPIC_OR_PARTITION}
        assert service.writes == 1
        assert await c.fetch("simple", [("t", 0), ("t", 1)]) == {("t", 0): 42, ("t", 1): 7}
        assert await c.fetch("simple", None) == {("t", 0): 42, ("t", 1): 7}
        listed = await c.call("list_groups", 4, states_filter=())
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("simple", "Empty")]
    # A new service on the same file: the offsets and the group are back.
    async with coordinator(tmp_path) as (_b, _service, connect):
        c = await connect()
        assert await c.fetch("simple", [("t", 0), ("t", 1)], version=1) == {("t", 0): 42, ("t", 1): 7}
        assert [g.group_id for g in (await c.call("list_groups", 0)).groups] == ["simple"]


async def test_commit_inside_a_group_checks_generation_and_member(patient_clock, tmp_path):
    async with coordinator(tmp_path) as (_b, _s, connect):
        c = await connect()
        j = await c.join("g")
        assert await c.commit("g", {("t", 0): 1}, generation=j.generation_id,
                              member_id=j.member_id) == {("t", 0): gc.REBALANCE_IN_PROGRESS}  # before SyncGroup
        await c.sync("g", j.generation_id, j.member_id, {j.member_id: b""})
        assert await c.commit("g", {("t", 0): 1}, generation=j.generation_id,
                              member_id=j.member_id) == {("t", 0): gc.NONE}
        assert await c.commit("g", {("t", 0): 2}, generation=j.generation_id + 1,
                              member_id=j.member_id) == {("t", 0): gc.ILLEGAL_GENERATION}
        assert await c.commit("g", {("t", 0): 3}) == {("t", 0): gc.UNKNOWN_MEMBER_ID}
        assert await c.fetch("g", [("t", 0)]) == {("t", 0): 1}
        described = (await c.call("describe_groups", 5, groups=("g", "ghost"),
                                  include_authorized_operations=False)).groups
        assert [(d.group_id, d.group_state, d.protocol_data) for d in described] == [
            ("g", "Stable", "range"), ("ghost", "Dead", "")]
        assert described[0].members[0].client_host == "/10.0.0.1"
        # A live group cannot be deleted; once it is empty it can, offsets and all.
        deleted = await c.call("delete_groups", 2, groups_names=("g", "ghost"))
        assert [(r.group_id, int(r.error_code)) for r in deleted.results] == [
            ("g", gc.NON_EMPTY_GROUP), ("ghost", gc.GROUP_ID_NOT_FOUND)]
        left = await c.call("leave_group", 5, group_id="g", members=(
            nested("leave_group", 5, "MemberIdentity", member_id=j.member_id),))
        assert left.error_code == gc.NONE and [int(m.error_code) for m in left.members] == [gc.NONE]
        await trio.sleep(1)  # the join phase after the leave ends: Empty
        deleted = await c.call("delete_groups", 2, groups_names=("g",))
        assert [int(r.error_code) for r in deleted.results] == [gc.NONE]
        assert await c.fetch("g", [("t", 0)]) == {("t", 0): -1}
    async with coordinator(tmp_path) as (_b, _s, connect):
        c = await connect()
        assert await c.fetch("g", [("t", 0)]) == {("t", 0): -1}  # the deletion was durable


async def test_offset_delete_refuses_topics_a_live_member_subscribes_to(patient_clock, tmp_path):
    async with coordinator(tmp_path) as (_b, _s, connect):
        c = await connect()
        await c.commit("g", {("t", 0): 5, ("t", 1): 6})
        j = await c.join("g")
        r = await c.call("offset_delete", 0, group_id="g", topics=(nested(
            "offset_delete", 0, "OffsetDeleteRequestTopic", name="t", partitions=(
                nested("offset_delete", 0, "OffsetDeleteRequestPartition", partition_index=0),)),))
        assert r.error_code == gc.NONE
        assert [int(p.error_code) for p in r.topics[0].partitions] == [gc.GROUP_SUBSCRIBED_TO_TOPIC]
        await c.call("leave_group", 1, group_id="g", member_id=j.member_id)
        await trio.sleep(1)
        r = await c.call("offset_delete", 0, group_id="g", topics=(nested(
            "offset_delete", 0, "OffsetDeleteRequestTopic", name="t", partitions=(
                nested("offset_delete", 0, "OffsetDeleteRequestPartition", partition_index=0),)),))
        assert [int(p.error_code) for p in r.topics[0].partitions] == [gc.NONE]
        assert await c.fetch("g", [("t", 0), ("t", 1)]) == {("t", 0): -1, ("t", 1): 6}
        r = await c.call("offset_delete", 0, group_id="nope", topics=())
        assert r.error_code == gc.GROUP_ID_NOT_FOUND


async def test_shutdown_answers_pending_joins_and_syncs(autojump_clock, tmp_path):
    async with broker(tmp_path) as b:
        service = GroupCoordinatorService(b.apis, GroupConfig(initial_rebalance_delay_ms=60_000),
                                          tmp_path / "groups.db")
        service.register()
        await b.nursery.start(service.run)
        client, _ = await b.connect()
        c = GroupClient(client)
        join = await c.send_join("g", version=3)
        await trio.sleep(1)
        assert not c.answered(join)
        service.close()
        with trio.fail_after(1):
            await service.wait_closed()
        assert (await c.response(join)).error_code == gc.NOT_COORDINATOR
        # After close: refused, not hung.
        assert (await c.response(await c.send_join("g", version=3))).error_code == gc.COORDINATOR_NOT_AVAILABLE


async def test_find_coordinator_for_transactions_is_not_available(autojump_clock, tmp_path):
    async with coordinator(tmp_path) as (_b, _s, connect):
        c = await connect()
        r = await c.call("find_coordinator", 3, key="tx", key_type=1)
        assert r.error_code == gc.COORDINATOR_NOT_AVAILABLE and r.node_id == -1
        r = await c.call("find_coordinator", 4, key_type=0, coordinator_keys=("a", "b"))
        assert [(x.key, int(x.error_code), x.host) for x in r.coordinators] == [
            ("a", gc.NONE, "127.0.0.1"), ("b", gc.NONE, "127.0.0.1")]


# ------------------------------------------------------------- every served version

GROUP_APIS = {
    "find_coordinator": apis.FIND_COORDINATOR, "join_group": apis.JOIN_GROUP, "sync_group": apis.SYNC_GROUP,
    "heartbeat": apis.HEARTBEAT, "leave_group": apis.LEAVE_GROUP, "offset_commit": apis.OFFSET_COMMIT,
    "offset_fetch": apis.OFFSET_FETCH, "describe_groups": apis.DESCRIBE_GROUPS, "list_groups": apis.LIST_GROUPS,
    "delete_groups": apis.DELETE_GROUPS, "offset_delete": apis.OFFSET_DELETE,
}


def served_versions() -> list[tuple[str, int]]:
    return [(api, v) for api, key in GROUP_APIS.items()
            for v in range(apis.SUPPORTED_VERSIONS[key][0], apis.SUPPORTED_VERSIONS[key][1] + 1)]


async def test_every_advertised_version_of_every_group_api_is_answered(autojump_clock, tmp_path):
    """ApiVersions lists exactly what is served: each (api, version) in SUPPORTED_VERSIONS gets a
    decodable answer with the error code Kafka gives."""
    async with coordinator(tmp_path) as (_b, _s, connect):
        c = await connect()
        seen = []
        for api, v in served_versions():
            g = f"{api}-v{v}"
            if api == "find_coordinator":
                fields = dict(key_type=0, coordinator_keys=(g,)) if v >= 4 else dict(key=g, key_type=0)
                r = await c.call(api, v, **fields)
                node = r.coordinators[0] if v >= 4 else r
                assert (int(node.error_code), node.node_id, node.host, node.port) == (0, 0, "127.0.0.1", 9092)
            elif api == "join_group":
                r = await c.response(await c.send_join(g, version=v, instance_id="i" if v >= 5 else None))
                # v4+ dynamic members would get MEMBER_ID_REQUIRED; static ones (v5+) and v0-3 join at once.
                assert int(r.error_code) == (gc.MEMBER_ID_REQUIRED if v == 4 else gc.NONE)
                if v != 4:
                    assert r.generation_id == 1 and r.leader == r.member_id and len(r.members) == 1
            elif api == "sync_group":
                r = await c.call(api, v, group_id=g, generation_id=1, member_id="m", assignments=())
                assert int(r.error_code) == gc.UNKNOWN_MEMBER_ID
            elif api == "heartbeat":
                assert await c.heartbeat(g, 1, "m", version=v) == gc.UNKNOWN_MEMBER_ID
            elif api == "leave_group":
                if v >= 3:
                    r = await c.call(api, v, group_id=g, members=(
                        nested(api, v, "MemberIdentity", member_id="m"),))
                    assert int(r.error_code) == gc.NONE and [int(m.error_code) for m in r.members] == [
                        gc.UNKNOWN_MEMBER_ID]
                else:
                    r = await c.call(api, v, group_id=g, member_id="m")
                    assert int(r.error_code) == gc.UNKNOWN_MEMBER_ID
            elif api == "offset_commit":
                assert await c.commit("sweep", {("t", 0): v}, version=v) == {("t", 0): gc.NONE}
            elif api == "offset_fetch":
                assert await c.fetch("sweep", [("t", 0), ("t", 1)], version=v) == {("t", 0): 8, ("t", 1): -1}
                if v >= 2:
                    assert await c.fetch("sweep", None, version=v) == {("t", 0): 8}
            elif api == "describe_groups":
                r = await c.call(api, v, groups=("sweep",), include_authorized_operations=False)
                assert [(d.group_id, d.group_state, int(d.error_code)) for d in r.groups] == [("sweep", "Empty", 0)]
            elif api == "list_groups":
                r = await c.call(api, v, states_filter=("Empty",))
                assert int(r.error_code) == gc.NONE and "sweep" in [x.group_id for x in r.groups]
            elif api == "delete_groups":
                r = await c.call(api, v, groups_names=(g,))
                assert [int(x.error_code) for x in r.results] == [gc.GROUP_ID_NOT_FOUND]
            elif api == "offset_delete":
                r = await c.call(api, v, group_id=g, topics=())
                assert int(r.error_code) == gc.GROUP_ID_NOT_FOUND
            seen.append((api, v))
        assert seen == served_versions() and {api for api, _v in seen} == set(GROUP_APIS)


async def test_in_a_cluster_each_group_has_one_coordinator(autojump_clock, tmp_path):
    """pipeline.cluster.membership: FindCoordinator names crc32(group) % N's broker with its address; group
    requests for a group another broker coordinates answer NOT_COORDINATOR."""
    from dataclasses import replace

    from pipeline.cluster.membership import Cluster, parse_brokers

    cluster = Cluster(parse_brokers("0@127.0.0.1:9092,1@10.0.0.2:9093"), 0)
    groups = [f"g{i}" for i in range(20)]
    mine = next(g for g in groups if cluster.coordinates(g))
    theirs = next(g for g in groups if not cluster.coordinates(g))
    async with coordinator(tmp_path) as (b, _s, connect):
        b.apis.broker = replace(b.apis.broker, cluster=cluster)
        c = await connect()
        r = await c.call("find_coordinator", 4, key_type=0, coordinator_keys=(mine, theirs))
        assert [(x.key, int(x.error_code), int(x.node_id), x.host, int(x.port)) for x in r.coordinators] == [
            (mine, gc.NONE, 0, "127.0.0.1", 9092), (theirs, gc.NONE, 1, "10.0.0.2", 9093)]
        assert (await c.response(await c.send_join(theirs))).error_code == gc.NOT_COORDINATOR
        assert await c.heartbeat(theirs, 1, "m") == gc.NOT_COORDINATOR
        assert await c.commit(theirs, {("t", 0): 5}) == {("t", 0): gc.NOT_COORDINATOR}
        r = await c.call("offset_fetch", 8, groups=(
            nested("offset_fetch", 8, "OffsetFetchRequestGroup", group_id=theirs, topics=None),))
        assert r.groups[0].error_code == gc.NOT_COORDINATOR
        joined = await c.join(mine)  # the group this broker coordinates works as before
        assert joined.error_code == gc.NONE


async def test_a_stable_groups_membership_is_stored_and_a_coordinator_loading_it_knows_the_members(
        patient_clock, tmp_path):
    """Group metadata across a coordinator move: the leader's SyncGroup makes the group Stable, and the
    SyncGroup answers go out once its membership is in the offset store; another coordinator on that
    store (``load_groups``, as a broker taking the group's ``__consumer_offsets`` partition over) has it Stable at that generation
    with the same members, whose heartbeats it answers NONE rather than UNKNOWN_MEMBER_ID."""
    from pipeline.coordinator.offset_store import OffsetStore

    async with coordinator(tmp_path, delay_ms=3000) as (b, _s, connect):
        # the other broker's coordinator runs already (its timers idle): it loads the group later
        other = GroupCoordinatorService(b.apis, GroupConfig(), tmp_path / "groups.db")
        await b.nursery.start(other.run)
        c1, c2 = await connect(), await connect()
        first1 = await c1.response(await c1.send_join("g"))
        j1 = await c1.send_join("g", first1.member_id)
        first2 = await c2.response(await c2.send_join("g"))
        j2 = await c2.send_join("g", first2.member_id)
        r1, r2 = await c1.response(j1), await c2.response(j2)
        ids = {r1.member_id, r2.member_id}
        s2 = await c2.send("sync_group", 5, req("sync_group", 5, group_id="g", generation_id=r1.generation_id,
                                                 member_id=r2.member_id, protocol_type="consumer",
                                                 protocol_name="range", assignments=()))
        await c1.sync("g", r1.generation_id, r1.member_id, {r1.member_id: b"one", r2.member_id: b"two"})
        await c2.response(s2)
        store = OffsetStore(tmp_path / "groups.db")
        try:  # the SyncGroup answers came once the generation was stored (Kafka doSyncGroup)
            assert "g" in await trio.to_thread.run_sync(store.memberships)
        finally:
            store.close()

        with trio.fail_after(30):
            while not await other.load_groups(lambda group: group == "g"):
                await trio.sleep(0.1)
        group = other.state.groups["g"]
        assert group.state.value == "Stable" and group.generation_id == r1.generation_id
        assert set(group.members) == ids and group.leader_id == r1.member_id
        assert group.members[r2.member_id].assignment == b"two"
        assert other.state.heartbeat(trio.current_time() * 1000, group_id="g", generation_id=r1.generation_id,
                                     member_id=r2.member_id, instance_id=None) == gc.NONE
        # a member that does not carry on (it died with the old coordinator) is removed a session later
        with trio.fail_after(120):
            while r1.member_id in other.state.groups["g"].members:
                await trio.sleep(1)
        other.close()
        await other.wait_closed()


async def test_the_hand_off_barrier_stores_a_membership_change_the_writer_has_not_taken_yet(patient_clock, tmp_path):
    """``sync_writes`` (what a coordinator handing a ``__consumer_offsets`` partition over waits for)
    covers the membership changes made before it, also one the membership writer has not taken yet:
    the new coordinator then loads the latest generation, not an older one (whose members' heartbeats
    would be answered ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID)."""
    import json

    from pipeline.coordinator.coordinator import GroupMembership, StoredMember
    from pipeline.coordinator.offset_store import OffsetStore

    async with coordinator(tmp_path) as (_b, service, _connect):
        membership = GroupMembership(3, "consumer", "range", "m-1", (
            StoredMember("m-1", None, "client", "/127.0.0.1", 10_000, 30_000, (("range", b"\x00"),), b"one"),))
        service.state.membership_changes["g"] = membership  # made, the writer not told yet
        await service.sync_writes()
        store = OffsetStore(tmp_path / "groups.db")
        try:
            stored = await trio.to_thread.run_sync(store.memberships)
        finally:
            store.close()
        assert GroupMembership.from_json(json.loads(stored["g"])) == membership


async def test_a_broker_of_a_cluster_loads_at_start_only_the_groups_it_coordinates(patient_clock, tmp_path):
    """One store for the cluster's coordinators: a broker starting loads the groups of the
    ``__consumer_offsets`` partitions it leads, not the others (their members heartbeat another
    coordinator: here their sessions would run out and the group be stored Empty over that
    coordinator's membership). ``load_groups`` called before the service runs is kept for its start."""
    import json

    from pipeline.cluster.membership import OFFSETS_TOPIC, DynamicCluster, offsets_partition
    from pipeline.coordinator.coordinator import GroupMembership, StoredMember
    from pipeline.coordinator.offset_store import OffsetStore, StoreMembership
    from pipeline.metadata.leadership import Leadership

    mine = "group-a"
    other = next(f"group-{n}" for n in range(1000) if offsets_partition(f"group-{n}") != offsets_partition(mine))
    early = next(f"group-{n}" for n in range(1000)
                 if offsets_partition(f"group-{n}") not in (offsets_partition(mine), offsets_partition(other)))
    membership = GroupMembership(1, "consumer", "range", "m-1", (
        StoredMember("m-1", None, "client", "/127.0.0.1", 10_000, 30_000, (("range", b"\x00"),), b""),))
    store = OffsetStore(tmp_path / "groups.db")
    try:
        store.write([StoreMembership(g, "consumer", json.dumps(membership.to_json())) for g in (mine, other, early)])
    finally:
        store.close()
    view = DynamicCluster(0, "127.0.0.1", 9092)
    view.member = True
    view.leaders = {(OFFSETS_TOPIC, offsets_partition(mine)): Leadership(0, 1)}
    view.loaded = {(OFFSETS_TOPIC, offsets_partition(mine))}
    async with broker(tmp_path, cluster=view) as b:
        service = GroupCoordinatorService(b.apis, GroupConfig(), tmp_path / "groups.db")
        assert await service.load_groups(lambda g: g == early) == 0  # before it runs
        await b.nursery.start(service.run)
        assert set(service.state.groups) == {mine, early}
        assert service.state.groups[mine].state.value == "Stable"
        service.close()
        await service.wait_closed()


async def test_the_sync_group_answers_wait_until_the_generation_is_stored(patient_clock, tmp_path):
    """Kafka's doSyncGroup answers once the group metadata is appended: here the SyncGroup answers of a
    generation wait for its membership's write (held back below, as a slow disk would), so a
    generation a member was told of is the one a coordinator taking the group over loads."""
    import threading

    async with coordinator(tmp_path) as (_b, service, connect):
        assert service._store is not None
        write, release = service._store.write, threading.Event()

        def slow_write(operations):
            if any(type(op).__name__ == "StoreMembership" for op in operations):
                release.wait(30)
            return write(operations)

        service._store.write = slow_write  # type: ignore[method-assign]
        c = await connect()
        joined = await c.join("g")
        sent = await c.send("sync_group", 5, req("sync_group", 5, group_id="g", generation_id=joined.generation_id,
                                                  member_id=joined.member_id, protocol_type="consumer",
                                                  protocol_name="range", assignments=(
                                                      nested("sync_group", 5, "SyncGroupRequestAssignment",
                                                             member_id=joined.member_id, assignment=b"a"),)))
        with trio.move_on_after(2):
            await c.response(sent)
        assert not c.answered(sent)  # Stable, its membership not stored yet
        release.set()
        assert (await c.response(sent)).assignment == b"a"
        assert "g" in (await trio.to_thread.run_sync(service._store.memberships))
