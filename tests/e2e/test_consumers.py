"""End to end: unmodified Kafka consumers read back what producers wrote, from the WAL and from the table.

Issue 10's read side against a real ``pipeline serve``: confluent-kafka
(librdkafka) and kafka-python consumers at their default settings (plus the
bootstrap address and, for a from-the-start read, ``auto.offset.reset``).

* Retention: with a tiny ``log.segment.bytes`` and ``log.retention.ms`` the
  write-ahead log's segments are deleted as soon as the table holds them
  (the server logs it); a consumer from offset 0 still reads every record,
  with its key, value, headers and timestamp, served from the Spark table,
  and then the recent ones from the WAL.

A group consumer resuming from its committed offsets after a ``kill -9`` of
the server is a step of tests/e2e/test_durability.py.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.slow

TS0 = 1_700_000_000_000


def produce(bootstrap: str, topic: str, start: int, count: int, partitions: int = 1) -> dict[int, tuple[int, int]]:
    """Send ``count`` records (i = start..) with librdkafka defaults; i -> (partition, offset) acked."""
    import confluent_kafka

    acked: dict[int, tuple[int, int]] = {}
    errors: list = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + count):
        producer.produce(topic, key=b"k%d" % i, value=b"value-%d-" % i + b"x" * (i % 40),
                         headers=[("seq", str(i).encode())], timestamp=TS0 + i, partition=i % partitions,
                         on_delivery=lambda err, msg, i=i: errors.append((i, err)) if err else
                         acked.__setitem__(i, (msg.partition(), msg.offset())))
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []
    return acked


def wait_for_log(server: ServerProcess, text: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in server.log_text():
            return
        time.sleep(0.5)
    raise AssertionError(f"{text!r} not in the server log:\n{server.log_text()[-3000:]}")


def consume_confluent(bootstrap: str, topic: str, partitions: int, want: int, timeout_s: float = 120.0) -> list:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-confluent",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]))
    finally:
        consumer.close()
    return out


def consume_kafka_python(bootstrap: str, topic: str, want: int, timeout_s: float = 120.0) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=15_000)
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            for _tp, messages in consumer.poll(timeout_ms=1000).items():
                out.extend((m.partition, m.offset, m.key, m.value, list(m.headers), m.timestamp) for m in messages)
    finally:
        consumer.close()
    return out


def check_complete(records: list, acked: dict[int, tuple[int, int]]) -> None:
    by_position = {(p, o): (k, v, h, ts) for p, o, k, v, h, ts in records}
    assert len(by_position) == len(records), "a record was delivered twice"
    assert len(records) == len(acked)
    for i, (partition, offset) in acked.items():
        key, value, headers, ts = by_position[(partition, offset)]
        assert key == b"k%d" % i and value == b"value-%d-" % i + b"x" * (i % 40)
        assert [(k, bytes(v)) for k, v in headers] == [("seq", str(i).encode())] and ts == TS0 + i
    per_partition = defaultdict(list)
    for p, o, *_ in records:
        per_partition[p].append(o)
    assert all(offsets == sorted(offsets) for offsets in per_partition.values()), "out of offset order"


def test_a_consumer_from_offset_0_reads_what_retention_removed_from_the_wal(tmp_path):
    # A server of its own: log.segment.bytes is a broker setting (the WAL's segments hold every
    # topic, a topic cannot have its own size), and retention deletes the WAL from its oldest
    # segment on, so on a shared server other tests' topics would hold the deletion back.
    server = ServerProcess(tmp_path / "data", "--log-segment-bytes", "2048", "--log-retention-ms", "0",
                           "--table-commit-interval-ms", "500", "--num-partitions", "2").start()
    try:
        acked: dict[int, tuple[int, int]] = {}
        for start in range(0, 600, 100):  # several WAL entries: segments roll (the active one always stays)
            acked.update(produce(server.bootstrap, "history", start, 100, partitions=2))
        wait_for_log(server, "log retention:")  # WAL segments deleted, their offsets only in the table
        acked.update(produce(server.bootstrap, "history", 600, 20, partitions=2))  # recent: in the WAL
        check_complete(consume_confluent(server.bootstrap, "history", 2, len(acked)), acked)
        check_complete(consume_kafka_python(server.bootstrap, "history", len(acked)), acked)
        assert "Traceback" not in server.log_text()
    finally:
        server.stop()

