"""A paced idempotent load and a reader taking snapshots of it through the live view, for the tests of
issue 33's first Must-show ("every snapshot the reader takes through the live view holds each
acknowledged record exactly once"): tests/e2e/test_live_view.py (``--brokers 3 --ack-on wal``) and
tests/e2e/test_cluster_metadata.py (``--brokers 3 --ack-on spark``, leadership through the database).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class PacedLoad:
    """Idempotent confluent-kafka producers, one thread each, writing ``per_producer`` records (value:
    the record's number as text, keyed over 50 keys) to ``topic`` at ``rate`` records/s each, then
    waiting up to ``flush_s`` for the last acknowledgements.

    ``acked``: record number -> (partition, offset) as acknowledged, the offset None for a record
    librdkafka acknowledged implicitly (a request of it timed out, ``request.timeout.ms``, and a later
    one of the same partition was acknowledged, ``rd_kafka_dr_implicit_ack``: confluent-kafka's
    ``Message.offset()`` is None then); ``errors``: delivery errors."""

    bootstrap: str
    topic: str
    producers: int = 2
    per_producer: int = 2_000
    rate: float = 300.0
    flush_s: float = 60.0
    acked: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> PacedLoad:
        self._threads = [threading.Thread(target=self._produce, args=(k * self.per_producer,), daemon=True)
                         for k in range(self.producers)]
        for t in self._threads:
            t.start()
        return self

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self) -> None:
        deadline = time.monotonic() + self.per_producer / self.rate + self.flush_s + 30.0
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not self.running(), "a producer did not finish"

    def acknowledged(self) -> tuple[set[tuple[int, int]], set[int]]:
        """The (partition, offset) of each record acknowledged with its offset, and the numbers of
        those acknowledged implicitly (no offset)."""
        acked = dict(self.acked)
        return ({po for po in acked.values() if po[1] is not None},
                {n for n, (_, o) in acked.items() if o is None})

    def _produce(self, first: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})

        def delivered(err, msg) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[int(msg.value())] = (msg.partition(), msg.offset())  # None: implicitly

        started = time.monotonic()
        for i in range(first, first + self.per_producer):
            producer.produce(self.topic, key=b"k%d" % (i % 50), value=str(i).encode(), on_delivery=delivered)
            producer.poll(0)
            delay = started + (i - first + 1) / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.flush(self.flush_s)


@dataclass(frozen=True)
class Snapshot:
    """One read of a topic through the live view: its rows, the distinct (partition, offset) and
    record numbers among them, the records acknowledged before the query that it lacks
    (``missing``: at the offset they were told, or anywhere for one acknowledged implicitly), the
    rows not yet acknowledged at the end of the query (``ahead``, (partition, offset) -> record
    number: a record is visible once committed, and its acknowledgement may still be on its way, as
    a Kafka consumer may read a record before its producer hears of it), and the rows the table
    alone held just before."""

    rows: int
    distinct: int
    records: int
    missing: int
    ahead: dict[tuple[int, int], int]
    in_table: int


def live_snapshots(session, database: str, load: PacedLoad, at_least: int = 3, every_s: float = 0.5,
                   timeout_s: float = 180.0, count_table: bool = True) -> list[Snapshot]:
    """Snapshots of ``load.topic`` through ``<database>.records_live`` (``session``: Spark Connect, by
    name) every ``every_s`` while the load runs, and at least ``at_least``; ``count_table``: also the
    table's rows just before each (else ``in_table`` is -1)."""
    out: list[Snapshot] = []
    deadline = time.monotonic() + timeout_s
    while (load.running() or len(out) < at_least) and time.monotonic() < deadline:
        in_table = session.sql(f"SELECT count(*) FROM {database}.records WHERE topic = '{load.topic}'").first()[0] \
            if count_table else -1
        told_before, implicit_before = load.acknowledged()
        collected = session.sql(f"SELECT `partition`, `offset`, CAST(value AS STRING) FROM {database}.records_live "
                                f"WHERE topic = '{load.topic}'").collect()
        got = {(r[0], r[1]): int(r[2]) for r in collected}
        told_after, implicit_after = load.acknowledged()
        numbers = set(got.values())
        missing = len(told_before - got.keys()) + len(implicit_before - numbers)
        ahead = {po: n for po, n in got.items() if po not in told_after and n not in implicit_after}
        out.append(Snapshot(len(collected), len(got), len(numbers), missing, ahead, in_table))
        time.sleep(every_s)
    return out


def assert_each_acknowledged_record_once(snapshots: list[Snapshot], load: PacedLoad, at_least: int = 3) -> None:
    """No snapshot holds a record twice, lacks one acknowledged before its query, or holds one never
    acknowledged (``load`` finished: a row ahead of its acknowledgement at the query must be
    acknowledged at that (partition, offset) in the end, or implicitly in that partition)."""
    assert not load.running(), "the load is still running: its acknowledgements are not final"
    assert len(snapshots) >= at_least, snapshots
    assert all(s.rows == s.distinct == s.records for s in snapshots), f"a record twice: {snapshots}"
    assert all(s.missing == 0 for s in snapshots), snapshots
    acked = dict(load.acked)
    never = [sorted(po for po, n in s.ahead.items() if acked.get(n, (po[0], -1)) not in (po, (po[0], None)))[:10]
             for s in snapshots]
    assert not any(never), f"rows never acknowledged there, per snapshot: {never}"
