"""The controller, partition leaders and idempotent producers' state in the metadata database (blocking calls).

Kafka's KRaft controller is elected by its quorum and writes partition
leadership (``PartitionRecord``/``PartitionChangeRecord``: leader, leader epoch)
to the metadata log. Here the shared database plays both parts, with no
home-made consensus (issue 24):

- **controller**: one row holds the controller's node id, its broker epoch
  (``pipeline.metadata.brokers``), a **controller epoch** and a lease on the
  database's clock. ``claim_controller`` takes it when it is free, its lease ran
  out or its holder is no longer a live member, and renews it for its holder;
  every write a controller makes checks, in the same transaction, that it still
  holds the row at its controller epoch and is still a live member
  (``NotControllerError``, ``FencedBrokerError``), so a deposed controller's
  late write never lands.
- **partition leaders**: one row per partition (``__consumer_offsets``'s
  partitions say who coordinates which groups, as in Kafka): the leader, its
  **leader epoch** (+1 per move), the previous leader (``prior_id``) and whether
  that one has **handed off** (everything it accepted is in the table). A new
  leader serves once the prior leader handed off or is not a live member any
  more (pipeline.cluster.service), and marks the row **serving** (``serve``) as it
  starts (``Leadership.serving``; recorded, not used by Metadata: see
  ``pipeline.cluster.membership.DynamicCluster.leader``).
- **producer states**: each idempotent producer batch a leader commits to the
  table is written here first (``record_producers``), with its base offset. A
  new leader takes the rows below the table's end offset (what the table holds)
  and drops the others (a commit that never happened), so a producer's retry of
  a batch the table already holds is answered as a duplicate after a move
  (exactly once across the move, KIP-98's sequence rules).
- **table end offsets**: each partition's end offset in the table as its
  commits record it (``record_producers`` writes the commit's end as *pending*, in
  the transaction that writes its producer batches, fenced by the writer's
  membership; ``commit_done`` makes it the end once the commit is in the table).
  A new leader takes a partition's end from here (``table_ends``) and reads the
  table only for a partition whose last commit is still pending (its writer
  died within it) or that has no row yet; retention dropping a partition's rows
  leaves its end as it was, as Kafka's log end offset.
- **broker WALs** (``--ack-on wal``): each broker incarnation registers the
  directory of its write-ahead log (on the shared volume) once it is a member.
  The WAL of an incarnation that is no longer a live member may hold acknowledged
  records the table lacks; one live broker claims it (``claim_wal``: one claimant
  at a time, a dead claimant's claim is taken over), writes what the table
  lacks, and marks it drained together with the producer batches it wrote
  (``wal_drained``), as AutoMQ re-attaches a dead node's WAL volume elsewhere.
  Until no dead WAL is left undrained, no partition is taken over from the
  table (pipeline.cluster.service). The node's next incarnation deletes its drained
  directories.

Every write bumps this store's change version (``Database.record_change``) only
when leadership changed, which brokers poll (pipeline.cluster.service).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.metadata.brokers import BrokerRegistry
from pipeline.metadata.database import Migration, Target

__all__ = ("COMPONENT", "BrokerWal", "Leadership", "LeadershipStore", "NotControllerError", "ProducerBatch")

COMPONENT = "leadership"
"""The store's name in ``schema_version`` and ``metadata_changes``."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS controller (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    node_id INTEGER NOT NULL,
    broker_epoch BIGINT NOT NULL,
    controller_epoch BIGINT NOT NULL,
    lease_expiry_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS partition_leaders (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    leader_id INTEGER NOT NULL,
    leader_epoch BIGINT NOT NULL,
    prior_id INTEGER NOT NULL,
    handed_off INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS producer_states (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    base_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, partition, producer_id, base_offset)
)"""

_WALS = """
CREATE TABLE IF NOT EXISTS broker_wals (
    incarnation_id TEXT PRIMARY KEY,
    node_id INTEGER NOT NULL,
    broker_epoch BIGINT NOT NULL,
    path TEXT NOT NULL,
    drained INTEGER NOT NULL,
    claimant_id INTEGER NOT NULL,
    claimant_epoch BIGINT NOT NULL
)"""

_RETIRED = """
CREATE TABLE IF NOT EXISTS retired_epochs (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    leader_epoch BIGINT NOT NULL,
    PRIMARY KEY (topic, partition)
)"""

_SERVING = "ALTER TABLE partition_leaders ADD COLUMN serving INTEGER NOT NULL DEFAULT 1"

_TABLE_ENDS = """
CREATE TABLE IF NOT EXISTS table_ends (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    end_offset BIGINT NOT NULL,
    pending_end BIGINT,
    pending_writer INTEGER,
    pending_epoch BIGINT,
    pending_staging TEXT,
    PRIMARY KEY (topic, partition)
)"""

_OPEN_TRANSACTIONS = """
CREATE TABLE IF NOT EXISTS open_txn_appends (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    base_offset BIGINT NOT NULL,
    record_count INTEGER NOT NULL,
    log_append_time_ms BIGINT NOT NULL,
    producer_id BIGINT NOT NULL,
    producer_epoch INTEGER NOT NULL,
    base_sequence INTEGER NOT NULL,
    uncompressed_bytes BIGINT NOT NULL,
    records {blob} NOT NULL,
    PRIMARY KEY (topic, partition, base_offset)
)"""

MIGRATIONS = (Migration(1, sqlite=_SCHEMA, postgresql=_SCHEMA), Migration(2, sqlite=_WALS, postgresql=_WALS),
              Migration(3, sqlite=_RETIRED, postgresql=_RETIRED), Migration(4, sqlite=_SERVING, postgresql=_SERVING),
              Migration(5, sqlite=_TABLE_ENDS, postgresql=_TABLE_ENDS),
              Migration(6, sqlite=_OPEN_TRANSACTIONS.format(blob="BLOB"),
                        postgresql=_OPEN_TRANSACTIONS.format(blob="BYTEA")))

BATCHES_KEPT = 5
"""Producer batches kept per (partition, producer) (Kafka ProducerStateEntry.NumBatchesToRetain)."""


class NotControllerError(RuntimeError):
    """The writer does not hold the controller row at the controller epoch it claims (a newer controller
    took over; Kafka's NOT_CONTROLLER)."""


@dataclass(frozen=True, slots=True)
class Leadership:
    """One partition's row: its leader, leader epoch (1 the first time), the leader before (-1: none),
    whether that one handed off (everything it accepted for the partition is in the table) and whether
    the leader serves the partition yet (``serving``: False from a move until the new leader has taken
    it over, ``LeadershipStore.serve``)."""

    leader_id: int
    leader_epoch: int
    prior_id: int = -1
    handed_off: bool = True
    serving: bool = True


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """An idempotent producer's batch on a partition (``pipeline.log.producer_state.BatchMetadata``'s fields)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    first_seq: int
    last_seq: int
    base_offset: int


@dataclass(frozen=True, slots=True)
class BrokerWal:
    """A broker incarnation's write-ahead log: its directory (``path``, relative to the shared data
    directory), the registration that wrote it, and whether its acknowledged records are all in the table."""

    incarnation_id: str
    node_id: int
    broker_epoch: int
    path: str
    drained: bool = False


OpenAppend = tuple[str, int, int, bytes, int, int, int, int, int, int]
"""An open transaction's append kept for a partition's next leader: ``PartitionAppend``'s fields in
its order (topic, partition, base offset, records, record count, log append time ms, producer id,
producer epoch, base sequence, uncompressed bytes)."""


class LeadershipStore:
    """The controller row, partition leaders and producer states of ``target`` (a SQLite file or a
    PostgreSQL URL), with the broker registry of the same database. See the module docstring.

    Raises (any method): sqlite3.Error, psycopg.Error when the database cannot be reached.
    """

    def __init__(self, target: Target) -> None:
        self.registry = BrokerRegistry(target)
        self._db = self.registry.db
        self._db.migrate(COMPONENT, MIGRATIONS)
        self._for_update = " FOR UPDATE" if self._db.dialect == "postgresql" else ""

    def close(self) -> None:
        self.registry.close()

    def change_version(self) -> int:
        """Moves whenever a leadership change commits (``Database.change_version``)."""
        return self._db.change_version(COMPONENT)

    # -- the controller ------------------------------------------------------

    def claim_controller(self, node_id: int, broker_epoch: int, lease_ms: int) -> int | None:
        """Become or stay the controller for ``lease_ms`` ms: the controller epoch held, or None when another
        live member holds it.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member.
        """
        now = self._db.now_ms
        with self.registry.fenced(node_id, broker_epoch) as cur:
            mine = "controller.node_id = excluded.node_id AND controller.broker_epoch = excluded.broker_epoch"
            row = cur.execute(
                f"INSERT INTO controller VALUES (1, ?, ?, 1, {now} + ?) ON CONFLICT (singleton) DO UPDATE SET "
                "node_id = excluded.node_id, broker_epoch = excluded.broker_epoch, "
                f"controller_epoch = CASE WHEN {mine} THEN controller.controller_epoch "
                "ELSE controller.controller_epoch + 1 END, lease_expiry_ms = excluded.lease_expiry_ms "
                f"WHERE ({mine}) OR controller.lease_expiry_ms <= {now} OR NOT EXISTS (SELECT 1 FROM brokers b "
                "WHERE b.node_id = controller.node_id AND b.epoch = controller.broker_epoch "
                f"AND b.lease_expiry_ms > {now}) RETURNING controller_epoch",
                (node_id, broker_epoch, lease_ms)).fetchone()
        return None if row is None else int(row[0])

    def controller(self) -> tuple[int, int] | None:
        """(node id, controller epoch) of the live controller, or None."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute(f"SELECT node_id, controller_epoch FROM controller WHERE lease_expiry_ms > "
                              f"{self._db.now_ms}").fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    # -- partition leaders ---------------------------------------------------

    def members(self) -> tuple[int, ...]:
        """Every broker ever registered (live or not), by node id: where partitions prefer to be led."""
        with self._db.transaction(write=False) as cur:
            return tuple(int(r[0]) for r in cur.execute("SELECT node_id FROM brokers ORDER BY node_id").fetchall())

    def assignment(self) -> dict[tuple[str, int], Leadership]:
        """Every partition's row: (topic, partition) -> Leadership."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute("SELECT topic, partition, leader_id, leader_epoch, prior_id, handed_off, serving "
                               "FROM partition_leaders").fetchall()
        return {(t, int(p)): Leadership(int(leader), int(epoch), int(prior), bool(done), bool(serving))
                for t, p, leader, epoch, prior, done, serving in rows}

    def write_assignment(self, node_id: int, broker_epoch: int, controller_epoch: int,
                         moves: Mapping[tuple[str, int], tuple[int, bool]],
                         deleted: Iterable[tuple[str, int]] = ()) -> None:
        """As the controller at ``controller_epoch``: give each partition of ``moves`` its new leader
        (leader epoch + 1, a new row 1 above a deleted partition's last; ``handed_off`` False: the leader
        before must hand off first; ``serving`` False until the new leader has taken it over) and remove the rows of ``deleted`` partitions (their topic is gone).
        One transaction.

        A partition whose previous move is not handed off yet keeps that move's prior leader (it still
        has to hand off), whoever leads it now.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member.
            NotControllerError: it does not hold the controller row at ``controller_epoch``.
        """
        with self.registry.fenced(node_id, broker_epoch) as cur:
            row = cur.execute(f"SELECT 1 FROM controller WHERE singleton = 1 AND node_id = ? AND broker_epoch = ? "
                              f"AND controller_epoch = ?{self._for_update}",
                              (node_id, broker_epoch, controller_epoch)).fetchone()
            if row is None:
                raise NotControllerError(f"broker {node_id} is not the controller at epoch {controller_epoch}")
            cur.executemany(
                "INSERT INTO partition_leaders VALUES (?, ?, ?, COALESCE((SELECT r.leader_epoch FROM retired_epochs r "
                "WHERE r.topic = ? AND r.partition = ?), 0) + 1, -1, 1, 0) ON CONFLICT (topic, partition) DO UPDATE "
                "SET leader_epoch = partition_leaders.leader_epoch + 1, serving = 0, "
                "prior_id = CASE WHEN partition_leaders.handed_off = 1 THEN partition_leaders.leader_id "
                "ELSE partition_leaders.prior_id END, "
                "handed_off = CASE WHEN partition_leaders.handed_off = 1 THEN ? ELSE 0 END, "
                "leader_id = excluded.leader_id",
                [(t, p, leader, t, p, 1 if done else 0) for (t, p), (leader, done) in sorted(moves.items())])
            # A deleted partition's last leader epoch is kept: a re-created one continues above it, so a
            # client that cached the old epoch (the topic id is the name's) does not take its metadata
            # for stale (KIP-320).
            for t, p in sorted(deleted):
                row = cur.execute("SELECT leader_epoch FROM partition_leaders WHERE topic = ? AND partition = ?",
                                  (t, p)).fetchone()
                if row is not None:
                    cur.execute("INSERT INTO retired_epochs VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                                "DO UPDATE SET leader_epoch = excluded.leader_epoch", (t, p, int(row[0])))
            cur.executemany("DELETE FROM partition_leaders WHERE topic = ? AND partition = ?", sorted(deleted))
            self._db.record_change(cur, COMPONENT)

    def hand_off(self, topic: str, partition: int, prior_id: int, leader_epoch: int,
                 open_appends: Sequence[OpenAppend] = (), batches: Sequence[ProducerBatch] = (),
                 end_offset: int | None = None) -> bool:
        """``prior_id`` has everything it accepted for ``topic``-``partition`` in the table but
        ``open_appends`` (open transactions' records, kept here for the new leader as ``wal_drained``
        keeps a dead broker's, with their idempotent ``batches``): the leader at ``leader_epoch`` may
        serve it, from ``end_offset`` on at least (the prior leader's log end: its last offsets may be
        markers, never rows, or those open records). One transaction. False: the row moved on
        meanwhile (nothing written)."""
        with self._db.transaction() as cur:
            done = cur.execute("UPDATE partition_leaders SET handed_off = 1 WHERE topic = ? AND partition = ? "
                               "AND prior_id = ? AND leader_epoch = ? AND handed_off = 0",
                               (topic, partition, prior_id, leader_epoch)).rowcount > 0
            if done:
                self._keep_open(cur, open_appends, batches)
                if end_offset is not None:
                    cur.execute("INSERT INTO table_ends (topic, partition, end_offset) VALUES (?, ?, ?) ON CONFLICT "
                                "(topic, partition) DO UPDATE SET end_offset = CASE WHEN excluded.end_offset > "
                                "table_ends.end_offset THEN excluded.end_offset ELSE table_ends.end_offset END",
                                (topic, partition, end_offset))
                self._db.record_change(cur, COMPONENT)
        return done

    def serve(self, leader_id: int, partitions: Mapping[tuple[str, int], int]) -> int:
        """``leader_id`` has taken over ``partitions`` ((topic, partition) -> the leader epoch it took
        over at) and serves them: every broker's Metadata names it their leader from now on. A row that
        moved on meanwhile is left alone. One transaction; the rows marked.

        Kafka names a partition's new leader in the metadata it serves to clients only once that
        leader leads it (the controller's LeaderAndIsr before its UpdateMetadata,
        ``ControllerBrokerRequestBatch.sendRequestsToBrokers``); a partition without a serving leader
        is LEADER_NOT_AVAILABLE with leader -1 (``KRaftMetadataCache.getPartitionMetadata``)."""
        with self._db.transaction() as cur:
            marked = 0
            for (topic, partition), epoch in sorted(partitions.items()):
                marked += cur.execute("UPDATE partition_leaders SET serving = 1 WHERE topic = ? AND partition = ? "
                                      "AND leader_id = ? AND leader_epoch = ? AND serving = 0",
                                      (topic, partition, leader_id, epoch)).rowcount
            if marked:
                self._db.record_change(cur, COMPONENT)
        return marked

    # -- idempotent producers --------------------------------------------------

    def record_producers(self, node_id: int, broker_epoch: int, batches: Sequence[ProducerBatch],
                         ends: Mapping[tuple[str, int], int] | None = None, staging: str | None = None) -> None:
        """Before a table commit: the commit's idempotent batches and, with ``ends`` ((topic, partition)
        -> the offset after the commit's last record of it), each partition's end once the commit is in
        (pending until ``commit_done``), written by ``node_id`` at ``broker_epoch`` in one transaction;
        ``staging``: where the writer stages the commit's files (``pending_writers``).

        Raises:
            FencedBrokerError: ``node_id`` is not a live member at ``broker_epoch`` (nothing written: the
                caller must not commit).
        """
        with self.registry.fenced(node_id, broker_epoch) as cur:
            cur.executemany("INSERT INTO producer_states VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                            "(topic, partition, producer_id, base_offset) DO NOTHING",
                            [(b.topic, b.partition, b.producer_id, b.producer_epoch, b.first_seq, b.last_seq,
                              b.base_offset) for b in batches])
            if ends:
                # A pending end only grows: a retry of a commit, or the next one after a pending that never
                # became the end (its writer died: whoever takes the partition over reads the table).
                cur.executemany("INSERT INTO table_ends VALUES (?, ?, 0, ?, ?, ?, ?) ON CONFLICT (topic, partition) "
                                "DO UPDATE SET pending_end = CASE WHEN table_ends.pending_end IS NULL OR "
                                "table_ends.pending_end < excluded.pending_end THEN excluded.pending_end "
                                "ELSE table_ends.pending_end END, pending_writer = excluded.pending_writer, "
                                "pending_epoch = excluded.pending_epoch, pending_staging = excluded.pending_staging",
                                [(t, p, end, node_id, broker_epoch, staging) for (t, p), end in sorted(ends.items())])

    # -- table end offsets -------------------------------------------------------

    def commit_done(self, ends: Mapping[tuple[str, int], int]) -> None:
        """After a table commit of ``ends`` (as given to ``record_producers``): each partition's records
        below its end are in the table. A pending end at or below it is cleared (one above it: a later
        commit's, still pending). Not fenced: what it records is true whoever wrote the commit."""
        with self._db.transaction() as cur:
            # pending_end last: the other pending columns compare it before it is cleared (SQL evaluates
            # every SET expression against the row as it was).
            cur.executemany("INSERT INTO table_ends VALUES (?, ?, ?, NULL, NULL, NULL, NULL) ON CONFLICT "
                            "(topic, partition) DO UPDATE SET end_offset = CASE WHEN table_ends.end_offset < "
                            "excluded.end_offset THEN excluded.end_offset ELSE table_ends.end_offset END, "
                            + ", ".join(f"{c} = CASE WHEN table_ends.pending_end <= excluded.end_offset THEN NULL "
                                        f"ELSE table_ends.{c} END" for c in ("pending_writer", "pending_epoch",
                                                                            "pending_staging", "pending_end")),
                            [(t, p, end) for (t, p), end in sorted(ends.items())])

    def record_new_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        """Partitions that did not exist before (a topic just created in the topic store, or partitions just
        added to one): the table holds none of their rows, since a topic's rows are dropped before its
        deletion leaves the store (``TopicCatalog.delete``). Their end is recorded as 0 unless a row exists
        already (a leader that read the table, or committed, first), so their first leader reads nothing
        from the table. A topic that came from elsewhere (a data directory's single-broker run) gets no
        row here and is read from the table, as before."""
        with self._db.transaction() as cur:
            cur.executemany("INSERT INTO table_ends VALUES (?, ?, 0, NULL, NULL, NULL, NULL) ON CONFLICT "
                            "(topic, partition) DO NOTHING", [(topic, p) for p in sorted(partitions)])

    def settle_table_ends(self, ends: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """A new leader read ``ends`` from the table (under the tables' lock, its prior leader gone): each
        partition's end is the larger of that and its recorded one (retention may have dropped the rows
        below it), and a pending commit is cleared (it landed, as far as the read found it, or never
        will). Returns the ends now recorded."""
        out: dict[tuple[str, int], int] = {}
        with self._db.transaction() as cur:
            for (topic, partition), end in sorted(ends.items()):
                row = cur.execute("SELECT end_offset FROM table_ends WHERE topic = ? AND partition = ?"
                                  f"{self._for_update}", (topic, partition)).fetchone()
                out[(topic, partition)] = max(end, int(row[0])) if row is not None else end
                cur.execute("INSERT INTO table_ends VALUES (?, ?, ?, NULL, NULL, NULL, NULL) ON CONFLICT "
                            "(topic, partition) DO UPDATE SET end_offset = excluded.end_offset, pending_end = NULL, "
                            "pending_writer = NULL, pending_epoch = NULL, pending_staging = NULL",
                            (topic, partition, out[(topic, partition)]))
        return out

    def pending_writers(self, keys: Collection[tuple[str, int]]) -> set[tuple[int, int, str | None]]:
        """The writers whose commit of one of ``keys`` is pending (begun, not known done): (node id,
        broker epoch, their staging as ``record_producers`` was told it)."""
        wanted = set(keys)
        out: set[tuple[int, int, str | None]] = set()
        with self._db.transaction(write=False) as cur:
            for topic in sorted({t for t, _ in wanted}):
                for partition, writer, epoch, staging in cur.execute(
                        "SELECT partition, pending_writer, pending_epoch, pending_staging FROM table_ends "
                        "WHERE topic = ? AND pending_end IS NOT NULL", (topic,)):
                    if (topic, int(partition)) in wanted and writer is not None:
                        out.add((int(writer), int(epoch), None if staging is None else str(staging)))
        return out

    def table_ends(self, keys: Collection[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The recorded table end offset of each of ``keys`` whose commits are all done; a partition
        with no row, or whose last commit is pending (its writer may have died within it), is missing:
        read its end from the table, then ``commit_done`` it."""
        wanted = set(keys)
        out: dict[tuple[str, int], int] = {}
        with self._db.transaction(write=False) as cur:
            for topic in sorted({t for t, _ in wanted}):
                for partition, end, pending in cur.execute(
                        "SELECT partition, end_offset, pending_end FROM table_ends WHERE topic = ?", (topic,)):
                    if (topic, int(partition)) in wanted and pending is None:
                        out[(topic, int(partition))] = int(end)
        return out

    def producers(self, ends: Mapping[tuple[str, int], int]) -> list[ProducerBatch]:
        """For a new leader of each partition of ``ends`` ((topic, partition) -> the table's end offset):
        the batches below the end, oldest first, the last ``BATCHES_KEPT`` per producer. Rows at or above
        the end (a commit that never happened) and older ones are deleted."""
        out: list[ProducerBatch] = []
        with self._db.transaction() as cur:
            for (topic, partition), end in sorted(ends.items()):
                cur.execute("DELETE FROM producer_states WHERE topic = ? AND partition = ? AND base_offset >= ?",
                            (topic, partition, end))
                rows = cur.execute("SELECT producer_id, producer_epoch, first_seq, last_seq, base_offset FROM "
                                   "producer_states WHERE topic = ? AND partition = ? ORDER BY base_offset",
                                   (topic, partition)).fetchall()
                kept: dict[int, list[ProducerBatch]] = {}
                for pid, epoch, first, last, base in rows:
                    kept.setdefault(int(pid), []).append(ProducerBatch(topic, partition, int(pid), int(epoch),
                                                                       int(first), int(last), int(base)))
                for pid, batches in kept.items():
                    for old in batches[:-BATCHES_KEPT]:
                        cur.execute("DELETE FROM producer_states WHERE topic = ? AND partition = ? AND "
                                    "producer_id = ? AND base_offset = ?", (topic, partition, pid, old.base_offset))
                    out += batches[-BATCHES_KEPT:]
        return sorted(out, key=lambda b: (b.topic, b.partition, b.base_offset))

    def trim_producers(self) -> int:
        """Delete every batch older than its producer's last ``BATCHES_KEPT`` on its partition; the rows deleted."""
        with self._db.transaction() as cur:
            return cur.execute(
                "DELETE FROM producer_states WHERE (SELECT COUNT(*) FROM producer_states n WHERE "
                "n.topic = producer_states.topic AND n.partition = producer_states.partition AND "
                "n.producer_id = producer_states.producer_id AND n.base_offset > producer_states.base_offset) "
                f">= {BATCHES_KEPT}").rowcount

    def forget_topic(self, topic: str) -> None:
        """A deleted topic's producer states and table end offsets (its re-created partitions start from
        offset 0)."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM producer_states WHERE topic = ?", (topic,))
            cur.execute("DELETE FROM table_ends WHERE topic = ?", (topic,))
            cur.execute("DELETE FROM open_txn_appends WHERE topic = ?", (topic,))

    # -- broker WALs (--ack-on wal) ------------------------------------------------

    def register_wal(self, node_id: int, broker_epoch: int, incarnation_id: str, path: str) -> None:
        """The WAL directory ``path`` (relative to the data directory) of ``node_id``'s incarnation at
        ``broker_epoch``, before it accepts anything.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member.
        """
        with self.registry.fenced(node_id, broker_epoch) as cur:
            cur.execute("INSERT INTO broker_wals VALUES (?, ?, ?, ?, 0, -1, -1) ON CONFLICT (incarnation_id) "
                        "DO NOTHING", (incarnation_id, node_id, broker_epoch, path))

    def dead_wals(self) -> list[BrokerWal]:
        """The WALs not drained yet whose writer is not a live member (oldest registration first)."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute(
                "SELECT incarnation_id, node_id, broker_epoch, path FROM broker_wals w WHERE drained = 0 AND "
                "NOT EXISTS (SELECT 1 FROM brokers b WHERE b.node_id = w.node_id AND b.epoch = w.broker_epoch "
                f"AND b.lease_expiry_ms > {self._db.now_ms}) ORDER BY node_id, broker_epoch").fetchall()
        return [BrokerWal(str(i), int(n), int(e), str(p)) for i, n, e, p in rows]

    def claim_wal(self, incarnation_id: str, node_id: int, broker_epoch: int) -> bool:
        """Claim a dead WAL for draining by ``node_id`` at ``broker_epoch``: True when it now holds the
        claim (it did already, or the WAL had none, or its claimant is no longer a live member); False
        when it is drained, its writer is live, or another live member holds the claim.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member.
        """
        now = self._db.now_ms
        with self.registry.fenced(node_id, broker_epoch) as cur:
            return cur.execute(
                "UPDATE broker_wals SET claimant_id = ?, claimant_epoch = ? WHERE incarnation_id = ? "
                "AND drained = 0 AND NOT EXISTS (SELECT 1 FROM brokers b WHERE b.node_id = broker_wals.node_id "
                f"AND b.epoch = broker_wals.broker_epoch AND b.lease_expiry_ms > {now}) "
                "AND ((claimant_id = ? AND claimant_epoch = ?) OR NOT EXISTS (SELECT 1 FROM brokers c WHERE "
                f"c.node_id = broker_wals.claimant_id AND c.epoch = broker_wals.claimant_epoch "
                f"AND c.lease_expiry_ms > {now}))",
                (node_id, broker_epoch, incarnation_id, node_id, broker_epoch)).rowcount > 0

    def wal_drained(self, incarnation_id: str, node_id: int, broker_epoch: int,
                    batches: Sequence[ProducerBatch], open_appends: Sequence[OpenAppend] = ()) -> bool:
        """As the WAL's claimant: everything it held is in the table but ``open_appends`` (records of
        transactions whose marker it does not hold, ``pipeline.persist.recovery.settle_transactions``),
        which are kept here for their partitions' next leaders (``open_transactions``); ``batches``
        (the idempotent batches written or kept from it) join the producer states. One transaction;
        False (nothing written) when ``node_id`` at ``broker_epoch`` does not hold the claim any more.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member.
        """
        with self.registry.fenced(node_id, broker_epoch) as cur:
            if cur.execute("UPDATE broker_wals SET drained = 1 WHERE incarnation_id = ? AND drained = 0 AND "
                           "claimant_id = ? AND claimant_epoch = ?",
                           (incarnation_id, node_id, broker_epoch)).rowcount == 0:
                return False
            self._keep_open(cur, open_appends, batches)
            self._db.record_change(cur, COMPONENT)
        return True

    @staticmethod
    def _keep_open(cur: Any, open_appends: Sequence[OpenAppend], batches: Sequence[ProducerBatch]) -> None:
        cur.executemany("INSERT INTO producer_states VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                        "(topic, partition, producer_id, base_offset) DO NOTHING",
                        [(b.topic, b.partition, b.producer_id, b.producer_epoch, b.first_seq, b.last_seq,
                          b.base_offset) for b in batches])
        cur.executemany("INSERT INTO open_txn_appends VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
                        "(topic, partition, base_offset) DO NOTHING",
                        [(topic, partition, base, count, append_ms, pid, epoch, seq, size, bytes(records))
                         for topic, partition, base, records, count, append_ms, pid, epoch, seq, size in open_appends])

    # -- open transactions of dead brokers' WALs ------------------------------------

    def open_transactions(self, keys: Collection[tuple[str, int]]) -> list[OpenAppend]:
        """The appends of open transactions drained from dead brokers' WALs (``wal_drained``) on the
        partitions ``keys``, by partition and offset: the records a new leader adopts (writes to its
        own WAL, held out of the table until their marker) before it serves the partition."""
        wanted = set(keys)
        out: list[OpenAppend] = []
        with self._db.transaction(write=False) as cur:
            for topic in sorted({t for t, _ in wanted}):
                for row in cur.execute(
                        "SELECT partition, base_offset, records, record_count, log_append_time_ms, producer_id, "
                        "producer_epoch, base_sequence, uncompressed_bytes FROM open_txn_appends WHERE topic = ? "
                        "ORDER BY partition, base_offset", (topic,)).fetchall():
                    partition, base, records, count, append_ms, pid, epoch, seq, size = row
                    if (topic, int(partition)) in wanted:
                        out.append((topic, int(partition), int(base), bytes(records), int(count), int(append_ms),
                                    int(pid), int(epoch), int(seq), int(size)))
        return out

    def adopted(self, node_id: int, broker_epoch: int, appends: Sequence[OpenAppend]) -> None:
        """``appends`` (from ``open_transactions``) are in ``node_id``'s own WAL now: their rows go.

        Raises:
            FencedBrokerError: ``node_id`` at ``broker_epoch`` is not a live member (nothing deleted).
        """
        with self.registry.fenced(node_id, broker_epoch) as cur:
            cur.executemany("DELETE FROM open_txn_appends WHERE topic = ? AND partition = ? AND base_offset = ?",
                            [(a[0], a[1], a[2]) for a in appends])

    def drained_wals(self, node_id: int) -> list[BrokerWal]:
        """``node_id``'s drained WALs: directories its next incarnation may delete (then ``forget_wal``)."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute("SELECT incarnation_id, node_id, broker_epoch, path FROM broker_wals "
                               "WHERE node_id = ? AND drained = 1", (node_id,)).fetchall()
        return [BrokerWal(str(i), int(n), int(e), str(p), True) for i, n, e, p in rows]

    def forget_wal(self, incarnation_id: str) -> None:
        """A drained WAL's row, once its directory is deleted."""
        with self._db.transaction() as cur:
            cur.execute("DELETE FROM broker_wals WHERE incarnation_id = ? AND drained = 1", (incarnation_id,))
