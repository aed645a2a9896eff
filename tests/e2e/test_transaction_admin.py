"""Finding and aborting a hanging transaction with kafka-python 3.x's KafkaAdminClient (KIP-664), on
the shared server: ``list_transactions`` (with ListTransactions v1's duration filter), ``describe_transactions``, ``describe_producers`` and
``find_hanging_transactions`` find a transaction a confluent-kafka producer left open, and
``abort_transaction`` (WriteTxnMarkers to the partition leader; docs/operations.md's ``abort_hanging``,
run as written) aborts it; a read_committed consumer
then advances past it, and reads the records after it but none of the aborted ones (issue 35)."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.docs.blocks import find as block

pytestmark = pytest.mark.slow

HUNG = 3
AFTER = 2
WAIT_S = 60


def read_committed(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[tuple[int, bytes]]:
    """(offset, value) of what a read_committed consumer gets from ``topic``-0 within ``timeout_s``
    (returns early once it has ``want``)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.value()))
        return got
    finally:
        consumer.close()


def test_a_transaction_left_open_is_found_and_aborted_with_the_admin_client(multiqueue_server):
    find_and_abort(multiqueue_server.bootstrap, f"hanging-{uuid.uuid4().hex[:8]}", f"hung-{uuid.uuid4().hex[:8]}")


def find_and_abort(bootstrap: str, topic: str, tid: str) -> None:
    """The story of the module docstring on the server (or cluster) at ``bootstrap``: ``tid``'s
    transaction left open on ``topic``-0 (a topic of one partition this creates), found and aborted
    (``tests/compat/test_matrix_cluster.py`` runs it on ``--brokers 3``)."""
    from confluent_kafka import Producer
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    hung = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                     "transaction.timeout.ms": 600_000})  # the coordinator would abort it only in 10 min
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        hung.init_transactions(WAIT_S)
        hung.begin_transaction()
        for i in range(HUNG):
            hung.produce(topic, b"hung-%d" % i, partition=0)
        assert hung.flush(WAIT_S) == 0  # in the log at offsets 0-2, the transaction open
        plain = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(AFTER):
            plain.produce(topic, b"after-%d" % i, partition=0)
        assert plain.flush(WAIT_S) == 0
        del plain
        assert read_committed(bootstrap, topic, 1, 3) == []  # the open transaction holds the last stable offset

        listed = [t for listings in admin.list_transactions().values() for t in listings if t.transactional_id == tid]
        assert [(t.state.value, t.producer_id >= 0) for t in listed] == [("Ongoing", True)], listed
        # ListTransactions v1's duration filter (KIP-994): open longer than 1 ms, yes; than 10 min, no
        assert [tid] == [t.transactional_id for ts in admin.list_transactions(duration_filter_ms=1).values()
                         for t in ts if t.transactional_id == tid]
        assert not [t for ts in admin.list_transactions(duration_filter_ms=600_000).values()
                    for t in ts if t.transactional_id == tid]
        described = admin.describe_transactions([tid])[tid]
        assert described.state.value == "Ongoing" and described.topic_partitions == {TopicPartition(topic, 0)}
        pid, epoch = described.producer_id, described.producer_epoch
        [state] = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)].active_producers
        assert (state.producer_id, state.producer_epoch, state.last_sequence,
                state.current_transaction_start_offset) == (pid, epoch, HUNG - 1, 0), state
        # The tool's threshold is the broker's transaction.max.timeout.ms + 5 min; a negative "timeout"
        # of -5 min flags every open transaction, this minute-old one included.
        hanging = admin.find_hanging_transactions(max_transaction_timeout_ms=-5 * 60 * 1000)
        assert [(h["transactional_id"], h["producer_id"], h["topic_partitions"]) for h in hanging
                if h["transactional_id"] == tid] == [(tid, pid, [TopicPartition(topic, 0)])], hanging

        # docs/operations.md's abort_hanging, as written, with that threshold
        namespace: dict = {}
        exec(compile(block("docs/operations.md", "def abort_hanging(admin").text, "operations.md abort_hanging",
                     "exec"), namespace)
        aborted = namespace["abort_hanging"](admin, max_transaction_timeout_ms=-5 * 60 * 1000)
        assert (tid, TopicPartition(topic, 0)) in aborted, aborted
        [state] = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)].active_producers
        assert state.current_transaction_start_offset == -1, state
        # the abort marker at offset 5: the records after the transaction, none of it
        assert read_committed(bootstrap, topic, AFTER, WAIT_S) == [(HUNG + i, b"after-%d" % i) for i in range(AFTER)]
    finally:
        admin.close()
        try:
            hung.abort_transaction(WAIT_S)  # the coordinator's side of it ends too
        except Exception:  # noqa: BLE001 - the test's own failure is the one to show
            pass
