"""A confluent_kafka (librdkafka) group consumer in its own process, for tests/e2e/test_groups.py.

    python -m tests.e2e.group_consumer BOOTSTRAP GROUP TOPIC SESSION_TIMEOUT_MS

Prints one JSON line per event on stdout (flushed): {"assigned": [partitions]}
after each assignment (the whole current assignment, eager protocol),
{"record": [partition, offset, value]} per consumed record, {"closed": true}
after a clean close. It closes cleanly (LeaveGroup) when "close" arrives on
stdin; a test that wants it to stop heartbeating kills it (SIGKILL).
"""

from __future__ import annotations

import json
import sys
import threading


def main() -> None:
    from confluent_kafka import Consumer

    bootstrap, group, topic, session_ms = sys.argv[1:5]
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": int(session_ms),
        "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "partition.assignment.strategy": "range", "topic.metadata.refresh.interval.ms": 2000,
    })
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()

    def emit(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def on_assign(c, partitions):
        emit({"assigned": sorted(p.partition for p in partitions)})

    def on_revoke(c, partitions):
        emit({"revoked": sorted(p.partition for p in partitions)})

    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while not stop.is_set():
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            continue
        emit({"record": [msg.partition(), msg.offset(), msg.value().decode()]})
        consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    emit({"closed": True})


if __name__ == "__main__":
    main()
