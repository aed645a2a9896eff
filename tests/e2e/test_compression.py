"""End to end: real producers with each compression codec -> table, records intact.

Validation inflates every compressed batch (with a size ceiling) before it is
acknowledged, so each codec as a real client writes it must pass: librdkafka
and kafka-python frame snappy (xerial vs raw), lz4 and zstd their own ways.
On the shared server (tests/e2e/conftest.py) each (client, codec) writes its
own topic, and the table (read through the running server once it holds what
the topics' logs hold) must hold exactly the acknowledged records, with their
keys, values, headers and timestamps, at the acknowledged offsets.
"""

from __future__ import annotations

import pytest

from tests.e2e.shared_server import wait_caught_up
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

N = 400
CODECS = ("gzip", "snappy", "lz4", "zstd")
TS0 = 1_700_000_000_000


def record(topic: str, i: int) -> dict:
    return {
        "key": f"k{i % 7}".encode(),
        # compressible but not constant
        "value": f"{topic}:{i}:".encode() + b"abcdefgh" * (i % 40),
        "headers": [("i", str(i).encode())],
        "timestamp_ms": TS0 + i,
    }


def produce_confluent(bootstrap: str, topic: str, codec: str) -> dict[int, int]:
    import confluent_kafka

    acked: dict[int, int] = {}
    errors: list[str] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                                         "linger.ms": 20})

    def on_delivery(err, msg, i):
        if err is not None:
            errors.append(f"{i}: {err}")
        else:
            acked[i] = msg.offset()

    for i in range(N):
        rec = record(topic, i)
        producer.produce(topic, key=rec["key"], value=rec["value"], headers=rec["headers"],
                         timestamp=rec["timestamp_ms"], on_delivery=lambda e, m, i=i: on_delivery(e, m, i))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == [], errors[:3]
    return acked


def produce_kafka_python(bootstrap: str, topic: str, codec: str) -> dict[int, int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=20)
    futures = []
    for i in range(N):
        rec = record(topic, i)
        futures.append(producer.send(topic, key=rec["key"], value=rec["value"], headers=rec["headers"],
                                     timestamp_ms=rec["timestamp_ms"]))
    producer.flush(60)
    acked = {i: f.get(timeout=30).offset for i, f in enumerate(futures)}
    producer.close(10)
    return acked


@pytest.fixture
def server(multiqueue_server):
    return multiqueue_server


CASES = [(client, codec) for client in ("confluent", "kafka-python") for codec in CODECS]
ACKED: dict[str, dict[int, int]] = {}


@pytest.mark.parametrize("client,codec", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_compressed_produce_is_acknowledged(server, client, codec):
    topic = f"compression-{client}-{codec}"
    produce = produce_confluent if client == "confluent" else produce_kafka_python
    acked = produce(server.bootstrap, topic, codec)
    assert sorted(acked.values()) == list(range(N))
    ACKED[topic] = acked


def test_compressed_records_land_intact(server):
    assert len(ACKED) == len(CASES), "a produce case failed"
    for topic in ACKED:  # whatever the logs hold, acknowledged or not, is in the table
        wait_caught_up(server, topic, 1)
    rows = read_table(server.data_dir, "SELECT topic, `offset`, key, value, headers, "
                                       "unix_millis(`timestamp`) AS ts_ms FROM records "
                                       "WHERE topic LIKE 'compression-%'")
    assert len(rows) == N * len(CASES)
    for row in rows:
        topic = row["topic"]
        i = int(bytes(row["value"]).split(b":")[1])
        rec = record(topic, i)
        assert ACKED[topic][i] == row["offset"]
        assert (bytes(row["key"]), bytes(row["value"]), row["ts_ms"]) == (rec["key"], rec["value"],
                                                                          rec["timestamp_ms"])
        assert [(h["key"], bytes(h["value"])) for h in row["headers"]] == rec["headers"]
