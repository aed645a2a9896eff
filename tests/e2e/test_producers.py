"""End to end: unmodified Kafka producers -> pipeline serve -> Spark Parquet table.

confluent-kafka (librdkafka) and kafka-python producers, each with its
default configuration, send 10,000 records with keys, per-producer sequence
numbers, headers and explicit timestamps to two topics (3 partitions each),
concurrently, on the shared server of each request-path mode
(tests/e2e/conftest.py). Once the table holds everything the topics' logs
hold, the table is read with Spark (through the running server's Spark
Connect endpoint) and every record must be there exactly once, at the offset
its producer was told, with gapless per-partition offsets and per-partition
send order.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from tests.e2e.shared_server import create_topics, wait_caught_up
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

N = 10_000
TOPICS = ("orders", "payments")
PARTITIONS = 3
TS0 = 1_700_000_000_000


def topics(mode: str) -> tuple[str, str]:
    """This test's topic names on the shared server of ``mode``."""
    return tuple(f"producers-{mode}-{name}" for name in TOPICS)


def expected(producer: str, i: int, mode: str) -> dict:
    return {
        "topic": topics(mode)[i % 2],
        "key": f"{producer}-key-{i % 37}".encode(),
        "value": f"{producer}:{i}:".encode() + b"v" * (i % 50),
        "headers": [("producer", producer.encode()), ("seq", str(i).encode())],
        "timestamp_ms": TS0 + i,
    }


def run_confluent(bootstrap: str, mode: str, acked: dict, errors: list, n: int = N) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})

    def on_delivery(err, msg, i):
        if err is not None:
            errors.append(("confluent", i, str(err)))
        else:
            acked[("confluent", i)] = (msg.topic(), msg.partition(), msg.offset())

    for i in range(n):
        rec = expected("confluent", i, mode)
        while True:
            try:
                producer.produce(rec["topic"], key=rec["key"], value=rec["value"],
                                 headers=rec["headers"], timestamp=rec["timestamp_ms"],
                                 on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    if remaining:
        errors.append(("confluent", -1, f"{remaining} records not delivered after flush"))


def run_kafka_python(bootstrap: str, mode: str, acked: dict, errors: list, n: int = N) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    futures = []
    for i in range(n):
        rec = expected("kafka-python", i, mode)
        futures.append(producer.send(rec["topic"], key=rec["key"], value=rec["value"],
                                     headers=rec["headers"], timestamp_ms=rec["timestamp_ms"]))
    producer.flush(120)
    for i, fut in enumerate(futures):
        try:
            md = fut.get(timeout=60)
            acked[("kafka-python", i)] = (md.topic, md.partition, md.offset)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(("kafka-python", i, repr(exc)))
    producer.close(30)


@pytest.mark.parametrize("mode", ["multiqueue", "baseline"])
def test_real_producers_land_in_the_table_exactly_once_in_order(mode, request):
    produce_and_check(request.getfixturevalue(f"{mode}_server"), mode)


def produce_and_check(server, mode: str, read=read_table, n: int = N) -> None:
    """Both producers send ``n`` records each to this ``mode``'s topics on ``server``; then every
    record is in the table (read with ``read(data_dir, query)``) exactly once, at its
    acknowledged offset, gapless and in per-partition send order. ``mode`` names the topics
    (tests/e2e/test_spark_cluster.py runs this on servers of its own)."""
    create_topics(server, {topic: PARTITIONS for topic in topics(mode)})
    acked: dict = {}
    errors: list = []
    threads = [
        threading.Thread(target=run_confluent, args=(server.bootstrap, mode, acked, errors, n)),
        threading.Thread(target=run_kafka_python, args=(server.bootstrap, mode, acked, errors, n)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "producers did not finish"
    assert errors == [], errors[:5]
    assert len(acked) == 2 * n

    for topic in topics(mode):  # whatever the logs hold, acknowledged or not, is in the table
        wait_caught_up(server, topic, PARTITIONS)
    rows = read(server.data_dir, "SELECT topic, `partition`, `offset`, key, value, headers, "
                                       "unix_millis(`timestamp`) AS ts_ms, timestampType FROM records "
                                       "WHERE topic IN ('%s', '%s')" % topics(mode))
    assert len(rows) == 2 * n, server.log_text()

    seen: dict[tuple[str, int], tuple] = {}
    by_partition: dict[tuple[str, int], list] = defaultdict(list)
    for row in rows:
        producer, seq, _ = bytes(row["value"]).split(b":", 2)
        ident = (producer.decode(), int(seq))
        assert ident not in seen, f"duplicate record {ident}"
        seen[ident] = row
        by_partition[(row["topic"], row["partition"])].append((row["offset"], ident))

    for ident, row in seen.items():
        rec = expected(*ident, mode)
        assert row["topic"] == rec["topic"]
        assert bytes(row["key"]) == rec["key"]
        assert bytes(row["value"]) == rec["value"]
        assert [(h["key"], bytes(h["value"])) for h in row["headers"]] == rec["headers"]
        assert row["ts_ms"] == rec["timestamp_ms"]
        assert row["timestampType"] == 0
        # the offset the producer was acknowledged with is where the record is
        assert acked[ident] == (row["topic"], row["partition"], row["offset"])

    assert {t for t, _ in by_partition} == set(topics(mode))
    for (topic, partition), items in by_partition.items():
        items.sort()
        assert [o for o, _ in items] == list(range(len(items))), f"gap in {topic}-{partition}"
        for producer in ("confluent", "kafka-python"):
            seqs = [seq for _, (p, seq) in items if p == producer]
            assert seqs == sorted(seqs), f"{producer} out of order in {topic}-{partition}"
