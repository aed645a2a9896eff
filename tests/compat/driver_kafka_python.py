"""The matrix's kafka-python driver (2.0.2 and 3.x; run with that release's venv python).

kafka-python 2.0.2 has neither an idempotent nor a transactional producer (both came with
kafka-python 2.2.0's ``enable_idempotence`` and ``transactional_id``): those cells are its
limitation. It needs no ``api_version``: it probes the broker with ApiVersions and works.
"""

from __future__ import annotations

import time

import kafka
from driver_common import Limitation, load, run, values_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

cfg = load()
VERSION = kafka.__version__
T = cfg["timeout_s"]
PLAIN = {"bootstrap_servers": cfg["plaintext"]}
SCRAM = {"bootstrap_servers": cfg["sasl_ssl"], "security_protocol": "SASL_SSL", "ssl_cafile": cfg["ca"],
         "sasl_mechanism": cfg["mechanism"], "sasl_plain_username": cfg["user"],
         "sasl_plain_password": cfg["password"]}
HAS_IDEMPOTENCE = "enable_idempotence" in KafkaProducer.DEFAULT_CONFIG
HAS_TRANSACTIONS = hasattr(KafkaProducer, "init_transactions")


def produce(conf: dict, topic: str, values: list[str], **extra) -> None:
    if HAS_IDEMPOTENCE:
        extra.setdefault("enable_idempotence", False)
    producer = KafkaProducer(**conf, acks="all", request_timeout_ms=T * 1000, **extra)
    try:
        futures = [producer.send(topic, value.encode(), partition=0) for value in values]
        for future in futures:
            future.get(T)
    finally:
        producer.close(T)


def read_back(conf: dict, topic: str, n: int, **extra) -> list[str]:
    """Partition 0 of ``topic`` from the beginning, until its end once ``n`` values are in."""
    consumer = KafkaConsumer(**conf, enable_auto_commit=False, **extra)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    out: list[str] = []
    deadline = time.monotonic() + T
    try:
        while time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                out.extend(r.value.decode() for r in records)
            if len(out) >= n and consumer.position(partition) >= consumer.end_offsets([partition])[partition]:
                break
    finally:
        consumer.close()
    return out


def do_produce():
    produce(PLAIN, cfg["topics"]["produce"], values_for(cfg, "produce"))


def do_idempotent():
    if not HAS_IDEMPOTENCE:
        raise Limitation(f"kafka-python {kafka.__version__} has no idempotent producer "
                         "(enable_idempotence, since 2.2.0)")
    produce(PLAIN, cfg["topics"]["idempotent"], values_for(cfg, "idempotent"), enable_idempotence=True)


def do_group_consume():
    consumer = KafkaConsumer(cfg["topics"]["group-consume"], **PLAIN, group_id=cfg["group"],
                             auto_offset_reset="earliest", enable_auto_commit=False)
    out: list[str] = []
    deadline = time.monotonic() + T
    try:
        while len(out) < cfg["n"] and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                out.extend(r.value.decode() for r in records)
        if len(out) < cfg["n"]:  # the cell then says so with the client's last warning (driver_common.attempt)
            raise TimeoutError(f"{len(out)} of {cfg['n']} values consumed within {T} s, assignment "
                               f"{sorted(str(tp) for tp in consumer.assignment())}")
        consumer.commit()
    finally:
        consumer.close()
    return out


def do_scram_tls():
    topic = cfg["topics"]["scram-tls"]
    produce(SCRAM, topic, values_for(cfg, "scram-tls"))
    return read_back(SCRAM, topic, cfg["n"])


def do_create_topic():
    admin = KafkaAdminClient(**PLAIN, request_timeout_ms=T * 1000)
    try:
        admin.create_topics([NewTopic(cfg["topics"]["create-topic"], num_partitions=3, replication_factor=1)])
    finally:
        admin.close()


def do_transactions():
    if not HAS_TRANSACTIONS:
        raise Limitation(f"kafka-python {kafka.__version__} has no transactional producer "
                         "(transactional_id, since 2.2.0)")
    topic = cfg["topics"]["transactions"]
    producer = KafkaProducer(**PLAIN, transactional_id=cfg["transactional_id"], transaction_timeout_ms=10_000,
                             max_block_ms=cfg["txn_timeout_s"] * 1000)
    try:
        producer.init_transactions()
        for outcome, values in (("commit", values_for(cfg, "transactions-commit", 3)),
                                ("abort", values_for(cfg, "transactions-abort", 2))):
            producer.begin_transaction()
            for value in values:
                producer.send(topic, value.encode(), partition=0)
            if outcome == "commit":
                producer.commit_transaction()
            else:
                producer.flush(T)  # sent before the abort: the log holds aborted records
                producer.abort_transaction()
    finally:
        producer.close(T)
    return read_back(PLAIN, topic, 3, isolation_level="read_committed")


run({"produce": do_produce, "idempotent": do_idempotent, "group-consume": do_group_consume,
     "scram-tls": do_scram_tls, "create-topic": do_create_topic, "transactions": do_transactions}, VERSION)
