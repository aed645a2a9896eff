"""Crash recovery: kill -9 under load, restart on the same data dir, nothing acknowledged is lost.

Idempotent confluent-kafka (librdkafka) producers send at a steady pace; the
server is killed with SIGKILL mid-stream and restarted on the same port and
data dir; the producers ride through the restart with their own retries. Every
record whose delivery was acknowledged must be in the table exactly once, no
record may be stored twice, and per partition the offsets are gapless and each
producer's records are in send order. Run in both acknowledgement modes.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from tests.e2e.table_reader import read_table
from tests.e2e.server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow

PRODUCERS = 2
N = 6_000
TOPIC = "crash"


class IdempotentProducer(threading.Thread):
    def __init__(self, name: str, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.name_ = name
        self.bootstrap = bootstrap
        self.acked: dict[int, tuple[int, int]] = {}
        self.errors: list[tuple[int, str]] = []
        self.sent = 0

    def run(self) -> None:
        import confluent_kafka

        producer = confluent_kafka.Producer({
            "bootstrap.servers": self.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 180_000,
            "reconnect.backoff.max.ms": 500,
        })

        def on_delivery(err, msg, i):
            if err is None:
                self.acked[i] = (msg.partition(), msg.offset())
            else:
                self.errors.append((i, str(err)))

        deadline = time.monotonic() + 150
        for i in range(N):
            if time.monotonic() > deadline:
                break
            while True:
                try:
                    producer.produce(TOPIC, key=f"{self.name_}-{i % 11}".encode(), value=f"{self.name_}:{i}".encode(),
                                     on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i))
                    break
                except BufferError:
                    producer.poll(0.05)
            self.sent += 1
            producer.poll(0)
            if i % 100 == 0:
                time.sleep(0.02)  # a steady load over a few seconds, not one burst
        producer.flush(180)


@pytest.mark.parametrize("ack_on", ["wal", "spark"])
def test_kill_9_under_load_loses_no_acknowledged_record(ack_on, tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    args = ("--ack-on", ack_on, "--num-partitions", "2", "--linger-ms", "100")
    server = ServerProcess(data_dir, *args, port=port).start()
    producers = [IdempotentProducer(f"p{k}", server.bootstrap) for k in range(PRODUCERS)]
    try:
        for p in producers:
            p.start()
        deadline = time.monotonic() + 60
        while sum(len(p.acked) for p in producers) < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
        acked_before_crash = sum(len(p.acked) for p in producers)
        assert acked_before_crash >= 1000, server.log_text()
        server.kill()  # SIGKILL mid-stream
        server = ServerProcess(data_dir, *args, port=port,
                               log_path=tmp_path / "restarted-server.log").start()
        for p in producers:
            p.join(240)
        assert not any(p.is_alive() for p in producers), "producers did not finish"
    finally:
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()
    assert "recovery:" in server.log_text()

    rows = read_table(data_dir, "SELECT `partition`, `offset`, value FROM records")
    stored: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    by_partition: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
    for row in rows:
        name, seq = bytes(row["value"]).decode().split(":")
        stored[(name, int(seq))].append((row["partition"], row["offset"]))
        by_partition[row["partition"]].append((row["offset"], name, int(seq)))

    duplicates = {k: v for k, v in stored.items() if len(v) > 1}
    assert not duplicates, f"{len(duplicates)} records stored twice, e.g. {list(duplicates.items())[:3]}"
    for p in producers:
        for i, (partition, offset) in p.acked.items():
            assert stored.get((p.name_, i)) == [(partition, offset)], f"acked record {p.name_}:{i} missing or moved"
    assert sum(len(p.acked) for p in producers) > acked_before_crash
    for partition, items in by_partition.items():
        items.sort()
        assert [o for o, _, _ in items] == list(range(len(items))), f"offset gap in partition {partition}"
        for p in producers:
            seqs = [seq for _, name, seq in items if name == p.name_]
            assert seqs == sorted(seqs), f"{p.name_} out of order in partition {partition}"
