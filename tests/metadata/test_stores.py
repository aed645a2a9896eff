"""The metadata stores on both backends (``metadata_target``: SQLite files, a real PostgreSQL server).

What one broker writes, another broker's store instance on the same database reads at once
(issue 24: "within 1 s"; here: on the next read after the write returned), and the stores a broker
caches (topics, ACLs) say so through their change version, which a catalog and an authorizer poll
and reload on. Schemas migrate once,
also when brokers open them together, and refuse a newer schema. Producer-id blocks never overlap;
broker leases expire, and a stale epoch is fenced.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import trio

from pipeline.coordinator.offset_store import MIGRATIONS as GROUP_MIGRATIONS
from pipeline.coordinator.offset_store import (CommitOffsets, DeleteGroup, DeleteOffsets, OffsetStore,
                                               StoreMembership)
from pipeline.coordinator.transactions import TransactionMetadata, TxnState
from pipeline.coordinator.txn_store import TransactionStore
from pipeline.metadata.brokers import BrokerRegistry, DuplicateBrokerError, FencedBrokerError
from pipeline.metadata.database import Migration, SchemaVersionError, open_database, redact_url, store_target
from pipeline.metadata.producer_ids import ProducerIdManager, ProducerIdStore
from pipeline.protocol.apis import topic_id_for
from pipeline.requests.acl_apis import AclApis
from pipeline.requests.catalog import TopicCatalog
from pipeline.metadata.topics import MIGRATIONS as TOPIC_MIGRATIONS, NoSuchTopicError, StoredTopic, TopicStore
from pipeline.security.acl import AclOperation, AclPermissionType, Authorizer, PatternType, ResourceType, binding
from pipeline.security.acl_store import AclStore
from pipeline.security.users import UserStore


def _acl(name: str):
    return binding(ResourceType.TOPIC, name, PatternType.LITERAL, "User:alice", "*", AclOperation.WRITE,
                   AclPermissionType.ALLOW)


def test_a_second_broker_sees_topics_acls_users_and_offsets_right_after_the_write(metadata_target):
    # Two "brokers": two store instances each, two connections to one database (or file).
    topics_a, topics_b = TopicStore(metadata_target("topics.db")), TopicStore(metadata_target("topics.db"))
    acls_a, acls_b = AclStore(metadata_target("acls.db")), AclStore(metadata_target("acls.db"))
    users_a, users_b = UserStore(metadata_target("users.db")), UserStore(metadata_target("users.db"))
    groups_a, groups_b = OffsetStore(metadata_target("groups.db")), OffsetStore(metadata_target("groups.db"))
    assert topics_b.load() == [] and acls_b.load() == [] and users_b.users() == {} and groups_b.load() == {}
    version = topics_b.change_version()

    topics_a.insert(StoredTopic("orders", 3, topic_id_for("orders"), 1700, {"retention.ms": "1000"}))
    acls_a.add([_acl("orders")])
    users_a.add("alice", "pw-alice", ("SCRAM-SHA-256",), iterations=4096)
    groups_a.write([CommitOffsets("g", "consumer", {("orders", 0): (41, 2, "m"), ("orders", 1): (7, 2, None)},
                                  1800)])

    assert topics_b.change_version() != version  # what tells a catalog to reload
    [orders] = topics_b.load()
    assert (orders.name, orders.partitions, dict(orders.configs)) == ("orders", 3, {"retention.ms": "1000"})
    assert acls_b.load() == [_acl("orders")]
    assert users_b.users() == {"alice": {"SCRAM-SHA-256": 4096}} and users_b.verify_plain("alice", "pw-alice")
    assert groups_b.load() == {"g": ("consumer", {("orders", 0): (41, 2, "m"), ("orders", 1): (7, 2, None)})}

    # Changes and deletions travel the same way.
    topics_b.set_partitions("orders", 6)
    acls_b.remove([_acl("orders")])
    users_b.remove("alice")
    groups_b.write([CommitOffsets("g", None, {("orders", 0): (50, 3, None)}, 1900),
                    DeleteOffsets("g", (("orders", 1),))])
    assert topics_a.load()[0].partitions == 6
    assert acls_a.load() == [] and users_a.users() == {} and not users_a.verify_plain("alice", "pw-alice")
    assert groups_a.load() == {"g": ("consumer", {("orders", 0): (50, 3, None)})}
    for store in (topics_a, topics_b, acls_a, acls_b, users_a, users_b, groups_a, groups_b):
        store.close()


def test_the_change_version_moves_with_each_committed_change_only(metadata_target):
    target = metadata_target("notes.db")
    steps = (Migration(1, sqlite="CREATE TABLE notes (note TEXT)", postgresql="CREATE TABLE notes (note TEXT)"),)
    writer, reader = open_database(target), open_database(target)
    try:
        writer.migrate("notes", steps)
        reader.migrate("notes", steps)  # already applied: its change version is kept, not reset
        assert reader.change_version("notes") == 0
        seen = [reader.change_version("notes")]
        for note in ("a", "b"):
            with writer.transaction() as cur:
                cur.execute("INSERT INTO notes VALUES (?)", (note,))
                writer.record_change(cur, "notes")
                assert reader.change_version("notes") == seen[-1]  # not before the commit
            seen.append(reader.change_version("notes"))
            assert seen[-1] != seen[-2]  # another connection sees it moved once committed
        with pytest.raises(RuntimeError), writer.transaction() as cur:
            cur.execute("INSERT INTO notes VALUES ('c')")
            writer.record_change(cur, "notes")
            raise RuntimeError("rolled back")
        assert reader.change_version("notes") == seen[-1]  # a rolled back change is no change
        with writer.transaction(write=False) as cur:
            cur.execute("SELECT note FROM notes").fetchall()
        assert reader.change_version("notes") == seen[-1]  # nor is a read
        writer.migrate("other", (Migration(1, sqlite="SELECT 1", postgresql="SELECT 1"),))
        assert reader.change_version("notes") == seen[-1]  # components count apart
        assert reader.change_version("other") == 0
    finally:
        writer.close()
        reader.close()


def test_topic_and_acl_writes_move_their_change_versions_for_other_brokers(metadata_target):
    topics_a, topics_b = TopicStore(metadata_target("topics.db")), TopicStore(metadata_target("topics.db"))
    acls_a, acls_b = AclStore(metadata_target("acls.db")), AclStore(metadata_target("acls.db"))
    try:
        topic_versions, acl_versions = [topics_b.change_version()], [acls_b.change_version()]
        for write in (lambda: topics_a.insert(StoredTopic("t", 1, topic_id_for("t"), 1700)),
                      lambda: topics_a.set_partitions("t", 2),
                      lambda: topics_a.set_configs("t", {"retention.ms": "5"}),
                      lambda: topics_a.delete("t")):
            write()
            topic_versions.append(topics_b.change_version())
        for write in (lambda: acls_a.add([_acl("t")]), lambda: acls_a.remove([_acl("t")])):
            write()
            acl_versions.append(acls_b.change_version())
        assert len(set(topic_versions)) == 5 and len(set(acl_versions)) == 3
        # A write that fails changes nothing, so moves nothing.
        with pytest.raises(NoSuchTopicError):
            topics_a.set_partitions("absent", 3)
        assert topics_b.change_version() == topic_versions[-1]
        assert acls_b.change_version() == acl_versions[-1]  # ACL writes do not move the topics' and back
    finally:
        for store in (topics_a, topics_b, acls_a, acls_b):
            store.close()


def test_topic_schema_1_on_postgresql_drops_its_old_counter_at_version_2(metadata_target):
    target = metadata_target("topics.db")
    db = open_database(target)
    assert db.migrate("topics", TOPIC_MIGRATIONS[:1]) == 1  # a database a broker before the change version made
    TopicStore(target).close()
    with db.transaction(write=False) as cur:
        assert cur.execute("SELECT version FROM schema_version WHERE component = 'topics'").fetchone() == (2,)
        if db.dialect == "postgresql":
            assert cur.execute("SELECT to_regclass('topic_changes')").fetchone() == (None,)
    db.close()


def test_a_groups_membership_is_stored_replaced_forgotten_and_read_by_another_broker(metadata_target):
    """``StoreMembership`` (a group's Stable generation, what a new coordinator restores): written by one
    broker, read by another; None forgets it, DeleteGroups removes it; a groups database of schema 1 (before
    memberships were stored) gains the column and keeps its offsets."""
    target = metadata_target("groups.db")
    db = open_database(target)
    assert db.migrate("groups", GROUP_MIGRATIONS[:1]) == 1  # a database a broker before this change made
    db.close()
    one, two = OffsetStore(target), OffsetStore(target)
    try:
        one.write([CommitOffsets("g", "consumer", {("t", 0): (7, 0, None)}, 1)])
        one.write([StoreMembership("g", "consumer", '{"generation_id": 3}'),
                   StoreMembership("fresh", "consumer", '{"generation_id": 1}')])
        assert two.memberships() == {"g": '{"generation_id": 3}', "fresh": '{"generation_id": 1}'}
        assert two.load()["g"] == ("consumer", {("t", 0): (7, 0, None)})
        one.write([StoreMembership("g", "consumer", '{"generation_id": 4}'), StoreMembership("fresh", None, None)])
        assert two.memberships() == {"g": '{"generation_id": 4}'}
        assert two.load()["fresh"] == ("consumer", {})  # still listed, as an Empty group
        one.write([DeleteGroup("g")])
        assert two.memberships() == {} and "g" not in two.load()
    finally:
        one.close()
        two.close()


def test_a_catalog_and_an_authorizer_reload_what_another_broker_changed_and_nothing_else(metadata_target):
    """What ``pipeline.server.Server._watch_metadata`` runs every 250 ms on each broker."""
    # Broker A writes through its stores; broker B has a catalog and an authorizer of its own.
    topics_a, acls_a = TopicStore(metadata_target("topics.db")), AclStore(metadata_target("acls.db"))
    topics_b, acls_b = TopicStore(metadata_target("topics.db")), AclStore(metadata_target("acls.db"))
    catalog_b = TopicCatalog(store=topics_b, shared=True)
    authorizer_b = Authorizer(acls_b.load())
    apis_b = AclApis(authorizer_b, acls_b)

    async def steps() -> None:
        assert await apis_b.refresh()  # the first look reloads (the version the load had is unknown)
        assert not await apis_b.refresh() and not catalog_b.refresh()  # nothing moved: no reload
        topics_a.insert(StoredTopic("orders", 3, topic_id_for("orders"), 1700, {"retention.ms": "1000"}))
        acls_a.add([_acl("orders")])
        assert catalog_b.refresh() and catalog_b.all_topics() == {"orders": 3}
        assert await apis_b.refresh() and authorizer_b.acls == [_acl("orders")]
        assert authorizer_b.authorize("User:alice", "10.0.0.1", AclOperation.WRITE, ResourceType.TOPIC, "orders")
        assert not await apis_b.refresh()
        topics_a.set_partitions("orders", 6)
        acls_a.remove([_acl("orders")])
        assert catalog_b.refresh() and catalog_b.partitions("orders") == 6
        assert await apis_b.refresh() and authorizer_b.acls == []
        assert not authorizer_b.authorize("User:alice", "10.0.0.1", AclOperation.WRITE, ResourceType.TOPIC,
                                          "orders")
        topics_a.delete("orders")
        assert catalog_b.refresh() and catalog_b.partitions("orders") is None
        assert catalog_b.deleted_elsewhere == ["orders"]

    try:
        trio.run(steps)
    finally:
        for store in (topics_a, acls_a, topics_b, acls_b):
            store.close()


def test_transaction_state_round_trips_and_upserts(metadata_target):
    store = TransactionStore(metadata_target("transactions.db"))
    meta = TransactionMetadata("tx-1", 1_763_000_000_123, 4, 60_000, TxnState.ONGOING, -1,
                               {("orders", 0), ("orders", 2)}, {"g"}, 1_763_000_000_500, 1_763_000_000_600)
    store.save(meta, {"g": {("orders", 0): (10, 1, None)}})
    meta.state, meta.producer_epoch = TxnState.PREPARE_COMMIT, 5
    store.save(meta, {"g": {("orders", 0): (12, 1, "x")}})
    other = TransactionStore(metadata_target("transactions.db"))
    [loaded], pending = other.load()
    assert (loaded.producer_id, loaded.producer_epoch, loaded.state) == (1_763_000_000_123, 5,
                                                                        TxnState.PREPARE_COMMIT)
    assert loaded.partitions == {("orders", 0), ("orders", 2)} and loaded.groups == {"g"}
    assert pending == {"tx-1": {"g": {("orders", 0): (12, 1, "x")}}}
    store.save(meta, clear_pending=True)
    assert other.load()[1] == {}
    store.close()
    other.close()


def test_migrations_run_once_even_when_brokers_open_together_and_refuse_a_newer_schema(metadata_target):
    target = metadata_target("groups.db")
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            OffsetStore(target).close()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    db = open_database(target)
    with db.transaction(write=False) as cur:
        assert cur.execute("SELECT version FROM schema_version WHERE component = 'groups'").fetchall() == [
            (len(GROUP_MIGRATIONS),)]
    # One more version applies on top, once; the one after, from "a newer broker", makes this code refuse.
    step = Migration(len(GROUP_MIGRATIONS) + 1, sqlite="CREATE TABLE group_notes (note TEXT)",
                     postgresql="CREATE TABLE group_notes (note TEXT)")
    assert db.migrate("groups", (*GROUP_MIGRATIONS, step)) == step.version
    assert db.migrate("groups", (*GROUP_MIGRATIONS, step)) == step.version  # idempotent: the CREATE would fail if run again
    with pytest.raises(SchemaVersionError):
        OffsetStore(target)
    db.close()


def test_producer_id_blocks_never_overlap_across_brokers(metadata_target):
    target = metadata_target("producer_ids.db")
    stores = [ProducerIdStore(target) for _ in range(3)]
    managers = [ProducerIdManager(store, broker_id, block_size=10) for broker_id, store in enumerate(stores)]
    ids: list[list[int]] = [[] for _ in managers]

    def take(i: int) -> None:
        for _ in range(45):  # 5 blocks each, claimed while the others claim theirs
            ids[i].append(next(managers[i]))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [pid for per_broker in ids for pid in per_broker]
    assert len(every) == 135 and len(set(every)) == 135
    for per_broker in ids:
        assert per_broker == sorted(per_broker)
    # Seeded from the database's clock (ms), as the single-machine broker seeds its ids.
    assert min(every) > 1_700_000_000_000
    # A restarted broker (a new store and manager) never gets an id handed out before.
    again = ProducerIdManager(ProducerIdStore(target), 0, block_size=10)
    assert next(again) > max(every)
    block = stores[0].claim(7, 1000)
    assert block.broker_id == 7 and block.last - block.first == 999 and block.first > max(every)
    with pytest.raises(ValueError):
        stores[0].claim(7, 0)


def _wait_until(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_brokers_register_heartbeat_and_are_fenced_by_epoch_and_lease(metadata_target):
    target = metadata_target("brokers.db")
    a, b = BrokerRegistry(target), BrokerRegistry(target)
    one, two = uuid.uuid4(), uuid.uuid4()
    endpoints = [("PLAINTEXT", "10.0.0.1", 9092), ("SSL", "10.0.0.1", 9093)]
    assert a.register(1, one, endpoints, lease_ms=60_000) == 1
    assert b.register(2, two, [("PLAINTEXT", "10.0.0.2", 9092)], lease_ms=60_000) == 1
    members = a.live_members()
    assert [(m.node_id, m.epoch, m.incarnation_id) for m in members] == [(1, 1, one), (2, 1, two)]
    assert members[0].endpoints == tuple(endpoints)
    assert a.heartbeat(1, 1, 60_000) >= members[0].registered_ms + 60_000

    # Another incarnation of node 1 is refused while the lease lives ...
    with pytest.raises(DuplicateBrokerError):
        b.register(1, uuid.uuid4(), endpoints, lease_ms=60_000)
    # ... the same incarnation registering again gets a new epoch, and the old epoch is fenced.
    assert a.register(1, one, endpoints, lease_ms=60_000) == 2
    with pytest.raises(FencedBrokerError):
        a.heartbeat(1, 1, 60_000)
    assert not b.is_member(1, 1) and b.is_member(1, 2)
    with pytest.raises(FencedBrokerError):
        with b.fenced(1, 1) as cur:
            cur.execute("UPDATE brokers SET endpoints = '[]' WHERE node_id = 1")
    with b.fenced(1, 2) as cur:  # the current epoch writes, in the same transaction as the check
        cur.execute("UPDATE brokers SET endpoints = ? WHERE node_id = 1", ('[["PLAINTEXT", "10.0.0.9", 9092]]',))
    assert a.live_members()[0].endpoints == (("PLAINTEXT", "10.0.0.9", 9092),)

    # A lease that runs out ends membership; the broker must register again (a new epoch).
    a.heartbeat(1, 2, 1)
    assert _wait_until(lambda: [m.node_id for m in b.live_members()] == [2])
    with pytest.raises(FencedBrokerError):
        a.heartbeat(1, 2, 60_000)
    assert b.register(1, uuid.uuid4(), endpoints, lease_ms=60_000) == 3  # another incarnation may take it now
    # Fencing from outside (a controller, an operator) and a controlled shutdown end it at once.
    assert a.fence(2) and not a.fence(99)
    with pytest.raises(FencedBrokerError):
        b.heartbeat(2, 1, 60_000)
    assert a.unregister(1, 3) and not a.unregister(1, 3 - 1)
    assert a.live_members() == []
    with pytest.raises(ValueError):
        a.register(5, uuid.uuid4(), endpoints, lease_ms=0)
    a.close()
    b.close()


def test_targets_and_urls():
    assert str(store_target(None, "/d", "topics.db")) == "/d/_pipeline/topics.db"
    assert store_target("postgresql://u@h:5/db", "/d", "topics.db") == "postgresql://u@h:5/db"
    assert redact_url("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_brokers_registering_one_node_id_at_once_get_one_winner(metadata_target):
    target = metadata_target("brokers.db")
    registries = [BrokerRegistry(target) for _ in range(4)]
    outcomes: list[object] = []

    def register(registry: BrokerRegistry) -> None:
        try:
            outcomes.append(registry.register(3, uuid.uuid4(), [("PLAINTEXT", "127.0.0.1", 9092)], 60_000))
        except DuplicateBrokerError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=register, args=(r,)) for r in registries]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 4 and [o for o in outcomes if not isinstance(o, DuplicateBrokerError)] == [1]
    [member] = registries[0].live_members()
    assert (member.node_id, member.epoch) == (3, 1)
    for r in registries:
        r.close()
