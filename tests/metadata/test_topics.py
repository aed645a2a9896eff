"""TopicStore and the TopicCatalog backed by it, on SQLite and on PostgreSQL (``metadata_target``):
a restart is reopening the store."""

from __future__ import annotations

import sqlite3
import uuid

import psycopg
import pytest
import trio

from pipeline.metadata.leadership import LeadershipStore
from pipeline.metadata.topics import StoredTopic, TopicExistsError, TopicStore
from pipeline.protocol.apis import topic_id_for
from pipeline.requests.catalog import NoSuchTopicError, TopicCatalog


def test_store_survives_reopen_with_partitions_configs_and_ids(metadata_target):
    path = metadata_target("topics.db")
    store = TopicStore(path)
    store.insert(StoredTopic("orders", 3, topic_id_for("orders"), 1700, {"retention.ms": "1000"}))
    store.insert(StoredTopic("clicks", 1, topic_id_for("clicks"), 1800))
    with pytest.raises(TopicExistsError):
        store.insert(StoredTopic("orders", 1, topic_id_for("orders"), 1900))
    store.set_partitions("orders", 5)
    store.set_configs("clicks", {"retention.bytes": "10", "cleanup.policy": "delete"})
    assert store.delete("nothing") is False
    store.close()

    reopened = TopicStore(path)
    topics = {t.name: t for t in reopened.load()}
    assert topics["orders"].partitions == 5 and topics["orders"].created_ms == 1700
    assert topics["orders"].topic_id == topic_id_for("orders")
    assert dict(topics["orders"].configs) == {"retention.ms": "1000"}
    assert dict(topics["clicks"].configs) == {"cleanup.policy": "delete", "retention.bytes": "10"}
    assert reopened.delete("orders") is True
    assert [t.name for t in reopened.load()] == ["clicks"]
    if isinstance(path, str):  # PostgreSQL
        with psycopg.connect(path) as db:
            assert db.execute("SELECT count(*) FROM topic_configs WHERE topic = 'orders'").fetchone()[0] == 0
        return
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*) FROM topic_configs WHERE topic = 'orders'").fetchone()[0] == 0  # cascade


def test_set_on_a_missing_topic_raises(metadata_target):
    store = TopicStore(metadata_target("topics.db"))
    with pytest.raises(LookupError):
        store.set_partitions("x", 2)
    with pytest.raises(LookupError):
        store.set_configs("x", {})


def test_legacy_checkpoint_topics_are_imported_once_so_deleted_topics_stay_deleted(metadata_target):
    path = metadata_target("topics.db")
    catalog = TopicCatalog(2, True, {"old": 1, "older": 4}, store=TopicStore(path))
    assert catalog.all_topics() == {"old": 1, "older": 4}

    async def delete() -> None:
        await catalog.delete("old", lambda topic: trio.sleep(0))

    trio.run(delete)
    # Restart with the same (stale) checkpoint topics: the store is the truth now.
    again = TopicCatalog(2, True, {"old": 1, "older": 4}, store=TopicStore(path))
    assert again.all_topics() == {"older": 4}


def test_catalog_changes_persist_and_auto_created_topics_are_stored(metadata_target):
    path = metadata_target("topics.db")
    catalog = TopicCatalog(3, True, store=TopicStore(path), retention_defaults=(60_000, -1))

    async def main() -> None:
        await catalog.create("a", 2, {"retention.ms": "5"})
        with pytest.raises(TopicExistsError):
            await catalog.create("a", 2, {})
        await catalog.set_partitions("a", 4)
        await catalog.set_configs("a", lambda current: {**current, "retention.bytes": "7"})
        with pytest.raises(NoSuchTopicError):
            await catalog.set_partitions("missing", 2)

    trio.run(main)
    assert catalog.describe("auto", True) == (0, 3)
    assert catalog.describe("bad name", True)[0] == 17
    reopened = TopicCatalog(1, True, store=TopicStore(path), retention_defaults=(60_000, -1))
    assert reopened.all_topics() == {"a": 4, "auto": 3}
    assert reopened.retention("a") == (5, 7)
    assert reopened.retention("auto") == (60_000, -1)
    assert reopened.name_for_id(topic_id_for("a")) == "a"
    assert reopened.name_for_id(uuid.uuid4()) is None


def test_delete_hides_the_topic_at_once_and_a_failed_hook_brings_it_back(metadata_target):
    catalog = TopicCatalog(1, True, store=TopicStore(metadata_target("topics.db")))
    seen: list[tuple[int | None, tuple[int, int]]] = []

    async def main() -> None:
        await catalog.create("t", 2, {})

        async def hook(topic: str) -> None:
            # While the hook runs: no produce, Metadata says retry, auto-create does not resurrect it.
            seen.append((catalog.partitions(topic), catalog.describe(topic, True)))

        await catalog.delete("t", hook)

        async def failing(topic: str) -> None:
            raise OSError("disk gone")

        await catalog.create("u", 1, {})
        with pytest.raises(OSError):
            await catalog.delete("u", failing)

    trio.run(main)
    assert seen == [(None, (5, 0))]
    assert catalog.partitions("t") is None
    assert catalog.partitions("u") == 1
    assert TopicCatalog(1, False, store=TopicStore(metadata_target("topics.db"))).all_topics() == {"u": 1}


def test_partitions_new_to_the_store_are_recorded_empty_in_the_table_so_their_leaders_read_nothing(metadata_target):
    """A cluster's catalog (``on_new_partitions``: ``LeadershipService.record_new_partitions``) records a
    table end of 0 for the partitions it creates, auto-creates or adds, and only for those: a topic another
    broker created first, and one imported from a checkpoint (its rows may be in the table), get none, so
    their leaders read the table as before; a partition's end a commit recorded is left as it is."""
    ends = LeadershipStore(metadata_target("cluster.db"))
    path = metadata_target("topics.db")
    catalog = TopicCatalog(2, True, {"legacy": 3}, store=TopicStore(path), shared=True,
                           on_new_partitions=ends.record_new_partitions)
    other = TopicCatalog(2, True, store=TopicStore(path), shared=True)  # another broker: no hook
    try:
        ends.commit_done({("a", 1): 7})  # as if a leader had committed to it first

        async def main() -> None:
            await catalog.create("a", 2, {})
            await catalog.set_partitions("a", 3)
            await other.create("elsewhere", 1, {})
            with pytest.raises(TopicExistsError):
                await catalog.create("elsewhere", 1, {})

        trio.run(main)
        assert catalog.describe("auto", True) == (0, 2)
        assert other.describe("auto2", True) == (0, 2)
        assert catalog.describe("auto2", True) == (0, 2)  # created by the other a moment ago: not new here
        keys = [(t, p) for t in ("a", "auto", "auto2", "elsewhere", "legacy") for p in range(3)]
        assert ends.table_ends(keys) == {("a", 0): 0, ("a", 1): 7, ("a", 2): 0, ("auto", 0): 0, ("auto", 1): 0}
    finally:
        ends.close()
