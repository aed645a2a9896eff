"""ProducerStateManager: Kafka's idempotent-producer sequence rules; RefusedPartitions; no I/O."""

from kio.schema.errors import ErrorCode

from pipeline.log.producer_state import (
    BATCHES_KEPT,
    MAX_SEQUENCE,
    ProducerStateManager,
    RefusedPartitions,
    Verdict,
    next_sequence,
)

PID, EPOCH, T, P = 1000, 0, "t", 0


def appended(state: ProducerStateManager, first: int, last: int, offset: int, epoch: int = EPOCH) -> None:
    assert state.check(PID, epoch, T, P, first, last).verdict is Verdict.APPEND
    state.update(PID, epoch, T, P, first, last, offset, ticket=f"commit-{first}")


def test_in_sequence_batches_are_appended():
    state = ProducerStateManager()
    appended(state, 0, 9, 0)
    appended(state, 10, 14, 10)


def test_retry_of_a_recent_batch_is_a_duplicate_with_its_original_offset():
    state = ProducerStateManager()
    appended(state, 0, 9, 100)
    appended(state, 10, 19, 110)
    check = state.check(PID, EPOCH, T, P, 0, 9)
    assert check.verdict is Verdict.DUPLICATE
    assert check.duplicate.base_offset == 100 and check.duplicate.ticket == "commit-0"


def test_only_the_last_five_batches_are_remembered():
    state = ProducerStateManager()
    for k in range(BATCHES_KEPT + 1):
        appended(state, k, k, k)
    assert state.check(PID, EPOCH, T, P, 0, 0).verdict is Verdict.ERROR  # forgotten: out of order
    assert state.check(PID, EPOCH, T, P, 1, 1).verdict is Verdict.DUPLICATE


def test_a_gap_is_out_of_order():
    state = ProducerStateManager()
    appended(state, 0, 4, 0)
    check = state.check(PID, EPOCH, T, P, 6, 7)
    assert check.verdict is Verdict.ERROR
    assert check.error_code == ErrorCode.out_of_order_sequence_number.value


def test_epochs_fence_and_restart_sequences():
    state = ProducerStateManager()
    appended(state, 0, 4, 0, epoch=3)
    assert state.check(PID, 2, T, P, 5, 5).error_code == ErrorCode.invalid_producer_epoch.value
    assert state.check(PID, 4, T, P, 5, 5).error_code == ErrorCode.out_of_order_sequence_number.value
    appended(state, 0, 0, 5, epoch=4)


def test_an_unknown_producer_is_accepted_at_any_sequence_as_kafka_does():
    """Kafka since 2.5 (KIP-360) accepts a batch of a producer it has no state of at any sequence;
    the UNKNOWN_PRODUCER_ID of older brokers made librdkafka renumber its unacknowledged messages.
    Once it has state, the sequence rules apply; a transaction marker's epoch alone wants sequence 0."""
    state = ProducerStateManager()
    unknown = state.check(PID, EPOCH, T, P, 7, 9)
    assert unknown.verdict is Verdict.APPEND and unknown.unknown_producer and unknown.error_code == 0
    first = state.check(PID, EPOCH, T, P, 0, 2)
    assert first.verdict is Verdict.APPEND and not first.unknown_producer
    state.update(PID, EPOCH, T, P, 7, 9, 0)
    assert state.check(PID, EPOCH, T, P, 10, 10).verdict is Verdict.APPEND
    assert state.check(PID, EPOCH, T, P, 12, 12).error_code == ErrorCode.out_of_order_sequence_number.value
    assert state.check(PID, EPOCH, T, P + 1, 4, 4).unknown_producer  # per partition
    state.end_transaction(PID, EPOCH + 1, T, P + 2)
    assert state.check(PID, EPOCH + 1, T, P + 2, 3, 3).error_code == ErrorCode.out_of_order_sequence_number.value
    assert state.check(PID, EPOCH + 1, T, P + 2, 0, 3).verdict is Verdict.APPEND
    assert state.check(-1, -1, T, P, -1, -1).verdict is Verdict.APPEND  # not idempotent: no checks


def test_sequences_wrap_at_int32_max():
    assert next_sequence(MAX_SEQUENCE) == 0
    state = ProducerStateManager()
    appended(state, 0, 0, 0)
    state.update(PID, EPOCH, T, P, MAX_SEQUENCE - 1, MAX_SEQUENCE, 1)
    assert state.check(PID, EPOCH, T, P, 0, 3).verdict is Verdict.APPEND


def test_partitions_are_independent_and_snapshot_round_trips():
    state = ProducerStateManager()
    appended(state, 0, 9, 0)
    state.update(PID, EPOCH, T, 1, 0, 2, 50)
    restored = ProducerStateManager()
    restored.restore(state.snapshot())
    assert restored.snapshot() == state.snapshot()
    assert restored.check(PID, EPOCH, T, 1, 0, 2).duplicate.base_offset == 50
    assert restored.check(PID, EPOCH, T, P, 10, 10).verdict is Verdict.APPEND


def test_refused_partitions_keep_retriable_refusals_per_connection_until_accepted_and_a_bounded_number():
    refused = RefusedPartitions(kept=2)
    assert not refused
    refused.refused("c1", "t", 0, 6)  # NOT_LEADER_OR_FOLLOWER
    refused.refused("c1", "t", 1, 45)  # OUT_OF_ORDER_SEQUENCE_NUMBER: not retriable, not kept
    assert refused and refused.gap_error("c1", "t", 0) == 6
    assert refused.gap_error("c2", "t", 0) is None and refused.gap_error("c1", "t", 1) is None
    refused.refused("c1", "t", 0, 7)  # REQUEST_TIMED_OUT: the latest refusal is the one answered
    assert refused.gap_error("c1", "t", 0) == 7
    refused.accepted("c1", "t", 0)
    assert refused.gap_error("c1", "t", 0) is None and not refused
    for connection in ("a", "b", "c"):  # at most two kept: the oldest goes
        refused.refused(connection, "t", 0, 6)
    assert [refused.gap_error(c, "t", 0) for c in ("a", "b", "c")] == [None, 6, 6]


def test_unknown_producers_refuse_one_batch_a_few_times_then_accept_it():
    from pipeline.log.producer_state import UnknownProducers

    unknown = UnknownProducers(refusals=2, kept=2)
    assert [unknown.refuse(PID, T, P, 5) for _ in range(3)] == [True, True, False]
    assert unknown.refuse(PID, T, P, 5)  # accepted once: a later refusal of it counts again
    assert unknown.refuse(PID, T, P, 9) and unknown.refuse(PID, T, P, 9) and not unknown.refuse(PID, T, P, 9)
    assert unknown.refuse(PID, T, P, 3)
    unknown.appended(PID, T, P)  # its earlier batch came: counting starts over
    assert unknown.refuse(PID, T, P, 3) and unknown.refuse(PID, T, P, 3)
    for partition in range(5):  # bounded: the oldest is forgotten
        unknown.refuse(PID, T, partition, 1)
    assert len(unknown._refused) == 2

