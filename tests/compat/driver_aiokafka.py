"""The matrix's aiokafka driver (0.7 and later; run with that release's venv python).

aiokafka 0.7.0 has no admin client (``aiokafka.admin`` came with 0.8.0): its create-topic cell
is that limitation.
"""

from __future__ import annotations

import asyncio

import aiokafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.helpers import create_ssl_context
from driver_common import Limitation, load, run, values_for

cfg = load()
VERSION = aiokafka.__version__
try:  # aiokafka before 0.9 is built on kafka-python
    import kafka

    VERSION += f" (kafka-python {kafka.__version__})"
except ImportError:
    pass
T = cfg["timeout_s"]
PLAIN = {"bootstrap_servers": cfg["plaintext"]}


def scram() -> dict:
    return {"bootstrap_servers": cfg["sasl_ssl"], "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=cfg["ca"]), "sasl_mechanism": cfg["mechanism"],
            "sasl_plain_username": cfg["user"], "sasl_plain_password": cfg["password"]}


def bounded(coro_fn, timeout: float = T):
    """A driver capability: ``coro_fn()`` on a fresh event loop, cancelled after ``timeout`` s."""

    async def capped():
        return await within(coro_fn(), timeout, "the capability")

    return lambda: asyncio.run(capped())


async def within(awaitable, seconds: float, what: str):
    """``awaitable``, cancelled after ``seconds`` (a ``TimeoutError`` naming ``what``); a timeout the
    client raised itself before then passes unchanged (``asyncio.TimeoutError`` is ``TimeoutError``)."""
    deadline = asyncio.get_running_loop().time() + seconds
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        if asyncio.get_running_loop().time() < deadline:
            raise
        raise TimeoutError(f"{what}: no answer within {seconds} s") from None


async def produce(conf: dict, topic: str, values: list[str], **extra) -> None:
    producer = AIOKafkaProducer(**conf, acks="all", request_timeout_ms=T * 1000, **extra)
    await producer.start()
    try:
        # send() returns the future of the acknowledgement: every one must resolve to record metadata
        acknowledgements = [await producer.send(topic, value.encode(), partition=0) for value in values]
        await asyncio.gather(*acknowledgements)
    finally:
        await producer.stop()


async def read_back(conf: dict, topic: str, n: int, **extra) -> list[str]:
    """Partition 0 of ``topic`` from the beginning, until its end once ``n`` values are in."""
    consumer = AIOKafkaConsumer(**conf, enable_auto_commit=False, auto_offset_reset="earliest", **extra)
    await consumer.start()
    partition = TopicPartition(topic, 0)
    out: list[str] = []
    try:
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        end = (await consumer.end_offsets([partition]))[partition]
        while len(out) < n or await consumer.position(partition) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(r.value.decode() for r in records)
            end = (await consumer.end_offsets([partition]))[partition]
    finally:
        await consumer.stop()
    return out


async def do_produce():
    await produce(PLAIN, cfg["topics"]["produce"], values_for(cfg, "produce"), enable_idempotence=False)


async def do_idempotent():
    await produce(PLAIN, cfg["topics"]["idempotent"], values_for(cfg, "idempotent"), enable_idempotence=True)


async def do_group_consume():
    consumer = AIOKafkaConsumer(cfg["topics"]["group-consume"], **PLAIN, group_id=cfg["group"],
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list[str] = []
    try:
        while len(out) < cfg["n"]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(r.value.decode() for r in records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return out


async def do_scram_tls():
    topic = cfg["topics"]["scram-tls"]
    await produce(scram(), topic, values_for(cfg, "scram-tls"))
    return await read_back(scram(), topic, cfg["n"])


async def do_create_topic():
    try:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    except ImportError:
        raise Limitation(f"aiokafka {aiokafka.__version__} has no admin client (aiokafka.admin)") from None
    admin = AIOKafkaAdminClient(**PLAIN, request_timeout_ms=T * 1000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(cfg["topics"]["create-topic"], num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()


async def do_transactions():
    topic = cfg["topics"]["transactions"]
    producer = AIOKafkaProducer(**PLAIN, transactional_id=cfg["transactional_id"], transaction_timeout_ms=10_000)
    try:
        await within(producer.start(), cfg["txn_timeout_s"], "start (transaction coordinator, producer id)")
        for outcome, values in (("commit", values_for(cfg, "transactions-commit", 3)),
                                ("abort", values_for(cfg, "transactions-abort", 2))):
            await within(producer.begin_transaction(), cfg["txn_timeout_s"], "begin_transaction")
            for value in values:
                # the first send waits for the transactional producer id (FindCoordinator, InitProducerId)
                await within(producer.send_and_wait(topic, value.encode(), partition=0), cfg["txn_timeout_s"],
                             "send in a transaction")
            await within(producer.commit_transaction() if outcome == "commit" else producer.abort_transaction(),
                         cfg["txn_timeout_s"], f"{outcome}_transaction")
    finally:
        await producer.stop()
    return await read_back(PLAIN, topic, 3, isolation_level="read_committed")


run({"produce": bounded(do_produce), "idempotent": bounded(do_idempotent),
     "group-consume": bounded(do_group_consume), "scram-tls": bounded(do_scram_tls),
     "create-topic": bounded(do_create_topic), "transactions": bounded(do_transactions)}, VERSION)
