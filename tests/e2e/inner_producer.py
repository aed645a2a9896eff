"""An idempotent confluent-kafka producer run inside a host's network namespace (``tests/e2e/test_failover.py``).

``python inner_producer.py BOOTSTRAP TOPIC PRODUCER COUNT``: sends ``COUNT`` records ``"PRODUCER:i"``
(keys as the test's own producers), one every 10 ms, and prints one JSON line per delivery report,
``{"i": i, "p": partition, "o": offset or null}`` or ``{"i": i, "err": "..."}``, as it gets them;
then flushes (up to its message timeout) and exits 0. Its stdout is line-buffered JSON only; librdkafka's
log (debug ``eos,broker,metadata``) goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time


def main(bootstrap: str, topic: str, producer_id: int, count: int) -> int:
    import confluent_kafka

    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
        "message.timeout.ms": 300_000, "request.timeout.ms": 5000, "socket.timeout.ms": 5000,
        "debug": "eos,broker,metadata"})  # on stderr: the test keeps it for a failure's message

    def on_delivery(err, msg) -> None:
        i = int(msg.value().split(b":")[1])
        line = {"i": i, "err": str(err)} if err is not None else {"i": i, "p": msg.partition(), "o": msg.offset()}
        print(json.dumps(line), flush=True)

    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=f"key-{i % 24}".encode(), value=f"{producer_id}:{i}".encode(),
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(0.01)
    left = producer.flush(300)
    return 0 if left == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
