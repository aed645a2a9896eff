"""Wiring: the server as a tree of nurseries, and its ordered shutdown.

    Acceptor --round-robin--> Processors (KafkaChannel reader/writer per connection)
        --> RequestChannel (multiqueue: N queues by crc32(connection id) % N;
                            baseline: one shared queue + mute until response)
        --> RequestHandlers (validate, sequence offsets, hand on)
        --> BatchingPersister (group records, one Spark write per flush)
        --> callbacks complete responses --> ResponseSequencer --> writer

Shutdown (SIGINT/SIGTERM, or ``Server.shutdown``) runs stage by stage so
nothing accepted is dropped: stop accepting; stop reading requests; close the
RequestChannel so handlers drain their queues; close the persister so it
flushes everything; wait until every connection has written its responses;
then cancel what is left.
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Awaitable, Callable, Collection, Protocol, Sequence

import trio

from pipeline.admin.apis import AdminApis, broker_configs
from pipeline.config import Mode, ServerConfig
from pipeline.metadata.leadership import LeadershipStore
from pipeline.metadata.topics import FILE as TOPIC_STORE_FILE, TopicStore
from pipeline.cluster.membership import Cluster, DynamicCluster
from pipeline.cluster.service import CommitEnds, LeadershipService
from pipeline.log.batch import PartitionAppend
from pipeline.log.checkpoint import Checkpoint
from pipeline.admin.topic_configs import TopicConfigs, broker_topic_defaults
from pipeline.log.fetch import FetchApis
from pipeline.requests.txn_apis import TransactionApis
from pipeline.log.manager import LogManager
from pipeline.log.state import LogState
from pipeline.table.layout import COMMIT_IDLE_MIN_BYTES, TABLES_DIR
from pipeline.table.reader import TableReader
from pipeline.coordinator.coordinator import GroupConfig
from pipeline.coordinator.service import GroupCoordinatorService
from pipeline.network.acceptor import Acceptor
from pipeline.network.channel import KafkaChannel, MemoryWaiters
from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.connection_state import (
    ConnectionLimits,
    ConnectionState,
)
from pipeline.network.io_wait import IoWaitMeter
from pipeline.network.listeners import (
    TLS_PROTOCOLS,
    Endpoint,
    Listener,
    security_protocol,
)
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.processor import Processor
from pipeline.persist.accumulator import FlushPolicy
from pipeline.persist.persister import DEFAULT_WAL_POLICY, BatchingPersister, offset_ranges
from pipeline.log.control import TRANSACTIONAL, batch_kind
from pipeline.persist.recovery import Recovered, TableSink, recover, recover_log, replay, settle_transactions
from pipeline.log.checkpoint import StateStore
from pipeline.log.wal import WriteAheadLog
from pipeline.protocol.apis import BrokerInfo
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import MultiQueueRequestChannel, RequestChannel, SharedRequestChannel
from pipeline.requests.handler import KafkaApis, RequestHandler
from pipeline.metadata.database import store_target
from pipeline.metadata.producer_ids import ProducerIdManager, ProducerIdStore
from pipeline.security.sasl import FailedAuthenticationThrottle
from pipeline.requests.sasl_apis import SaslApis
from pipeline.security.users import UserStore
from pipeline.security.tls import TlsConfigError, TlsSettings, server_context
from pipeline.security.acl import Authorizer, parse_super_users
from pipeline.requests.acl_apis import AclApis
from pipeline.security.acl_store import ACL_STORE_FILE, AclStore

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """The wall clock in ms since the epoch (the clock Kafka's retention.ms is measured against)."""
    return int(time.time() * 1000)


def state_dir(c: ServerConfig) -> Path:
    """Where this broker keeps its own state (WAL, checkpoint, lock): ``DATA_DIR/_pipeline``
    alone; ``DATA_DIR/_pipeline/broker-<node.id>`` as a member of a cluster, whose brokers
    share the data directory's stores (topics, groups, users, ACLs) and tables."""
    base = Path(c.data_dir) / "_pipeline"
    alone = c.cluster_brokers is None and c.cluster_leadership == "static"
    return base if alone else base / f"broker-{c.node_id}"


def discard_unacknowledged(c: ServerConfig) -> None:
    """With leadership through the database: a broker starts with no WAL and no checkpoint of its own.
    With ``--ack-on spark`` neither holds anything acknowledged that the table lacks, and a partition
    may have moved to another broker meanwhile, whose offsets a replay of this WAL would collide with;
    each partition is taken over from the table when this broker leads it (``pipeline.cluster.service``)."""
    own = state_dir(c)
    wal = own / "wal"
    if wal.is_dir():
        for f in wal.iterdir():
            if f.is_file():
                f.unlink()
    (own / StateStore.FILE).unlink(missing_ok=True)


def incarnation_dir(c: ServerConfig, incarnation: uuid.UUID) -> Path:
    """With leadership through the database and ``--ack-on wal``: one broker incarnation's WAL and
    checkpoint, ``DATA_DIR/_pipeline/broker-<node.id>/incarnation-<id>``, on the volume every broker
    reaches. A new incarnation starts with an empty one; the one before may hold acknowledged records
    the table lacks, which the controller writes to the table before any partition is taken over
    (``pipeline.cluster.service``, ``Server.drain_wal``); its next incarnation deletes it once drained."""
    return state_dir(c) / f"incarnation-{incarnation}"


def cluster_of(c: ServerConfig) -> Cluster | None:
    """The cluster this broker is a member of (``pipeline.cluster.brokers``); None: alone."""
    return None if c.cluster_brokers is None else Cluster(c.cluster_brokers, c.node_id)


CLUSTER_STORE_FILE = "cluster.db"
"""SQLite file of the brokers' registrations and partition leaders without ``pipeline.metadata.url``."""
PRODUCER_ID_STORE_FILE = "producer_ids.db"
"""SQLite file of the producer-id blocks without ``pipeline.metadata.url``."""

METADATA_REFRESH_S = 0.25
"""In a cluster (or on a metadata database), how often a broker looks for topic and ACL changes
other brokers made (s): one single-row read per store (its change version,
``pipeline.metadata.database``), a reload only when it moved; so a change made through one broker
is served by the others within this plus a reload (issue 24: within 1 s). A topic name a broker
does not know is looked up at once; SCRAM users are read at every authentication and committed
offsets are served by the group's coordinator alone, so neither waits for this."""


def listener_endpoints(c: ServerConfig) -> tuple[Endpoint, ...]:
    """Every listener to open, in order; the first at ``listen_host:listen_port`` (KIP-103)."""
    first_name = c.listeners[0].name if c.listeners else "PLAINTEXT"
    return (Endpoint(first_name, c.listen_host, c.listen_port), *(c.listeners or ())[1:])


def build_listeners(c: ServerConfig) -> list[tuple[Endpoint, Listener]]:
    """Each listener with its security protocol and, for SSL and SASL_SSL, its TLS context
    (Kafka ChannelBuilders.create: one SslFactory per TLS listener).

    Raises:
        pipeline.security.tls.TlsConfigError: a TLS listener without a usable keystore or truststore.
        ValueError: a listener name missing from ``listener.security.protocol.map``.
    """
    out = []
    contexts: dict[TlsSettings, ssl.SSLContext] = {}  # listeners with the same settings share one context
    for endpoint in listener_endpoints(c):
        protocol = security_protocol(endpoint.name, c.listener_security_protocol_map)
        context = None
        if protocol in TLS_PROTOCOLS:
            lc = listener_config(c, endpoint.name)
            settings = TlsSettings(
                lc.ssl_keystore_location, lc.ssl_key_password, lc.ssl_truststore_location, lc.ssl_client_auth,
                lc.ssl_enabled_protocols, lc.ssl_handshake_timeout_ms, keystore_type=lc.ssl_keystore_type,
                keystore_password=lc.ssl_keystore_password, truststore_type=lc.ssl_truststore_type,
                truststore_password=lc.ssl_truststore_password)
            if settings not in contexts:
                try:
                    contexts[settings] = server_context(settings)
                except TlsConfigError as exc:
                    if lc is c:
                        raise
                    raise TlsConfigError(f"listener {endpoint.name} (listener.name.{endpoint.name.lower()}.*): "
                                         f"{exc}") from None
            context = contexts[settings]
        out.append((endpoint, Listener(endpoint.name, protocol, context, c.ssl_handshake_timeout_ms / 1000.0)))
    return out


def listener_config(c: ServerConfig, listener: str) -> ServerConfig:
    """``c`` with listener ``listener``'s ``listener.name.<name>.*`` overrides applied (Kafka
    ``ListenerName.configPrefix``; names compared in lower case); ``c`` itself if it has none."""
    for name, settings in c.listener_overrides:
        if name == listener.lower():
            return replace(c, **dict(settings))
    return c


def advertised_endpoints(c: ServerConfig, bound: list[tuple[Endpoint, str, int]]) -> tuple[tuple[str, str, int], ...]:
    """(name, host, port) Metadata gives a client of each listener: its ``advertised.listeners``
    entry, else (the first listener) ``advertised_host``/``advertised_port``, else where it is bound."""
    named = {e.name: e for e in c.advertised_listeners or ()}
    out = []
    for i, (endpoint, host, port) in enumerate(bound):
        if endpoint.name in named:
            host, port = named[endpoint.name].host, named[endpoint.name].port or port
        elif i == 0 and c.advertised_listeners is None and c.advertised_host:
            host, port = c.advertised_host, c.advertised_port or port
        out.append((endpoint.name, host, port))
    return tuple(out)


def can_recover_without_table(c: ServerConfig) -> bool:
    """Whether ``Server.recover_log`` can start without Spark: the broker has a checkpoint, or its
    data directory holds no table yet (``DATA_DIR/tables`` absent or empty, ``TABLES_DIR``) in the embedded
    metastore. Otherwise a missing checkpoint means asking the table where each partition ends."""
    if StateStore(state_dir(c)).load() is not None:
        return True
    if c.metastore_uris or c.spark_remote:
        return False
    tables = Path(c.data_dir) / TABLES_DIR
    return not tables.exists() or not any(tables.iterdir())


class ServerSink(TableSink, Protocol):
    """The table side a ``Server`` runs on (``SparkGroupSink``): a ``TableSink`` that can also drop a
    deleted topic's rows. With ``table.compaction.interval.ms`` set it must also be a
    ``MaintainedSink``; one with a ``catalog`` attribute (a ``TableCatalog``) serves fetches of offsets
    the WAL no longer holds."""

    def drop_topic(self, topic: str) -> int:
        """Remove every row of ``topic`` from the tables (blocking); returns the partitions dropped."""


class Server:
    """One broker front end: ``recover`` (blocking), then ``serve`` until ``shutdown``.

    Or, listening before Spark is up (``--ack-on wal``): ``recover_log`` (blocking, no JVM), then
    ``serve`` with ``table_ready=False``, and ``table_started`` once the sink is started: produce
    is acknowledged at the WAL meanwhile, and the persister writes the WAL backlog, then what
    came since, once Spark is up.

    Args:
        config: see ServerConfig.
        sink: the table side.
        table_ready: the sink is started; False: ``table_started`` says when.
    """

    def __init__(self, config: ServerConfig, sink: ServerSink, *, table_ready: bool = True) -> None:
        self.config = config
        self.sink = sink
        self.table_ready = table_ready
        """The sink is started (the table side writes and serves reads)."""
        own = state_dir(config)
        self.cluster = cluster_of(config)
        self.dynamic = config.cluster_leadership == "database"
        """Leadership through the metadata database (``pipeline.cluster.service``)."""
        self.incarnation = uuid.uuid4()
        """This process's incarnation id (its registration's, with leadership through the database)."""
        self.wal_path: str | None = None
        """With leadership through the database and ``--ack-on wal``: this incarnation's WAL and checkpoint
        directory, relative to the data directory (``incarnation_dir``)."""
        if self.dynamic and config.ack_on == "wal":
            own = incarnation_dir(config, self.incarnation)
            self.wal_path = str(own.relative_to(config.data_dir))
        elif self.dynamic:
            discard_unacknowledged(config)
        self.leadership: LeadershipService | None = None
        self.wal = WriteAheadLog(own / "wal", segment_bytes=config.log_segment_bytes)
        self.store = StateStore(own)
        self.logs = LogManager(wal=self.wal, retention=self._retention, index_max_bytes=config.wal_index_max_bytes,
                               table_pending=not table_ready)  # until _attach_table, or table_failed
        """Every partition's log: offsets, producer state, high watermarks, reads, WAL retention."""
        self.recovered: Recovered | None = None
        self._shutdown = trio.Event()
        self.address: tuple[str, int] | None = None
        self.listener_addresses: list[tuple[str, str, str, int]] = []
        self.processors: list[Processor] = []
        self.memory_pool = MemoryPool(config.queued_max_request_bytes)
        self.quotas = ConnectionQuotas(config.max_connections,
                                       config.max_connections_per_ip or config.max_connections)
        self.request_channel: RequestChannel | None = None
        self.persister: BatchingPersister | None = None
        self.handlers: list[RequestHandler] = []
        self.apis: KafkaApis | None = None
        self.coordinator: GroupCoordinatorService | None = None
        self.registry_url: str | None = None
        """The Schema Registry's base URL once it listens (``schema.registry.listeners``), else None."""
        self.io_wait = IoWaitMeter()
        """The event loop's time waiting for I/O while serving (NetworkProcessorAvgIdlePercent)."""

    async def _serve_registry(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """The Schema Registry (``schema.registry.listeners``) until cancelled; reports its URL.

        Raises:
            ValueError: https with a PKCS12 keystore (the registry reads a PEM one) or none.
            OSError: the address cannot be bound.
        """
        from urllib.parse import urlsplit

        from pipeline.registry.http import RegistryListener, serve_registry
        from pipeline.registry.service import SchemaRegistry
        from pipeline.registry.store import SchemaStore

        c = self.config
        assert c.schema_registry_listener is not None
        url = urlsplit(c.schema_registry_listener)
        certfile = None
        if url.scheme == "https":
            if c.ssl_keystore_location is None or c.ssl_keystore_type != "PEM":
                raise ValueError("schema.registry.listeners https:// needs a PEM ssl.keystore.location "
                                 "(certificate chain and key)")
            certfile = c.ssl_keystore_location
        store = await trio.to_thread.run_sync(SchemaStore.for_data_dir, c.data_dir, c.metadata_url)
        users = (UserStore.for_data_dir(c.data_dir, c.metadata_url)
                 if c.schema_registry_authentication_method == "BASIC" else None)
        try:
            listener = RegistryListener(url.hostname or "127.0.0.1", url.port or 0, certfile=certfile)
            await serve_registry(SchemaRegistry(store), listener, users.verify_plain if users else None,
                                 task_status=task_status)
        finally:
            store.close()
            if users is not None:
                users.close()

    def recover(self) -> Recovered:
        """Replay the WAL into the table and rebuild offsets and producer state (blocking; the sink started).
        With leadership through the database there is nothing to replay (``discard_unacknowledged``)."""
        if self.dynamic:
            self.wal.open(None, self.logs.index_wal_entry)  # empty: discard_unacknowledged
            self.recovered = Recovered(Checkpoint())
            self._attach_table()
            return self.recovered
        self.recovered = recover(self.sink, self.wal, self.store, visit=self.logs.index_wal_entry,
                                 policy=self.commit_policy())
        self._attach_table()
        self._start_logs(self.recovered)
        return self.recovered

    def recover_log(self) -> Recovered:
        """Rebuild offsets and producer state from the checkpoint and the WAL without the table
        (blocking, no JVM; ``pipeline.persist.recovery.recover_log``): the WAL entries after the
        checkpoint become the persister's backlog, written once the sink is started.

        Raises:
            RuntimeError: there is no checkpoint and the sink is not started (the table's end
                offsets are needed: ``can_recover_without_table`` says when they are not).
            pipeline.log.wal.WalCorruptionError: the WAL is damaged before its tail.
        """
        end_offsets = self.sink.end_offsets if self.table_ready else None
        if end_offsets is None and not can_recover_without_table(self.config):
            raise RuntimeError("no checkpoint and a table that may hold rows: recovery needs Spark started")
        self.recovered = recover_log(self.wal, self.store, visit=self.logs.index_wal_entry, end_offsets=end_offsets)
        self._start_logs(self.recovered)
        return self.recovered

    def _start_logs(self, recovered: Recovered) -> None:
        self.logs.start(LogState.from_checkpoint(recovered.checkpoint), recovered.checkpoint.end_offsets)

    def _attach_table(self) -> None:
        catalog = getattr(self.sink, "catalog", None)
        if catalog is not None:
            # Offsets whose WAL segments retention deleted are read from the tables.
            self.logs.attach_table(TableReader(catalog.spark, catalog, warm=True))

    def _retention(self, topic: str) -> tuple[int, int]:
        """(retention.ms, retention.bytes) of ``topic`` for the logs: its topic configs once the topic
        catalog is built (``TopicCatalog.retention``), the broker's defaults before."""
        catalog: TopicCatalog | None = getattr(self, "catalog", None)
        if catalog is None:
            return self.config.log_retention_ms, self.config.log_retention_bytes
        return catalog.retention(topic)

    def drain_wal(self, directory: Path, ends: CommitEnds) -> tuple[list[PartitionAppend], list[PartitionAppend]]:
        """A dead broker incarnation's WAL (``directory``: its ``wal/`` and checkpoint, as
        ``incarnation_dir`` lays them out): write the records after its checkpoint that the table lacks
        (``pipeline.persist.recovery.replay``), transactions settled by the markers it holds
        (``settle_transactions``: committed ones written, aborted ones dropped, open ones left in
        the second list returned, for their partitions' next leaders). What the table holds of a partition is known from the end its commits recorded
        (``ends.recorded``); the table is read, holding the tables shared, only for the partitions
        without one, after the tables were held exclusively to fence a pending commit of theirs by a
        writer that is no longer a member (``_fence_dead_writers``). No other broker writes these
        partitions meanwhile (none is taken over while a dead WAL is undrained; one handed off before
        had everything of it in the table), so each write of the replay holds the tables itself,
        shared when it changes no table (``SparkGroupSink.write``), and other brokers commit beside it.
        The write records its partitions' ends as the persister's commits do (``ends.begin``/``done``).
        Blocking; the sink started. Returns (the appends after the checkpoint, the open transactions' among them).

        Raises:
            pipeline.log.wal.WalCorruptionError: the WAL is damaged before its tail.
            pipeline.metadata.brokers.FencedBrokerError: this broker is no longer a member (nothing written).
            Whatever Spark raises if the table cannot be read or written.
        """
        wal = WriteAheadLog(directory / "wal", segment_bytes=self.config.log_segment_bytes)
        try:
            recovered = recover_log(wal, StateStore(directory))
        finally:
            wal.close()
        appends = [a for _, entry in recovered.backlog for a in entry]
        if not appends:
            return appends, []
        backlog, open_appends = settle_transactions(recovered.backlog)
        hold = self._table_lock()
        ranges = offset_ranges(appends)
        recorded = ends.recorded(ranges.keys())
        # A partition with a transaction committed in this WAL: its recorded end may count that
        # transaction's offsets before its records were in the table (a leader hands off or dies with
        # them open, ``LeadershipService._hand_off``): the table says which of them it holds.
        released = {(a.topic, a.partition) for _, entry in backlog for a in entry
                    if batch_kind(a.records) == TRANSACTIONAL}
        unknown = {key: r for key, r in ranges.items() if key not in recorded or key in released}
        present: set[tuple[str, int, int]] = set()
        if unknown:
            store = self._leadership_store
            writers = store.pending_writers(unknown.keys()) if store is not None else set()
            if writers:  # exclusively, only to fence (as a take-over's read, ``_table_end_offsets``)
                with hold(False) if hold is not None else nullcontext():
                    self._fence_dead_writers(writers)
            with hold(True) if hold is not None else nullcontext():
                present = self.sink.present_offsets(unknown)
        present |= {(a.topic, a.partition, o) for a in appends if (a.topic, a.partition) in recorded.keys() - released
                    for o in range(a.base_offset, min(a.base_offset + a.record_count,
                                                      recorded[(a.topic, a.partition)]))}
        ends.begin(appends)  # the open transactions' offsets too: the next leader continues after them
        replay(self.sink, backlog, present=present)  # each write holds the tables, shared when it can
        ends.done(appends)
        return appends, open_appends

    def _live_publisher(self, endpoints: Sequence[tuple[str, str, int]],
                        ) -> Callable[[dict[tuple[str, int], int], bool], None] | None:
        """The persister's ``publish_live``: the sink's, with the brokers the live view's tail reads
        from (this broker's first PLAINTEXT listener as advertised, then the other brokers of a static
        cluster); None without a sink that publishes, or without a PLAINTEXT listener (the tail's
        consumer would need credentials the catalog must not hold)."""
        publish = getattr(self.sink, "publish_live", None)
        plain = [(h, p) for name, h, p in endpoints
                 if security_protocol(name, self.config.listener_security_protocol_map) == "PLAINTEXT"]
        if publish is None or not plain:
            if publish is not None:
                log.info("no PLAINTEXT listener: the live view (records_live) is not published")
            return None
        addresses = [f"{plain[0][0]}:{plain[0][1]}"]
        if self.cluster is not None:
            addresses += [f"{b.host}:{b.port}" for b in self.cluster.brokers if b.node_id != self.config.node_id]
        return functools.partial(publish, ",".join(addresses))

    def _is_controller(self) -> bool:
        """Whether this broker is the controller now (leadership through the database)."""
        return self.leadership is not None and self.leadership.controller_epoch is not None

    @property
    def _leadership_store(self) -> LeadershipStore | None:
        """The leadership store in the metadata database, while this broker's ``LeadershipService`` has
        it open (leadership through the database)."""
        return self.leadership.store if self.leadership is not None else None

    def _table_lock(self) -> Callable[[bool], AbstractContextManager[None]] | None:
        """The sink's hold on the shared tables (``SparkGroupSink.hold_table``: ``shared``, or exclusive
        by default), if it has one."""
        return getattr(self.sink, "hold_table", None)

    def _table_end_offsets(self, keys: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The table's (topic, partition) -> end offset over the rows of the topics of ``keys``, as
        other brokers left it (blocking). With leadership through the database it is read holding
        the tables' lock shared. When a commit of one of ``keys`` is pending, the lock is held
        exclusively first, just to fence the commits in flight of ``keys`` by brokers that are no
        longer members (``_fence_dead_writers``): a commit by the partition's previous leader, which
        checks its membership and commits under that lock (``BatchingPersister(table_lock=...)``),
        has then ended or can land nothing more, even if that leader only stalled, and the read
        (a Spark job over the topics' rows, seconds) holds back no other broker's commits. Without
        one pending (a topic from a single-broker run of the data directory; a new topic's
        partitions have a recorded end of 0 and are not read, ``LeadershipStore.record_new_partitions``)
        there is nothing to fence."""
        topics = {t for t, _ in keys}
        hold = self._table_lock() if self.dynamic else None
        store = self._leadership_store
        # No commit of ``keys`` pending (a partition no commit ever recorded: a single-broker run's): nothing to
        # fence, and a writer that is no longer a member cannot begin one (``record_producers`` is fenced
        # by its membership).
        writers = store.pending_writers(keys) if store is not None else set()
        started = time.monotonic()
        if writers:
            with hold(False) if hold is not None else nullcontext():
                self._fence_dead_writers(writers)
        fenced = time.monotonic()
        with hold(True) if hold is not None else nullcontext():
            self._refresh_tables(topics)
            ends = self.sink.end_offsets(topics)
        log.info("read the table's end offsets of %d partition(s) of %s holding the tables shared (%.2f s)%s",
                 len(keys), ", ".join(sorted(topics)), time.monotonic() - fenced,
                 f", after holding them exclusively to fence a pending commit of theirs ({fenced - started:.2f} s)"
                 if writers else ": no commit of theirs pending")
        return ends

    def _fence_dead_writers(self, writers: Collection[tuple[int, int, str | None]]) -> None:
        """Holding the tables' lock exclusively: the broker runs among ``writers`` ((node id, broker
        epoch, staging) whose commit of a partition taken over is pending, ``LeadershipStore.pending_writers``)
        that are not live members now have their staging directory moved away
        (``SparkGroupSink.fence_staging``), so a commit of theirs still in flight (a paused broker that
        wakes) cannot add a file after this; a later run of the same node stages elsewhere. Blocking."""
        store = self._leadership_store
        fence = getattr(self.sink, "fence_staging", None)
        if store is None or fence is None or not writers:
            return
        live = {(m.node_id, m.epoch) for m in store.registry.live_members()}
        for node, epoch, staging in sorted(writers, key=str):
            if (node, epoch) not in live and staging is not None and fence(staging):
                log.warning("broker %d (epoch %d) died (or stalled) within a table commit: its staging directory "
                            "is moved away, so nothing more of that commit lands", node, epoch)

    def _refresh_tables(self, topics: Collection[str]) -> None:
        """Drop this Spark session's cached relations of the tables holding ``topics`` (blocking):
        another broker's commits and tables are not in them yet. One catalog call per table, no job."""
        catalog = getattr(self.sink, "catalog", None)
        if catalog is not None:
            for owned in catalog.tables(topics):
                catalog.spark.catalog.refreshTable(owned.name)

    def table_started(self) -> None:
        """The sink is started (call it in the trio thread): reads of offsets only the table holds
        are served, and the persister writes the WAL backlog, then what waits."""
        self._attach_table()
        self.table_ready = True
        if self.persister is not None:
            self.persister.mark_table_ready()

    def table_failed(self) -> None:
        """The sink will not start (call it in the trio thread): a stop stops waiting for it to
        write what was acknowledged (the WAL keeps it)."""
        self.logs.abandon_table()
        if self.persister is not None:
            self.persister.abandon_table()

    @property
    def shutting_down(self) -> bool:
        return self._shutdown.is_set()

    def shutdown(self) -> None:
        """Begin the ordered shutdown (see module docstring). Safe to call twice."""
        self._shutdown.set()

    def commit_policy(self) -> FlushPolicy:
        """When the Spark stage commits to the table.

        With ``ack_on="wal"`` produce latency does not depend on it, so a
        commit waits ``table_commit_interval_ms`` (large files, one commit per
        interval); with ``ack_on="spark"`` every produce waits for its commit,
        so it waits only ``linger_ms``. Either way a commit goes early at
        ``batch_max_records`` / ``batch_max_bytes``; with ``ack_on="wal"``
        also once the input has been quiet for ``table_commit_idle_ms`` with
        at least ``COMMIT_IDLE_MIN_BYTES`` waiting.
        """
        c = self.config
        if c.ack_on == "wal":
            return FlushPolicy(c.batch_max_records, c.batch_max_bytes, c.table_commit_interval_ms,
                               idle_ms=c.table_commit_idle_ms, idle_min_bytes=COMMIT_IDLE_MIN_BYTES)
        return FlushPolicy(c.batch_max_records, c.batch_max_bytes, c.linger_ms)

    async def _watch_metadata(self, on_deleted: Callable[[str], Awaitable[None]]) -> None:
        """In a cluster: take other brokers' topic and ACL changes every ``METADATA_REFRESH_S``; a
        topic another broker deleted has this broker's data of it dropped too (``on_deleted``: what
        remains buffered here is flushed first, then dropped with the topic's rows, so rows
        this broker flushed after the deleting broker dropped the table's do not survive)."""
        while True:
            await trio.sleep(METADATA_REFRESH_S)
            try:
                await self.catalog.refresh_async()
            except Exception as exc:  # a busy or briefly locked store: next time
                log.warning("reading the shared topic store failed: %s", exc)
            try:
                await self.acl_apis.refresh()
            except Exception as exc:
                log.warning("reading the shared ACL store failed: %s", exc)
            while self.catalog.deleted_elsewhere:
                topic = self.catalog.deleted_elsewhere[0]
                if self.catalog.partitions(topic) is None:  # not re-created meanwhile
                    try:
                        await on_deleted(topic)
                    except Exception as exc:
                        log.warning("dropping this broker's data of deleted topic %r failed (retried): %s",
                                    topic, exc)
                        break
                self.catalog.deleted_elsewhere.pop(0)

    def _build_request_channel(self) -> tuple[RequestChannel, int]:
        c = self.config
        if c.mode is Mode.MULTIQUEUE:
            capacity = max(1, c.queued_max_requests // c.queues)
            return MultiQueueRequestChannel(c.queues, capacity), c.queues
        return SharedRequestChannel(c.queued_max_requests), c.io_threads

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, serve until ``shutdown``, then stop in order. Reports (host, port) when ready."""
        c = self.config
        listeners: list[trio.SocketListener] = []
        kinds: list[Listener] = []
        bound: list[tuple[Endpoint, str, int]] = []
        for endpoint, kind in build_listeners(c):
            sockets = await trio.open_tcp_listeners(endpoint.port, host=endpoint.host)
            listeners += sockets
            kinds += [kind] * len(sockets)
            bound.append((endpoint, *sockets[0].socket.getsockname()[:2]))
        self.listener_addresses = [(e.name, security_protocol(e.name, c.listener_security_protocol_map), h, p)
                                   for e, h, p in bound]
        """(listener name, security protocol, host, port) of every listener, as bound."""
        host, port = bound[0][1:]
        self.address = (host, port)
        endpoints = advertised_endpoints(c, bound)
        cluster: Cluster | DynamicCluster | None = self.cluster
        if self.dynamic:
            cluster = DynamicCluster(c.node_id, endpoints[0][1], endpoints[0][2])
            self.leadership = LeadershipService(
                cluster, store_target(c.metadata_url, c.data_dir, CLUSTER_STORE_FILE), endpoints,
                session_ms=c.broker_session_timeout_ms, heartbeat_ms=c.broker_heartbeat_interval_ms,
                logs=self.logs, end_offsets=self._table_end_offsets,
                staging_name=lambda: getattr(self.sink, "staging_name", None),
                topics=lambda: self.catalog.all_topics(),
                incarnation=self.incarnation, data_dir=Path(c.data_dir), wal_path=self.wal_path,
                drain_wal=self.drain_wal if self.wal_path is not None else None)
        broker = BrokerInfo(
            node_id=c.node_id,
            host=endpoints[0][1],
            port=endpoints[0][2],
            cluster_id=c.cluster_id,
            endpoints=endpoints,
            cluster=cluster,
        )
        recovered = self.recovered or (self.recover() if self.table_ready else self.recover_log())
        checkpoint = recovered.checkpoint
        persister = BatchingPersister(
            self.sink, self.wal, self.store, recovered.stored,
            self.commit_policy(),
            backlog=recovered.backlog,
            table_ready=self.table_ready,
            wal_policy=replace(DEFAULT_WAL_POLICY, linger_ms=c.wal_linger_ms),
            ack_on=c.ack_on,
            max_buffer_bytes=c.buffer_memory,
            # In a cluster one broker compacts and applies retention: with `--brokers N` the controller
            # (lowest id); with leadership through the database whichever broker is the controller at
            # the time (the maintenance moves with it when a broker dies).
            maintenance_interval_s=c.table_compaction_interval_ms / 1000.0 if c.table_compaction_interval_ms and (
                self.cluster is None or self.dynamic or self.cluster.controller_id == c.node_id) else None,
            maintains=self._is_controller if self.dynamic else None,
            log_listener=self.logs,
            before_table_write=self.leadership.before_table_write if self.leadership is not None else None,
            after_table_write=self.leadership.after_table_write if self.leadership is not None else None,
            table_lock=self._table_lock(),
            publish_live=self._live_publisher(endpoints),
        )
        self.persister = persister
        request_channel, handler_count = self._build_request_channel()
        self.request_channel = request_channel
        # Topics persist in DATA_DIR/_pipeline/topics.db; a data dir from before the store
        # brings its checkpoint's topics once (pipeline.metadata.topics).
        self.catalog = TopicCatalog(c.num_partitions, c.auto_create_topics,
                                    {t: max(n, c.num_partitions) for t, n in checkpoint.topics.items()},
                                    store=TopicStore(store_target(c.metadata_url, c.data_dir, TOPIC_STORE_FILE)),
                                    retention_defaults=(c.log_retention_ms, c.log_retention_bytes),
                                    # With a metadata database, brokers on other hosts may change topics at any time.
                                    shared=(self.cluster is not None and self.cluster.size > 1 or bool(c.metadata_url)
                                            or self.dynamic),
                                    # A new partition's table end is 0: its first leader reads nothing from the table.
                                    on_new_partitions=(self.leadership.record_new_partitions
                                                       if self.leadership is not None else None))
        # Producer ids: from the wall clock on one machine; with a metadata database, blocks claimed
        # from it (Kafka's ProducerIdManager), so no two brokers on any hosts hand out the same id.
        producer_ids = (ProducerIdManager(ProducerIdStore(store_target(c.metadata_url, c.data_dir,
                                                                       PRODUCER_ID_STORE_FILE)), c.node_id)
                        if c.metadata_url or self.dynamic else None)
        # ACLs (authorizer.class.name set): DATA_DIR/_pipeline/acls.db, checked by every api
        # through KafkaApis.authorize; off, the ACL apis answer SECURITY_DISABLED.
        acl_store = (AclStore(store_target(c.metadata_url, c.data_dir, ACL_STORE_FILE)) if c.authorizer_class_name
                     else None)
        authorizer = (Authorizer(acl_store.load(), parse_super_users(c.super_users), c.allow_everyone_if_no_acl_found)
                      if acl_store is not None else None)
        if authorizer is not None:
            log.info("authorizer on: %d ACL(s), %d super user(s)", len(authorizer.acls), len(authorizer.super_users))
        self.apis = KafkaApis(
            broker,
            self.catalog,
            self.logs,
            persister,
            first_producer_id=time.time_ns() // 1_000_000,
            yield_before_sequencing=c.mode is not Mode.MULTIQUEUE,
            request_metrics=request_channel.metrics,
            producer_ids=producer_ids,
            authorizer=authorizer,
        )
        # Consumer groups: JoinGroup/SyncGroup/Heartbeat/LeaveGroup, committed offsets in
        # DATA_DIR/_pipeline/groups.db, FindCoordinator and the group admin apis.
        self.coordinator = GroupCoordinatorService.for_data_dir(self.apis, GroupConfig(
            initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=c.group_min_session_timeout_ms,
            max_session_timeout_ms=c.group_max_session_timeout_ms), c.data_dir, c.metadata_url)
        self.coordinator.register()
        # Transactions (KIP-98): state in DATA_DIR/_pipeline/transactions.db (shared by a cluster's
        # brokers, which queue each other's markers there). With leadership through the database, in the
        # leadership's database (a coordinator's writes are fenced by its __consumer_offsets partition's
        # leader epoch there), and only with --ack-on wal: a dead broker's open transactions are in its
        # WAL on the shared volume, which another broker drains; with --ack-on spark its WAL is its own.
        self.transactions: TransactionApis | None = None
        if not self.dynamic:
            self.transactions = TransactionApis.for_data_dir(self.apis, self.coordinator, c.data_dir,
                                                             c.transaction_max_timeout_ms, c.metadata_url)
        elif self.wal_path is not None:
            self.transactions = TransactionApis(self.apis, self.coordinator,
                                                store_target(c.metadata_url, c.data_dir, CLUSTER_STORE_FILE),
                                                c.transaction_max_timeout_ms)
        if self.transactions is not None:
            self.transactions.register()
        self.fetch_apis = FetchApis(self.logs, self.apis.catalog, request_channel.metrics)
        self.fetch_apis.register(self.apis)

        async def on_delete_topic(topic: str) -> None:
            # Kafka deletes a topic's data: everything already accepted for it
            # reaches the table first (so nothing lands after the drop), then
            # its rows go, then its partition logs (a re-created topic starts at 0).
            await persister.sync_table()
            await trio.to_thread.run_sync(self.sink.drop_topic, topic)
            await persister.forget_topic(topic)
            if self.leadership is not None:
                await self.leadership.forget_topic(topic)
            self.logs.drop_topic(topic)
            if self.logs.table is not None:
                self.logs.table.invalidate(topic)

        self.admin_apis = AdminApis(broker, self.catalog, TopicConfigs(broker_topic_defaults(c), c.table),
                                    on_delete_topic, broker_configs(c), request_channel.metrics)
        self.admin_apis.register(self.apis)
        # SASL on SASL_PLAINTEXT/SASL_SSL listeners; users in DATA_DIR/_pipeline/users.db.
        self.sasl_apis = SaslApis(UserStore.for_data_dir(c.data_dir, c.metadata_url), tuple(c.sasl_enabled_mechanisms.split(",")),
                                  FailedAuthenticationThrottle(c.failed_authentication_delay_ms),
                                  {e.name: tuple(listener_config(c, e.name).sasl_enabled_mechanisms.split(","))
                                   for e in listener_endpoints(c)})
        self.sasl_apis.register(self.apis)
        self.acl_apis = AclApis(authorizer, acl_store)
        self.acl_apis.register(self.apis)
        mute = c.mode is Mode.BASELINE
        ordered = c.mode is not Mode.SHARED_UNMUTED
        limits = ConnectionLimits(
            max_receive_bytes=c.socket_request_max_bytes,
            # Classic Kafka mutes a channel after each request until its
            # response is sent: an in-flight cap of one.
            max_in_flight=1 if mute else c.max_in_flight_requests_per_connection,
            response_buffer_max_bytes=c.response_buffer_max_bytes,
            receive_timeout_ms=c.request_receive_timeout_ms,
            send_timeout_ms=c.response_send_timeout_ms,
            idle_timeout_ms=c.connections_max_idle_ms,
        )
        pool = self.memory_pool
        memory = MemoryWaiters(pool)
        if c.socket_request_max_bytes > pool.capacity:
            log.warning("socket.request.max.bytes %d > queued.max.request.bytes %d: requests larger "
                        "than the pool are refused", c.socket_request_max_bytes, pool.capacity)

        def channel_factory(connection_id: str, stream: trio.abc.Stream, listener: Listener,
                            principal: str) -> KafkaChannel:
            state = ConnectionState(pool, limits, trio.current_time(), ordered=ordered)
            return KafkaChannel(connection_id, stream, request_channel, state, memory, listener=listener.name,
                                security_protocol=listener.security_protocol, principal=principal)

        self.processors = [Processor(i, channel_factory, self.quotas) for i in range(c.network_threads)]
        acceptor = Acceptor(listeners, self.processors, self.quotas, kinds)
        self.handlers = [RequestHandler(i, self.apis, request_channel) for i in range(handler_count)]
        # Removed when the run ends if serving ends by an exception or a second signal.
        trio.lowlevel.add_instrument(self.io_wait)
        async with trio.open_nursery() as nursery:
            if self.leadership is not None:
                await nursery.start(self.leadership.run, persister, self.coordinator, self.transactions)
            await nursery.start(persister.run)
            await nursery.start(self.apis.run_timeouts)
            await nursery.start(self.coordinator.run)
            if self.transactions is not None:
                await nursery.start(self.transactions.run)
            await nursery.start(self.logs.run, wall_clock_ms)
            await nursery.start(self.fetch_apis.run)
            await nursery.start(self.sasl_apis.run)
            if c.schema_registry_listener is not None:
                self.registry_url = await nursery.start(self._serve_registry)
            if self.catalog.shared:
                nursery.start_soon(self._watch_metadata, on_delete_topic)
            handlers_done = trio.Event()

            async def run_handlers() -> None:
                async with trio.open_nursery() as hn:
                    for h in self.handlers:
                        await hn.start(h.run)
                handlers_done.set()

            nursery.start_soon(run_handlers)
            processors_done = trio.Event()

            async def run_processors() -> None:
                async with trio.open_nursery() as pn:
                    for p in self.processors:
                        await pn.start(p.run)
                processors_done.set()

            nursery.start_soon(run_processors)
            acceptor_scope = trio.CancelScope()

            async def run_acceptor(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                with acceptor_scope:
                    await acceptor.run(task_status=task_status)

            await nursery.start(run_acceptor)
            log.info(
                "mode %s: %s, %d network threads, persisting to %s",
                c.mode.value,
                f"{c.queues} queues, {limits.max_in_flight} in flight per connection"
                if c.mode is Mode.MULTIQUEUE else
                f"shared queue of {c.queued_max_requests}, {c.io_threads} handlers"
                + (", mute until response" if mute else ", no mute, unordered responses"),
                c.network_threads, f"{c.table.database}.records",
            )
            log.info("limits: memory pool %d bytes, buffer.memory %d bytes, max.connections %d "
                     "(%d per ip), idle %d ms", pool.capacity, c.buffer_memory, self.quotas.max_connections,
                     self.quotas.max_connections_per_ip, c.connections_max_idle_ms)
            task_status.started((host, port))

            await self._shutdown.wait()
            if self.leadership is not None:
                self.leadership.stop_taking_over()  # its stores close below: what moves to it waits for its lease's end
            log.info("shutting down: no new connections")
            acceptor_scope.cancel()
            for p in self.processors:
                p.stop_reading()
            for p in self.processors:
                for ch in list(p.channels):
                    await ch.wait_reading_done()
            log.info("shutting down: handling queued requests")
            request_channel.close()
            await handlers_done.wait()
            if self.transactions is not None:
                self.transactions.close()
            # Pending JoinGroup/SyncGroup answered NOT_COORDINATOR; queued offset commits written and answered.
            self.coordinator.close()
            await self.coordinator.wait_closed()
            self.logs.close()  # waiting fetches answer now with what they have
            log.info("shutting down: flushing %d buffered records", persister.buffered_records)
            persister.close()
            await persister.wait_closed()
            if self.leadership is not None:
                # After the flush: a new leader must not read the table's end before it holds ours.
                try:
                    await self.leadership.unregister()
                except Exception as exc:
                    log.warning("ending this broker's membership failed (its lease runs out): %s", exc)
            log.info("shutting down: writing last responses")
            with trio.move_on_after(30):
                await processors_done.wait()
            nursery.cancel_scope.cancel()
        trio.lowlevel.remove_instrument(self.io_wait)
        self.wal.close()
        log.info("stopped: %d flushes, %d records persisted", persister.stats.flushes, persister.stats.records)
