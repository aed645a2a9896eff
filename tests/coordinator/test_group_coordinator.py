"""The sans-I/O GroupCoordinator: plain function calls, times in ms, waiters are strings."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.coordinator import coordinator as gc
from pipeline.coordinator.coordinator import GroupConfig, GroupCoordinator, JoinResult, SyncResult
from pipeline.coordinator.metadata import GroupState

SESSION, REBALANCE = 10_000, 30_000
RANGE = [("range", b"r-meta"), ("roundrobin", b"rr-meta")]


def make(delay_ms: int = 0) -> GroupCoordinator:
    counter = itertools.count()
    return GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=delay_ms),
                            new_member_id=lambda prefix: f"{prefix}-{next(counter)}")


def join(c: GroupCoordinator, waiter: str, now: float, member_id: str = "", *, group: str = "g",
         protocols=RANGE, instance_id: str | None = None, require_known: bool = False,
         session: int = SESSION, rebalance: int = REBALANCE, protocol_type: str = "consumer", client: str = "c"):
    return dict(c.join(waiter, now, group_id=group, member_id=member_id, instance_id=instance_id, client_id=client,
                       client_host="/127.0.0.1", protocol_type=protocol_type, protocols=list(protocols),
                       session_timeout_ms=session, rebalance_timeout_ms=rebalance,
                       require_known_member_id=require_known))


def sync(c: GroupCoordinator, waiter: str, now: float, member_id: str, generation: int, assignments=None,
         group: str = "g", instance_id: str | None = None, protocol_name: str | None = None):
    return dict(c.sync(waiter, now, group_id=group, generation_id=generation, member_id=member_id,
                       instance_id=instance_id, protocol_type=None, protocol_name=protocol_name,
                       assignments=assignments or {}))


def heartbeat(c, now, member_id, generation, group="g", instance_id=None) -> int:
    return c.heartbeat(now, group_id=group, generation_id=generation, member_id=member_id, instance_id=instance_id)


def stable_group(c: GroupCoordinator, n: int, now: float = 0) -> list[str]:
    """n members through join + sync; returns member ids (first is the leader)."""
    for i in range(n):
        assert join(c, f"j{i}", now, client=f"c{i}") == {}
    replies = c.tick(now)
    results = dict(replies)
    ids = [results[f"j{i}"].member_id for i in range(n)]
    leader = results["j0"].leader_id
    assert leader == ids[0]
    gen = results["j0"].generation_id
    for i in [*range(1, n), 0]:  # followers first: they wait for the leader's assignment
        mid = ids[i]
        out = sync(c, f"s{i}", now, mid, gen, {m: m.encode() for m in ids} if mid == leader else None)
        if mid == leader:
            assert {k: v.assignment for k, v in out.items()} == {f"s{k}": ids[k].encode() for k in range(n)}
        else:
            assert out == {}
    assert c.groups["g"].state is GroupState.STABLE
    return ids


def test_first_member_waits_the_initial_delay_then_leads_generation_1():
    c = make(delay_ms=3000)
    assert join(c, "j", 0) == {}
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert c.next_deadline_ms() == 3000
    assert c.tick(2999) == []
    (waiter, result), = c.tick(3000)
    assert waiter == "j" and result.error == gc.NONE and result.generation_id == 1
    assert result.leader_id == result.member_id == "c-0"
    assert result.protocol_name == "range" and result.protocol_type == "consumer"
    assert result.members == (("c-0", None, b"r-meta"),)
    assert c.groups["g"].state is GroupState.COMPLETING_REBALANCE


def test_initial_delay_is_extended_while_members_arrive_up_to_the_rebalance_timeout():
    """Kafka InitialDelayedJoin: each expiry with a new member waits another delay, bounded by rebalance timeout."""
    c = make(delay_ms=3000)
    join(c, "a", 0, rebalance=7000)
    join(c, "b", 1000, rebalance=7000)  # newMemberAdded
    assert c.tick(3000) == []           # extended by min(3000, remaining 4000)
    assert c.next_deadline_ms() == 6000
    join(c, "c", 5000, rebalance=7000)
    assert c.tick(6000) == []           # extended by min(3000, remaining 1000) = 1000
    assert c.next_deadline_ms() == 7000
    results = dict(c.tick(7000))
    assert set(results) == {"a", "b", "c"} and all(r.generation_id == 1 for r in results.values())
    leader = results["a"].leader_id
    assert len(results["a"].members) == 3 and results["b"].members == () and results["c"].leader_id == leader


def test_join_sync_heartbeat_happy_path_and_followers_get_their_assignment():
    c = make()
    a, b, d = stable_group(c, 3)
    assert c.groups["g"].generation_id == 1
    for mid in (a, b, d):
        assert heartbeat(c, 100, mid, 1) == gc.NONE
    assert heartbeat(c, 100, b, 0) == gc.ILLEGAL_GENERATION
    assert heartbeat(c, 100, "nobody", 1) == gc.UNKNOWN_MEMBER_ID
    assert heartbeat(c, 100, a, 1, group="other") == gc.UNKNOWN_MEMBER_ID
    assert heartbeat(c, 100, a, 1, group="") == gc.INVALID_GROUP_ID
    # A Stable member's SyncGroup is answered at once with its assignment.
    out = sync(c, "again", 100, b, 1)
    assert out["again"] == SyncResult(gc.NONE, "consumer", "range", b.encode())


def test_kip394_member_id_required_then_join_with_the_given_id():
    c = make()
    out = join(c, "j1", 0, require_known=True)
    assert out["j1"].error == gc.MEMBER_ID_REQUIRED and out["j1"].member_id == "c-0"
    assert "c-0" in c.groups["g"].pending_members
    assert join(c, "j2", 10, member_id="c-0", require_known=True) == {}
    (w, r), = c.tick(10)
    assert w == "j2" and r.error == gc.NONE and r.member_id == "c-0" and r.leader_id == "c-0"


def test_kip394_pending_id_expires_after_the_session_timeout():
    c = make()
    out = join(c, "j1", 0, require_known=True)
    mid = out["j1"].member_id
    assert c.next_deadline_ms() == SESSION
    assert c.tick(SESSION) == []
    assert "g" not in c.groups or mid not in c.groups["g"].pending_members
    assert join(c, "late", SESSION + 1, member_id=mid)["late"].error == gc.UNKNOWN_MEMBER_ID


def test_pending_kip394_member_holds_the_rebalance_until_it_joins_or_expires():
    c = make()
    a, = stable_group(c, 1)
    out = join(c, "n1", 100, require_known=True)
    new_id = out["n1"].member_id
    # The leader rejoins: not everyone has joined while an id is outstanding.
    assert join(c, "a2", 200, member_id=a) == {}
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    results = join(c, "n2", 300, member_id=new_id)
    assert set(results) == {"a2", "n2"}
    assert results["a2"].generation_id == 2 and len(results["a2"].members) == 2


def test_session_timeout_validation():
    c = make()
    assert join(c, "j", 0, session=5999)["j"].error == gc.INVALID_SESSION_TIMEOUT
    assert join(c, "j", 0, session=1_800_001)["j"].error == gc.INVALID_SESSION_TIMEOUT
    assert join(c, "j", 0, group="")["j"].error == gc.INVALID_GROUP_ID
    assert c.groups == {}


def test_inconsistent_protocols_are_refused():
    c = make()
    stable_group(c, 1)
    assert join(c, "x", 0, protocols=[("sticky", b"")])["x"].error == gc.INCONSISTENT_GROUP_PROTOCOL
    assert join(c, "y", 0, protocol_type="connect")["y"].error == gc.INCONSISTENT_GROUP_PROTOCOL
    assert join(c, "z", 0, group="h", protocols=[])["z"].error == gc.INCONSISTENT_GROUP_PROTOCOL
    assert join(c, "w", 0, group="h2", protocol_type="")["w"].error == gc.INCONSISTENT_GROUP_PROTOCOL


def test_protocol_vote_picks_what_most_members_prefer_among_common_protocols():
    c = make()
    join(c, "a", 0, protocols=[("range", b"a"), ("roundrobin", b"a"), ("sticky", b"a")])
    join(c, "b", 0, protocols=[("roundrobin", b"b"), ("range", b"b")])
    join(c, "d", 0, protocols=[("roundrobin", b"d"), ("range", b"d")])
    results = dict(c.tick(0))
    assert {r.protocol_name for r in results.values()} == {"roundrobin"}
    leader = results["a"]
    assert sorted(md for _m, _i, md in leader.members) == [b"a", b"b", b"d"]


def test_unknown_member_and_join_to_unknown_group_with_member_id():
    c = make()
    assert join(c, "j", 0, member_id="ghost")["j"].error == gc.UNKNOWN_MEMBER_ID
    stable_group(c, 1)
    assert join(c, "j", 0, member_id="ghost")["j"].error == gc.UNKNOWN_MEMBER_ID


def test_new_member_triggers_rebalance_old_members_get_rebalance_in_progress_on_heartbeat():
    c = make()
    a, b = stable_group(c, 2)
    assert join(c, "n", 1000) == {}
    g = c.groups["g"]
    assert g.state is GroupState.PREPARING_REBALANCE and g.join_deadline_ms == 1000 + REBALANCE
    assert heartbeat(c, 1100, a, 1) == gc.REBALANCE_IN_PROGRESS
    assert sync(c, "s", 1100, a, 1)["s"].error == gc.REBALANCE_IN_PROGRESS
    assert join(c, "a2", 1200, member_id=a) == {}
    results = join(c, "b2", 1300, member_id=b)  # everyone has rejoined: complete at once
    assert set(results) == {"n", "a2", "b2"}
    assert all(r.generation_id == 2 for r in results.values())
    assert results["a2"].leader_id == a and len(results["a2"].members) == 3


def test_member_that_heartbeats_but_does_not_rejoin_is_removed_when_the_rebalance_times_out():
    c = make()
    a, b = stable_group(c, 2)
    join(c, "a2", 1000, member_id=a)  # the leader rejoins (forces a rebalance); b never does
    for t in range(2000, 1000 + REBALANCE, 2000):
        assert c.tick(t) == []
        assert heartbeat(c, t, b, 1) == gc.REBALANCE_IN_PROGRESS
    assert c.next_deadline_ms() == 1000 + REBALANCE
    (w, r), = c.tick(1000 + REBALANCE)
    assert w == "a2" and r.generation_id == 2 and [m for m, _i, _md in r.members] == [a]
    assert b not in c.groups["g"].members


def test_session_timeout_removes_a_silent_member_and_rebalances():
    c = make()
    a, b = stable_group(c, 2)
    # a heartbeats, b stays silent
    for t in range(3000, SESSION + 1, 3000):
        assert heartbeat(c, t, a, 1) == gc.NONE
    assert c.tick(SESSION) == []  # b's deadline is SESSION: removed now, group rebalances
    g = c.groups["g"]
    assert b not in g.members and g.state is GroupState.PREPARING_REBALANCE
    assert heartbeat(c, SESSION + 1, a, 1) == gc.REBALANCE_IN_PROGRESS
    results = join(c, "a2", SESSION + 2, member_id=a)
    assert results["a2"].generation_id == 2 and [m for m, _i, _md in results["a2"].members] == [a]


def test_a_member_awaiting_join_does_not_expire_a_silent_one_does_and_the_join_completes():
    c = make()
    a, b = stable_group(c, 2)
    join(c, "a2", 1000, member_id=a)
    assert c.next_deadline_ms() == SESSION   # both sessions end at SESSION
    (w, r), = c.tick(SESSION)                # a waits in the join phase: kept; b: removed, so all have joined
    assert w == "a2" and r.error == gc.NONE and [m for m, _i, _md in r.members] == [a]
    assert c.groups["g"].members[a].heartbeat_deadline_ms == SESSION + SESSION  # restarted by the answer


def test_new_member_join_times_out_after_new_member_join_timeout():
    c = GroupCoordinator(GroupConfig(initial_rebalance_delay_ms=0, new_member_join_timeout_ms=5000))
    a, = stable_group(c, 1)
    # The group rebalances for a new member, but a never rejoins and has a long rebalance timeout.
    join(c, "n", 100, rebalance=60_000)
    assert heartbeat(c, 200, a, 1) == gc.REBALANCE_IN_PROGRESS
    replies = dict(c.tick(5100))
    assert replies["n"].error == gc.UNKNOWN_MEMBER_ID


def test_leader_leaves_a_new_leader_is_elected_and_assignment_moves():
    c = make()
    a, b, d = stable_group(c, 3)
    err, member_errors, replies = c.leave(100, "g", [(a, None)])
    assert (err, member_errors, replies) == (gc.NONE, [gc.NONE], [])
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    join(c, "b2", 200, member_id=b)
    results = join(c, "d2", 300, member_id=d)
    assert results["b2"].leader_id == b and len(results["b2"].members) == 2 and results["d2"].members == ()


def test_leave_errors():
    c = make()
    assert c.leave(0, "nope", [("x", None)]) == (gc.NONE, [gc.UNKNOWN_MEMBER_ID], [])
    assert c.leave(0, "", [("x", None)])[0] == gc.INVALID_GROUP_ID
    a, = stable_group(c, 1)
    assert c.leave(0, "g", [("x", None), (a, None)])[1] == [gc.UNKNOWN_MEMBER_ID, gc.NONE]
    assert c.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert c.tick(REBALANCE) == []
    assert c.groups["g"].state is GroupState.EMPTY and c.groups["g"].generation_id == 2


def test_completing_rebalance_answers_all_syncs_when_the_leader_syncs():
    c = make()
    join(c, "a", 0)
    join(c, "b", 0)
    results = dict(c.tick(0))
    a, b = results["a"].member_id, results["b"].member_id
    assert heartbeat(c, 1, b, 1) == gc.NONE  # heartbeats are fine between join and sync
    assert sync(c, "sb", 1, b, 1) == {}
    out = sync(c, "sa", 2, a, 1, {a: b"A", b: b"B"})
    assert out == {"sa": SyncResult(gc.NONE, "consumer", "range", b"A"),
                   "sb": SyncResult(gc.NONE, "consumer", "range", b"B")}


def test_sync_errors():
    c = make()
    assert sync(c, "s", 0, "x", 1)["s"].error == gc.UNKNOWN_MEMBER_ID
    assert sync(c, "s", 0, "x", 1, group="")["s"].error == gc.INVALID_GROUP_ID
    a, = stable_group(c, 1)
    assert sync(c, "s", 0, a, 7)["s"].error == gc.ILLEGAL_GENERATION
    assert sync(c, "s", 0, a, 1, protocol_name="roundrobin")["s"].error == gc.INCONSISTENT_GROUP_PROTOCOL
    assert sync(c, "s", 0, "x", 1)["s"].error == gc.UNKNOWN_MEMBER_ID


def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout():
    """Kafka's pending-sync expiry: a member of the new generation that does not SyncGroup."""
    c = make()
    join(c, "a", 0)
    join(c, "b", 0)
    results = dict(c.tick(0))
    a, b = results["a"].member_id, results["b"].member_id
    assert sync(c, "sa", 1, a, 1, {a: b"A", b: b"B"})["sa"].error == gc.NONE  # Stable; b never syncs
    for t in range(3000, REBALANCE, 3000):
        heartbeat(c, t, a, 1)
        heartbeat(c, t, b, 1)
    assert c.tick(REBALANCE) == []
    g = c.groups["g"]
    assert b not in g.members and g.state is GroupState.PREPARING_REBALANCE


def test_rejoin_during_completing_rebalance_with_same_metadata_gets_the_same_generation():
    c = make()
    join(c, "a", 0)
    join(c, "b", 0)
    results = dict(c.tick(0))
    a = results["a"].member_id
    again = join(c, "a-again", 5, member_id=a)["a-again"]
    assert again.generation_id == 1 and len(again.members) == 2


def test_follower_rejoin_in_stable_with_same_metadata_does_not_rebalance():
    c = make()
    a, b = stable_group(c, 2)
    out = join(c, "b2", 100, member_id=b)
    assert out["b2"].generation_id == 1 and out["b2"].members == ()
    assert c.groups["g"].state is GroupState.STABLE


def test_static_member_rejoining_with_unknown_id_keeps_its_assignment_without_rebalance():
    """KIP-345: a restarted static member (same group.instance.id, no member id) gets a new id,
    the old id is fenced, and a Stable group with unchanged protocols is not rebalanced."""
    c = make()
    join(c, "a", 0, instance_id="inst-a")
    join(c, "b", 0, instance_id="inst-b")
    results = dict(c.tick(0))
    a, b = results["a"].member_id, results["b"].member_id
    assert a.startswith("inst-a-")
    sync(c, "sb", 1, b, 1, instance_id="inst-b")
    sync(c, "sa", 1, a, 1, {a: b"A", b: b"B"}, instance_id="inst-a")
    out = join(c, "b-restarted", 100, instance_id="inst-b")["b-restarted"]
    assert out.error == gc.NONE and out.generation_id == 1 and out.member_id != b and out.leader_id == a
    assert c.groups["g"].state is GroupState.STABLE
    assert heartbeat(c, 101, b, 1, instance_id="inst-b") == gc.FENCED_INSTANCE_ID
    assert sync(c, "s", 101, out.member_id, 1, instance_id="inst-b")["s"].assignment == b"B"
    # The old id leaving is fenced too; leaving by instance id works.
    assert c.leave(102, "g", [(b, "inst-b")])[1] == [gc.FENCED_INSTANCE_ID]
    assert c.leave(103, "g", [("", "inst-b")])[1] == [gc.NONE]
    assert out.member_id not in c.groups["g"].members


def test_static_member_is_not_removed_for_missing_a_rebalance():
    c = make()
    join(c, "a", 0, instance_id="inst-a")
    join(c, "b", 0)
    results = dict(c.tick(0))
    a, b = results["a"].member_id, results["b"].member_id
    sync(c, "sb", 1, b, 1)
    sync(c, "sa", 1, a, 1, {a: b"A", b: b"B"}, instance_id="inst-a")
    join(c, "b2", 3, member_id=b, protocols=RANGE[::-1])  # new metadata: a rebalance; a keeps heartbeating only
    for t in range(2000, 3 + REBALANCE, 2000):
        assert heartbeat(c, t, a, 1, instance_id="inst-a") == gc.REBALANCE_IN_PROGRESS
        assert c.tick(t) == []
    (w, r), = c.tick(3 + REBALANCE)
    assert w == "b2" and r.leader_id == b and {m for m, _i, _md in r.members} == {a, b}


def test_commit_validation_follows_kafka_do_commit_offsets():
    c = make()
    v = c.validate_commit
    assert v(0, group_id="simple", generation_id=-1, member_id="", instance_id=None) == gc.NONE
    assert v(0, group_id="nogroup", generation_id=3, member_id="m", instance_id=None) == gc.ILLEGAL_GENERATION
    join(c, "a", 0)
    join(c, "b", 0)
    results = dict(c.tick(0))
    a = results["a"].member_id
    assert v(1, group_id="g", generation_id=1, member_id=a, instance_id=None) == gc.REBALANCE_IN_PROGRESS
    sync(c, "sa", 1, a, 1, {})
    assert v(2, group_id="g", generation_id=1, member_id=a, instance_id=None) == gc.NONE
    assert v(2, group_id="g", generation_id=0, member_id=a, instance_id=None) == gc.ILLEGAL_GENERATION
    assert v(2, group_id="g", generation_id=-1, member_id="", instance_id=None) == gc.UNKNOWN_MEMBER_ID
    # During PreparingRebalance the current generation may still commit (revocation).
    join(c, "n", 3)
    assert v(4, group_id="g", generation_id=1, member_id=a, instance_id=None) == gc.NONE


def test_offsets_apply_fetch_delete_and_groups_known_by_offsets_list_as_empty():
    c = make()
    c.apply_commit("simple", {("t", 0): (5, -1, "m")}, None)
    assert c.fetch_offsets("simple", [("t", 0), ("t", 1)]) == [("t", 0, 5, -1, "m"), ("t", 1, -1, -1, "")]
    assert c.fetch_offsets("simple", None) == [("t", 0, 5, -1, "m")]
    assert c.fetch_offsets("unknown", [("t", 0)]) == [("t", 0, -1, -1, "")]
    assert c.list_groups() == [("simple", "", "Empty")]
    assert c.describe("simple").state == "Empty"
    assert c.describe("nope").state == "Dead" and c.describe("nope").error == gc.NONE
    stable_group(c, 1)
    assert c.delete_group("g") == gc.NON_EMPTY_GROUP
    assert c.delete_group("nope") == gc.GROUP_ID_NOT_FOUND
    assert c.delete_group("simple") == gc.NONE
    assert c.delete_group("simple") == gc.GROUP_ID_NOT_FOUND  # Dead until durable
    assert c.validate_commit(0, group_id="simple", generation_id=-1, member_id="",
                             instance_id=None) == gc.COORDINATOR_NOT_AVAILABLE
    c.apply_delete("simple")
    assert c.fetch_offsets("simple", None) == [] and [g for g, *_ in c.list_groups()] == ["g"]
    assert c.list_groups(["stable"]) == [("g", "consumer", "Stable")] and c.list_groups(["Empty"]) == []


def test_undo_delete_restores_the_group():
    c = make()
    c.apply_commit("x", {("t", 0): (1, -1, None)})
    assert c.delete_group("x") == gc.NONE
    c.undo_delete("x")
    assert c.fetch_offsets("x", None) == [("t", 0, 1, -1, None)]


def test_describe_shows_metadata_and_assignments_only_when_stable():
    c = make()
    join(c, "a", 0)
    results = dict(c.tick(0))
    a = results["a"].member_id
    s = c.describe("g")
    assert s.state == "CompletingRebalance" and s.protocol_name == "" and s.members[0].metadata == b""
    sync(c, "sa", 1, a, 1, {a: b"A"})
    s = c.describe("g")
    assert (s.state, s.protocol_type, s.protocol_name) == ("Stable", "consumer", "range")
    m, = s.members
    assert (m.member_id, m.client_id, m.client_host, m.metadata, m.assignment) == (a, "c", "/127.0.0.1", b"r-meta", b"A")


def test_offset_delete_refuses_subscribed_topics_of_a_live_consumer_group():
    from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberMetadata_v0

    c = make()
    meta = ConsumerProtocolMemberMetadata_v0(0, ["orders"], b"").encode()
    join(c, "a", 0, protocols=[("range", meta)])
    assert c.check_offset_delete("g", ["orders", "other"]) == (gc.NONE, {"orders"})
    assert c.check_offset_delete("none", ["orders"])[0] == gc.GROUP_ID_NOT_FOUND
    c.apply_commit("e", {("orders", 0): (1, -1, None)})
    assert c.check_offset_delete("e", ["orders"]) == (gc.NONE, set())
    c.apply_offset_delete("e", [("orders", 0)])
    assert c.fetch_offsets("e", None) == []


def test_close_answers_every_pending_join_and_sync():
    c = make(delay_ms=3000)
    join(c, "j", 0)
    join(c, "k", 0, group="h")
    replies = dict(c.close())
    assert replies == {"j": JoinResult(gc.NOT_COORDINATOR, "c-0"), "k": JoinResult(gc.NOT_COORDINATOR, "c-1")}
    assert join(c, "x", 1)["x"].error == gc.COORDINATOR_NOT_AVAILABLE


# ---------------------------------------------------------------- random schedules

OPS = st.lists(st.tuples(st.sampled_from(["join", "rejoin", "sync", "heartbeat", "leave", "tick"]),
                         st.integers(0, 4), st.integers(0, 4000)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_random_schedules_answer_every_waiter_once_and_keep_invariants(ops):
    """Whatever clients do: each waiter is answered at most once (exactly once after close),
    a Stable/CompletingRebalance group has a leader among its members and a protocol all support,
    and generation ids never go down."""
    c = make(delay_ms=500)
    known: list[str] = []
    generation = {}
    pending: set[str] = set()
    answered: set[str] = set()
    now = 0
    counter = itertools.count()

    def take(replies):
        for w, r in replies:
            assert w in pending and w not in answered, w
            pending.discard(w)
            answered.add(w)
            if isinstance(r, JoinResult) and r.error in (gc.NONE, gc.MEMBER_ID_REQUIRED) and r.member_id not in known:
                known.append(r.member_id)
            if isinstance(r, JoinResult) and r.error == gc.NONE:
                generation[r.member_id] = r.generation_id

    last_gen = 0
    for op, who, dt in ops:
        now += dt
        w = f"w{next(counter)}"
        mid = known[who] if who < len(known) else ""
        if op in ("join", "rejoin", "sync"):
            pending.add(w)
        if op == "join":
            take(c.join(w, now, group_id="g", member_id="", instance_id=None, client_id="c", client_host="h",
                        protocol_type="consumer", protocols=RANGE, session_timeout_ms=6000,
                        rebalance_timeout_ms=3000, require_known_member_id=who % 2 == 0))
        elif op == "rejoin":
            take(c.join(w, now, group_id="g", member_id=mid, instance_id=None, client_id="c", client_host="h",
                        protocol_type="consumer", protocols=RANGE, session_timeout_ms=6000,
                        rebalance_timeout_ms=3000, require_known_member_id=True))
        elif op == "sync":
            g = c.groups.get("g")
            take(c.sync(w, now, group_id="g", generation_id=generation.get(mid, -1), member_id=mid, instance_id=None,
                        protocol_type="consumer", protocol_name=None,
                        assignments={m: m.encode() for m in (g.members if g else {})}))
        elif op == "heartbeat":
            c.heartbeat(now, group_id="g", generation_id=generation.get(mid, -1), member_id=mid, instance_id=None)
        elif op == "leave":
            take(c.leave(now, "g", [(mid, None)])[2])
        else:
            take(c.tick(now))
        g = c.groups.get("g")
        if g is not None:
            assert g.generation_id >= last_gen
            last_gen = g.generation_id
            if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                assert g.leader_id in g.members
                assert all(g.protocol_name in {n for n, _ in m.protocols} for m in g.members.values())
            if g.state is GroupState.EMPTY:
                assert not g.members
            deadline = c.next_deadline_ms()
            assert deadline is None or deadline >= 0
    take(c.close())
    assert pending == set()


def test_a_stable_generation_moves_to_another_coordinator_and_its_members_carry_on_with_their_ids():
    """Kafka's group metadata record: each Stable generation (and Empty) is handed to the caller to store;
    a new coordinator loading it has the group Stable at that generation, so its members heartbeat on
    with their ids (no UNKNOWN_MEMBER_ID), a follower's SyncGroup gets its assignment, and a member that
    stays silent is removed a session after the load."""
    import json

    from pipeline.coordinator.coordinator import GroupMembership

    a = make()
    ids = stable_group(a, 3, now=0)
    changes = a.take_membership_changes()
    assert set(changes) == {"g"} and a.take_membership_changes() == {}
    stored = json.loads(json.dumps(changes["g"].to_json()))  # as the offset store keeps it
    membership = GroupMembership.from_json(stored)
    assert membership == changes["g"]
    assert (membership.generation_id, membership.leader_id, [m.member_id for m in membership.members]) == (1, ids[0], ids)

    b = make()  # the new coordinator, 60 s later on its own clock
    b.load("g", "consumer", {("t", 0): (5, 0, None)}, membership, now_ms=60_000)
    group = b.groups["g"]
    assert group.state is GroupState.STABLE and group.generation_id == 1 and group.leader_id == ids[0]
    assert [heartbeat(b, 61_000, mid, 1) for mid in ids[:2]] == [gc.NONE, gc.NONE]
    assert sync(b, "s", 61_000, ids[1], 1) == {"s": SyncResult(gc.NONE, "consumer", "range", ids[1].encode())}
    assert heartbeat(b, 61_000, "someone-else", 1) == gc.UNKNOWN_MEMBER_ID
    # ids[2] never heartbeats: removed a session (10 s) after the load, the others asked to rejoin
    b.tick(60_000 + SESSION)
    assert ids[2] not in b.groups["g"].members and b.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert heartbeat(b, 70_001, ids[0], 1) == gc.REBALANCE_IN_PROGRESS

    # every member leaves: Empty, and the stored membership goes
    for mid in ids[:2]:
        b.leave(70_002, "g", [(mid, None)])
    b.tick(70_002 + REBALANCE)
    assert b.groups["g"].state is GroupState.EMPTY
    assert b.take_membership_changes() == {"g": None}
