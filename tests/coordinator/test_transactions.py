"""The transaction coordinator's rules (``pipeline.coordinator.transactions``, sans-I/O), against
Kafka's TransactionCoordinator: epochs, fencing, KIP-360 re-initialisation, timeouts, EndTxn retries."""

from __future__ import annotations

from pipeline.coordinator import transactions as tx
from pipeline.coordinator.transactions import TransactionCoordinator, TxnState

FENCED = tx.PRODUCER_FENCED


def started(coordinator: TransactionCoordinator, tid: str = "app", pid: int = 100, now: int = 0):
    decision = coordinator.judge_init(tid, 60_000, -1, -1, FENCED)
    assert decision.error == tx.NONE
    return coordinator.initialise(tid, 60_000, now, pid if decision.new_producer_id else None)


def test_first_init_gets_a_producer_id_then_epochs_move_on():
    c = TransactionCoordinator()
    meta = started(c)
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (100, 0, TxnState.EMPTY)
    again = started(c, pid=999)
    assert (again.producer_id, again.producer_epoch) == (100, 1)  # same id, next epoch
    assert c.by_producer(100) is again


def test_timeout_outside_the_limit_is_refused():
    c = TransactionCoordinator(max_timeout_ms=1000)
    assert c.judge_init("app", 1001, -1, -1, FENCED).error == tx.INVALID_TRANSACTION_TIMEOUT
    assert c.judge_init("app", 0, -1, -1, FENCED).error == tx.INVALID_TRANSACTION_TIMEOUT


def test_a_transaction_runs_and_a_retried_end_is_answered_again():
    c = TransactionCoordinator()
    meta = started(c)
    assert c.check("app", 100, 0, FENCED) == (tx.NONE, meta)
    c.begin_if_needed(meta, 10)
    meta.partitions.add(("t", 0))
    assert c.check_produce(100, 0, "t", 0) == tx.NONE
    assert c.check_produce(100, 0, "t", 1) == tx.INVALID_TXN_STATE  # not added
    assert c.judge_end(meta, commit=True) == (tx.NONE, True)
    c.prepare(meta, True, 20)
    assert c.check("app", 100, 0, FENCED)[0] == tx.CONCURRENT_TRANSACTIONS  # markers being written
    c.complete(meta, 30)
    assert meta.state is TxnState.COMPLETE_COMMIT and not meta.partitions
    assert c.judge_end(meta, commit=True) == (tx.NONE, False)  # the retry
    assert c.judge_end(meta, commit=False)[0] == tx.INVALID_TXN_STATE
    assert c.check_produce(100, 0, "t", 0) == tx.INVALID_TXN_STATE  # no transaction now


def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction():
    c = TransactionCoordinator()
    meta = started(c)
    c.begin_if_needed(meta, 10)
    meta.partitions.add(("t", 0))
    decision = c.judge_init("app", 60_000, -1, -1, FENCED)
    assert decision.abort_first and decision.error == tx.NONE
    c.prepare(meta, False, 20, bump_epoch=True)   # the markers carry epoch 1
    assert meta.producer_epoch == 1 and meta.state is TxnState.PREPARE_ABORT
    c.complete(meta, 30)
    new = c.initialise("app", 60_000, 40, None)
    assert new.producer_epoch == 2
    assert c.check("app", 100, 0, FENCED)[0] == FENCED                     # the zombie
    assert c.check("app", 100, 0, tx.fenced_error(1, 2))[0] == tx.INVALID_PRODUCER_EPOCH  # an old version
    assert c.check_produce(100, 0, "t", 0) == tx.INVALID_PRODUCER_EPOCH
    assert c.check("app", 101, 2, FENCED)[0] == tx.INVALID_PRODUCER_ID_MAPPING
    # The zombie may not re-initialise with its old epoch (KIP-360 only for its own last epoch).
    assert c.judge_init("app", 60_000, 100, 0, FENCED).error == FENCED


def test_timed_out_transaction_is_aborted_and_its_producer_may_reinitialise():
    c = TransactionCoordinator()
    meta = started(c)
    c.begin_if_needed(meta, 1_000)
    assert c.expired(1_000 + 60_000) == []
    assert c.expired(1_000 + 60_001) == [meta]
    c.prepare(meta, False, 61_001, bump_epoch=True)
    c.complete(meta, 61_002)
    assert (meta.producer_epoch, meta.last_epoch) == (1, 0)
    decision = c.judge_init("app", 60_000, 100, 0, FENCED)  # KIP-360: its own previous epoch
    assert decision.error == tx.NONE and not decision.abort_first
    assert c.initialise("app", 60_000, 70_000, None).producer_epoch == 2


def test_exhausted_epoch_gets_a_new_producer_id():
    c = TransactionCoordinator()
    meta = started(c)
    meta.producer_epoch = tx.MAX_EPOCH
    decision = c.judge_init("app", 60_000, -1, -1, FENCED)
    assert decision.new_producer_id
    new = c.initialise("app", 60_000, 0, 200)
    assert (new.producer_id, new.producer_epoch) == (200, 0)
    assert c.by_producer(100) is None and c.by_producer(200) is new
