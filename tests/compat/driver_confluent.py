"""The matrix's confluent-kafka driver (any 2.x release; run with that release's venv python)."""

from __future__ import annotations

import time

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from driver_common import load, run, values_for

cfg = load()
_version = confluent_kafka.version()  # (str, int) before 2.16; a str since
VERSION = f"{_version if isinstance(_version, str) else _version[0]} (librdkafka {confluent_kafka.libversion()[0]})"
T = cfg["timeout_s"]
PLAIN = {"bootstrap.servers": cfg["plaintext"]}
SCRAM = {"bootstrap.servers": cfg["sasl_ssl"], "security.protocol": "SASL_SSL", "ssl.ca.location": cfg["ca"],
         "sasl.mechanisms": cfg["mechanism"], "sasl.username": cfg["user"], "sasl.password": cfg["password"]}


def produce(conf: dict, topic: str, values: list[str], **extra) -> None:
    errors: list[str] = []
    producer = Producer({**conf, "acks": "all", "message.timeout.ms": T * 1000, **extra})
    for value in values:
        producer.produce(topic, value.encode(), partition=0,
                         on_delivery=lambda err, _msg: err is not None and errors.append(str(err)))
    left = producer.flush(T)
    if errors or left:
        raise RuntimeError(f"{left} not delivered, errors: {errors[:3]}")


def read_back(conf: dict, topic: str, n: int, **extra) -> list[str]:
    """Partition 0 of ``topic`` from the beginning, until its end once ``n`` values are in."""
    consumer = Consumer({**conf, "group.id": f"{cfg['client']}-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, **extra})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[str] = []
    deadline = time.monotonic() + T
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    if len(out) >= n:
                        break
                    continue
                raise KafkaException(msg.error())
            out.append(msg.value().decode())
    finally:
        consumer.close()
    return out


def do_produce():
    produce(PLAIN, cfg["topics"]["produce"], values_for(cfg, "produce"), **{"enable.idempotence": False})


def do_idempotent():
    produce(PLAIN, cfg["topics"]["idempotent"], values_for(cfg, "idempotent"), **{"enable.idempotence": True})


def do_group_consume():
    consumer = Consumer({**PLAIN, "group.id": cfg["group"], "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([cfg["topics"]["group-consume"]])
    out: list[str] = []
    deadline = time.monotonic() + T
    try:
        while len(out) < cfg["n"] and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            out.append(msg.value().decode())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return out


def do_scram_tls():
    topic = cfg["topics"]["scram-tls"]
    produce(SCRAM, topic, values_for(cfg, "scram-tls"))
    return read_back(SCRAM, topic, cfg["n"])


def do_create_topic():
    admin = AdminClient(PLAIN)
    futures = admin.create_topics([NewTopic(cfg["topics"]["create-topic"], num_partitions=3, replication_factor=1)],
                                  operation_timeout=T)
    for future in futures.values():
        future.result(T)


def do_transactions():
    topic = cfg["topics"]["transactions"]
    producer = Producer({**PLAIN, "transactional.id": cfg["transactional_id"], "transaction.timeout.ms": 10_000})
    producer.init_transactions(cfg["txn_timeout_s"])
    for outcome, values in (("commit", values_for(cfg, "transactions-commit", 3)),
                            ("abort", values_for(cfg, "transactions-abort", 2))):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value.encode(), partition=0)
        if outcome == "commit":
            producer.commit_transaction(T)
        else:
            # Sent before the abort, so the log holds aborted records (librdkafka's abort drops
            # what is still queued) and read_committed has something to skip.
            producer.flush(T)
            producer.abort_transaction(T)
    return read_back(PLAIN, topic, 3, **{"isolation.level": "read_committed"})


run({"produce": do_produce, "idempotent": do_idempotent, "group-consume": do_group_consume,
     "scram-tls": do_scram_tls, "create-topic": do_create_topic, "transactions": do_transactions}, VERSION)
