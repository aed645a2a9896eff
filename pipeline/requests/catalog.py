"""The broker's topics: created by CreateTopics or on first use, each with a partition count and configs.

Kafka creates a topic on a Metadata request naming it when
``auto.create.topics.enable`` is on (the default) and the client allows it
(MetadataRequest.allow_auto_topic_creation, v4+), with ``num.partitions``
partitions. Produce to a topic that does not exist is answered with
UNKNOWN_TOPIC_OR_PARTITION (clients ask Metadata first).

Topics live in memory (Produce asks ``partitions`` for every partition) and,
when the catalog has a ``TopicStore``, in SQLite (``pipeline.metadata.topics``):
every change is written there before it shows in memory, except a deletion,
which hides the topic at once (no produce accepted from then on) and is
forgotten in the store last, after its data is gone. The admin apis
(``pipeline.admin``) change topics through the async methods; the store writes
run in a worker thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import trio
from kio.schema.errors import ErrorCode

from pipeline.metadata.topics import NoSuchTopicError, StoredTopic, TopicExistsError, TopicStore
from pipeline.protocol.apis import topic_id_for, validate_topic_name

log = logging.getLogger(__name__)

__all__ = ("NoSuchTopicError", "TopicCatalog", "TopicExistsError")


class TopicCatalog:
    """Topic name -> partition count and configs. Satisfies ``pipeline.protocol.apis.TopicResolver``.

    Args:
        num_partitions: partitions of an auto-created topic (Kafka ``num.partitions``).
        auto_create: Kafka ``auto.create.topics.enable``.
        initial: topics known at start from elsewhere (the checkpoint of a data
            dir from before the store): with a store they are imported into it
            once, the first time it is opened, and ignored afterwards (the store
            is then the truth, so a deleted topic stays deleted).
        store: where topics persist; None keeps them in memory only (tests, benchmarks).
        retention_defaults: (log.retention.ms, log.retention.bytes), what
            ``retention`` returns for a topic without overrides (-1: no limit).
        shared: the store is shared with other broker processes (a cluster): ``refresh`` takes
            their changes; a name not found is looked up in the store again first.
        clock: wall-clock seconds, for creation times.
        on_new_partitions: blocking; told ``(topic, range of partition numbers)`` after the store took
            partitions that did not exist before (a topic created, auto-created or given more partitions
            here), before they are visible in this catalog; it must not raise.
    """

    def __init__(self, num_partitions: int = 1, auto_create: bool = True,
                 initial: dict[str, int] | None = None, *, store: TopicStore | None = None,
                 retention_defaults: tuple[int, int] = (-1, -1), shared: bool = False,
                 clock: Callable[[], float] = time.time,
                 on_new_partitions: Callable[[str, range], None] | None = None) -> None:
        if num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
        self.num_partitions = num_partitions
        self.auto_create = auto_create
        self.store = store
        self.retention_defaults = retention_defaults
        self._clock = clock
        self._on_new_partitions = on_new_partitions
        self._busy: set[str] = set()  # being created or deleted
        self._config_lock = trio.Lock()
        legacy = [self._new(name, count) for name, count in (initial or {}).items()]
        self._version = 0
        self._local_writes = 0  # writes to the store this catalog made: a refresh read across one is stale
        if store is None:
            self._topics = {t.name: t for t in legacy}
        else:
            if not store.legacy_imported:
                store.import_legacy(legacy)
                if legacy:
                    log.info("topic store %s: imported %d topics from the checkpoint", store.path, len(legacy))
            # Read before the load: a change committed in between moves it again, so refresh reloads.
            self._version = store.change_version()
            self._topics = {t.name: t for t in store.load()}
        self._by_id = {t.topic_id: t.name for t in self._topics.values()}
        self.shared = shared
        self.deleted_elsewhere: list[str] = []
        """Topics ``refresh`` found deleted by another broker, for the server to drop its
        own data of (``Server._watch_metadata``), oldest first."""

    def refresh(self) -> bool:
        """Take the changes other processes made to a shared store (``shared``): topics they
        created, deleted, resized or reconfigured. Topics this catalog is creating or
        deleting are left alone. True if anything was reloaded. Blocking (one small read,
        and the topics' load when the store's change version moved); on the trio thread."""
        return self._apply(self._local_writes, *self._read_changes())

    async def refresh_async(self) -> bool:
        """``refresh`` with the store's reads in a worker thread, applied on the trio thread.

        A read that overlapped a write of this catalog (a create, delete, resize or
        reconfiguration in flight) is dropped, and so is one older than what is applied already:
        such a snapshot may lack a topic this catalog just created, which would otherwise be
        taken for one another broker deleted (and have its data dropped). The next refresh
        reads again."""
        writes = self._local_writes
        version, stored = await trio.to_thread.run_sync(self._read_changes)
        return self._apply(writes, version, stored)

    def _read_changes(self) -> tuple[int, list[StoredTopic] | None]:
        """(the store's change version, its topics), the topics None when the version has not
        moved since the last applied read (``shared`` only). Blocking; any thread."""
        if not self.shared or self.store is None:
            return self._version, None
        version = self.store.change_version()  # before the load: a change in between moves it again
        if version <= self._version:
            return version, None
        return version, self.store.load()

    def _apply(self, writes: int, version: int, loaded: list[StoredTopic] | None) -> bool:
        if loaded is None or version <= self._version or writes != self._local_writes:
            return False
        self._version = version
        stored = {t.name: t for t in loaded}
        for name in [n for n in self._topics if n not in stored and n not in self._busy]:
            log.info("topic %r was deleted by another broker", name)
            self._by_id.pop(self._topics.pop(name).topic_id, None)
            self.deleted_elsewhere.append(name)
        for name, topic in stored.items():
            if name not in self._busy and self._topics.get(name) != topic:
                self._put(topic)
        return True

    def _new(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> StoredTopic:
        return StoredTopic(name, partitions, topic_id_for(name), int(self._clock() * 1000),
                           MappingProxyType(dict(configs or {})))

    def _put(self, topic: StoredTopic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic.name

    # -- reads (Produce, Metadata, Fetch, admin) --------------------------------------

    def partitions(self, name: str) -> int | None:
        """Partition count of ``name``, or None if no such topic (or it is being deleted)."""
        topic = self._topics.get(name)
        if topic is None and self.shared and self.refresh():
            topic = self._topics.get(name)
        return None if topic is None else topic.partitions

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        """(error code, partition count) for a Metadata request naming ``name``.

        Auto-creation writes the store synchronously (one small SQLite
        transaction, a few ms; rare). A topic being created or deleted by an
        admin request answers LEADER_NOT_AVAILABLE (retriable), as Kafka does
        while a topic has no leader yet.
        """
        topic = self._topics.get(name)
        if topic is None and self.shared and self.refresh():
            topic = self._topics.get(name)
        if topic is not None:
            return ErrorCode.none.value, topic.partitions
        try:
            validate_topic_name(name)
        except ValueError:
            return ErrorCode.invalid_topic_exception.value, 0
        if name in self._busy:
            return ErrorCode.leader_not_available.value, 0
        if not (auto_create and self.auto_create):
            return ErrorCode.unknown_topic_or_partition.value, 0
        topic = self._new(name, self.num_partitions)
        if self.store is not None:
            try:
                self._local_writes += 1
                self.store.insert(topic)
            except TopicExistsError:
                # Another broker of the cluster created it a moment ago: take its version.
                self.refresh()
                stored = self._topics.get(name)
                if stored is None:
                    return ErrorCode.leader_not_available.value, 0
                return ErrorCode.none.value, stored.partitions
            if self._on_new_partitions is not None:
                self._on_new_partitions(name, range(topic.partitions))
        self._put(topic)
        log.info("auto-created topic %r with %d partitions", name, self.num_partitions)
        return ErrorCode.none.value, self.num_partitions

    def all_topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        return {name: t.partitions for name, t in self._topics.items()}

    def topic(self, name: str) -> StoredTopic | None:
        """Everything known about ``name`` (None: no such topic, or being deleted)."""
        return self._topics.get(name)

    def name_for_id(self, topic_id: uuid.UUID) -> str | None:
        """The topic whose id is ``topic_id`` (KIP-516), or None."""
        name = self._by_id.get(topic_id)
        return name if name in self._topics else None

    def busy(self, name: str) -> bool:
        """True while an admin request creates or deletes ``name``."""
        return name in self._busy

    def retention(self, topic: str) -> tuple[int, int]:
        """(retention.ms, retention.bytes) of ``topic``: its overrides, else the broker's
        ``log.retention.ms`` / ``log.retention.bytes``; -1 means no limit. An unknown
        topic gets the broker's. (Kafka LogConfig: topic overrides over broker defaults.)"""
        t = self._topics.get(topic)
        configs = t.configs if t is not None else {}
        ms = configs.get("retention.ms")
        size = configs.get("retention.bytes")
        return (self.retention_defaults[0] if ms is None else int(ms),
                self.retention_defaults[1] if size is None else int(size))

    # -- changes (admin apis) ------------------------------------------------------------

    async def _store(self, method: str, *args: object) -> None:
        """``TopicStore.<method>(*args)`` in a worker thread (nothing without a store)."""
        if self.store is not None:
            try:
                await trio.to_thread.run_sync(getattr(self.store, method), *args)
            finally:
                self._local_writes += 1

    async def create(self, name: str, partitions: int, configs: Mapping[str, str]) -> StoredTopic:
        """Create a topic (stored before it becomes visible).

        Raises:
            TopicExistsError: it exists, or is being created or deleted (Kafka TOPIC_ALREADY_EXISTS).
        """
        if self.shared:
            await self.refresh_async()
        if name in self._topics or name in self._busy:
            raise TopicExistsError(f"Topic '{name}' already exists."
                                   if name in self._topics else f"Topic '{name}' is being created or deleted.")
        topic = self._new(name, partitions, configs)
        self._busy.add(name)
        try:
            await self._store("insert", topic)
            if self.store is not None and self._on_new_partitions is not None:
                await trio.to_thread.run_sync(self._on_new_partitions, name, range(partitions))
            self._put(topic)
        finally:
            self._busy.discard(name)
        log.info("created topic %r with %d partitions, configs %s", name, partitions, dict(configs))
        return topic

    async def set_partitions(self, name: str, partitions: int) -> None:
        """Give ``name`` ``partitions`` partitions (the caller checked it is an increase).

        Raises:
            NoSuchTopicError: no such topic.
        """
        async with self._config_lock:
            topic = self._topics.get(name)
            if topic is None:
                raise NoSuchTopicError(name)
            await self._store("set_partitions", name, partitions)
            if self.store is not None and self._on_new_partitions is not None:
                await trio.to_thread.run_sync(self._on_new_partitions, name, range(topic.partitions, partitions))
            if name in self._topics:
                self._put(StoredTopic(name, partitions, topic.topic_id, topic.created_ms, self._topics[name].configs))
        log.info("topic %r now has %d partitions", name, partitions)

    async def set_configs(self, name: str, update: Callable[[Mapping[str, str]], Mapping[str, str]]) -> None:
        """Replace ``name``'s config overrides with ``update(current overrides)``, atomically
        with respect to other admin changes (``update`` may raise; nothing changes then).

        Raises:
            NoSuchTopicError: no such topic.
        """
        async with self._config_lock:
            topic = self._topics.get(name)
            if topic is None:
                raise NoSuchTopicError(name)
            configs = dict(update(topic.configs))
            await self._store("set_configs", name, configs)
            current = self._topics.get(name)
            if current is not None:
                self._put(StoredTopic(name, current.partitions, current.topic_id, current.created_ms,
                                      MappingProxyType(configs)))
        log.info("topic %r configs now %s", name, configs)

    async def delete(self, name: str, on_delete: Callable[[str], Awaitable[None]]) -> None:
        """Delete a topic: hide it at once (Produce gets UNKNOWN_TOPIC_OR_PARTITION, Metadata
        LEADER_NOT_AVAILABLE), await ``on_delete(name)`` (which removes its data), then
        forget it in the store. If ``on_delete`` raises, the topic is visible again (a
        retried delete finishes the job) and the error propagates.

        Raises:
            NoSuchTopicError: no such topic (or a deletion of it is under way).
        """
        topic = self._topics.get(name)
        if topic is None or name in self._busy:
            raise NoSuchTopicError(name)
        del self._topics[name]
        self._busy.add(name)
        try:
            try:
                await on_delete(name)
                await self._store("delete", name)
            except BaseException:
                self._put(topic)
                raise
            self._by_id.pop(topic.topic_id, None)
        finally:
            self._busy.discard(name)
        log.info("deleted topic %r", name)
