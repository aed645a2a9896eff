"""A typed topic's live view (issue 33: "a live view of every table"), on the shared multiqueue server
(commits every second, ``--ack-on wal``): ``pipeline.<table>_live`` is the typed table plus the
acknowledged records not committed yet, decoded as the table side decodes them.

A ``value.format=json`` topic (its Spark DDL in ``value.schema``, no registry) created through
CreateTopics: once its first commit made its table, each record produced next is returned by the
first query of the view after its acknowledgement, by name through Spark Connect; a value that does
not parse is acknowledged and is in no typed table, the view included; while a producer goes on,
every snapshot holds each acknowledged good record once; ``pipeline sql``'s query names the view
by the table's name. (The records table's view: tests/e2e/test_live_view.py and others; the typed rows
themselves: tests/table/test_live.py.)
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.shared_server import create_topics
from tests.e2e.table_reader import wait_for_live_view

pytestmark = pytest.mark.slow

TOPIC = "live_typed_json"
VIEW = f"pipeline.{TOPIC}_live"


def test_a_typed_topics_live_view_shows_each_good_record_at_once_and_once(multiqueue_server, tmp_path):
    from confluent_kafka import Producer

    from pipeline.persist.spark_sink import build_spark_session, run_sql

    server = multiqueue_server
    create_topics(server, {TOPIC: 2}, {TOPIC: {"value.format": "json", "value.schema": "n BIGINT, memo STRING"}})
    producer = Producer({"bootstrap.servers": server.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    acked: dict[int, tuple[int, int]] = {}

    def produce(n: int, value: bytes | None = None) -> tuple[int, int]:
        def delivered(err, msg) -> None:
            assert err is None, err
            acked[n] = (msg.partition(), msg.offset())

        producer.produce(TOPIC, key=b"k%d" % n, partition=n % 2, on_delivery=delivered,
                         value=json.dumps({"n": n, "memo": f"m{n}"}).encode() if value is None else value)
        assert producer.flush(30) == 0
        return acked[n]

    session = build_spark_session(remote=f"sc://127.0.0.1:{server.connect_port}")
    try:
        produce(0)  # its commit makes the table, and the view follows
        deadline = time.monotonic() + 60
        while not session.catalog.tableExists(VIEW):
            assert time.monotonic() < deadline, f"{VIEW} not published"
            time.sleep(0.2)
        wait_for_live_view(session)

        # Each record, by the first query after its acknowledgement.
        for n in range(1, 4):
            produce(n)
            rows = session.sql(f"SELECT n, memo, `partition`, `offset` FROM {VIEW} WHERE n = {n}").collect()
            assert [tuple(r) for r in rows] == [(n, f"m{n}", *acked[n])], (n, rows)

        # A dead letter is acknowledged and in no typed table; it is in dead_letters' own live view,
        # which appears with that table (its first dead letter's commit), at once.
        bad_partition, bad_offset = produce(1000, b"not json")
        assert session.sql(f"SELECT count(*) FROM {VIEW} WHERE `partition` = {bad_partition} "
                           f"AND `offset` = {bad_offset}").first()[0] == 0
        deadline = time.monotonic() + 60
        while not session.catalog.tableExists("pipeline.dead_letters_live"):
            assert time.monotonic() < deadline, "pipeline.dead_letters_live not published"
            time.sleep(0.2)
        bad_partition, bad_offset = produce(1001, b"{not json either")
        rows = session.sql(f"SELECT error FROM pipeline.dead_letters_live WHERE topic = '{TOPIC}' "
                           f"AND `partition` = {bad_partition} AND `offset` = {bad_offset}").collect()
        assert len(rows) == 1 and rows[0][0], rows

        # Snapshots while a producer goes on: each acknowledged good record once.
        snapshots = []
        for n in range(100, 300):
            producer.produce(TOPIC, key=b"k", value=json.dumps({"n": n}).encode(), partition=n % 2,
                             on_delivery=lambda err, msg, n=n: acked.__setitem__(n, (msg.partition(), msg.offset())))
            producer.poll(0)
            if n % 100 == 0:
                producer.flush(30)
                before = {n for n in acked if n < 1000}
                got = [r[0] for r in session.sql(f"SELECT n FROM {VIEW}").collect()]
                snapshots.append((len(got), len(set(got)), len(before - set(got))))
        assert producer.flush(30) == 0
        got = [r[0] for r in session.sql(f"SELECT n FROM {VIEW}").collect()]
        snapshots.append((len(got), len(set(got)), 0))
        assert sorted(got) == sorted(n for n in acked if n < 1000), snapshots
        assert all(rows == distinct and missing == 0 for rows, distinct, missing in snapshots), snapshots

        # pipeline sql's query (run_sql, live): the table's name is its live view's, at once.
        produce(5000)
        _, rows = run_sql(session, f"SELECT n FROM {TOPIC} WHERE n = 5000", live=True)
        assert rows == [(5000,)], rows
    finally:
        session.stop()
