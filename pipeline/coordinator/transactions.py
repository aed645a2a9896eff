"""The transaction coordinator's state: Kafka's TransactionMetadata and its rules (sans-I/O).

One ``TransactionMetadata`` per ``transactional.id`` (KIP-98): the producer id
and epoch it was given, its state, the partitions and consumer groups of the
ongoing transaction, its timeout. ``TransactionCoordinator`` judges each
request against it and says what to do; it does no I/O and reads no clock
(times are wall-clock ms passed in). ``pipeline.requests.txn_apis`` stores the
state (``pipeline.coordinator.txn_store``) before answering and writes the
markers. Rules follow Kafka's ``TransactionCoordinator`` /
``TransactionStateManager`` (core/src/main/scala/kafka/coordinator/transaction):

* InitProducerId gives a transactional id a producer id once, and a new epoch
  at each call; an ongoing transaction of the previous producer is aborted
  first with the new epoch, which fences it (zombie fencing). KIP-360: a
  producer that names its id and epoch may bump its own epoch (after its
  transaction timed out), no one else's.
* A request from an older epoch is PRODUCER_FENCED (INVALID_PRODUCER_EPOCH
  for versions before KIP-588), a producer id that is not the transactional
  id's is INVALID_PRODUCER_ID_MAPPING, a request while the previous
  transaction's markers are being written is CONCURRENT_TRANSACTIONS.
* EndTxn moves Ongoing to PrepareCommit/PrepareAbort (stored), the markers are
  written, then CompleteCommit/CompleteAbort (stored). A transaction older than
  its timeout is aborted with a bumped epoch.
"""

from __future__ import annotations

from collections.abc import Iterable
import enum
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

MAX_EPOCH = 32767 - 1
"""Kafka bumps to a new producer id when the epoch would pass Short.MaxValue - 1."""
DEFAULT_MAX_TIMEOUT_MS = 900_000
"""Kafka ``transaction.max.timeout.ms``: a producer asking more gets INVALID_TRANSACTION_TIMEOUT."""

NONE = ErrorCode.none.value
CONCURRENT_TRANSACTIONS = ErrorCode.concurrent_transactions.value
INVALID_TXN_STATE = ErrorCode.invalid_txn_state.value
INVALID_PRODUCER_ID_MAPPING = ErrorCode.invalid_producer_id_mapping.value
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch.value
PRODUCER_FENCED = ErrorCode.producer_fenced.value
INVALID_TRANSACTION_TIMEOUT = ErrorCode.invalid_transaction_timeout.value


class TxnState(str, enum.Enum):
    """Kafka TransactionState; the values are the names DescribeTransactions/ListTransactions use."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(slots=True)
class TransactionMetadata:
    """One transactional id (Kafka TransactionMetadata).

    Attributes:
        transactional_id: the producer's ``transactional.id``.
        producer_id, producer_epoch: what it was last given.
        last_epoch: the epoch before a bump the producer did not ask for (a timed-out
            transaction's abort), -1 otherwise: that producer may still re-initialise (KIP-360).
        state: see TxnState.
        timeout_ms: ``transaction.timeout.ms`` the producer gave.
        partitions: (topic, partition) of the ongoing transaction.
        groups: consumer groups whose offsets it commits (AddOffsetsToTxn).
        start_ms: wall-clock ms the ongoing transaction began (-1: none).
        update_ms: wall-clock ms of the last change.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_epoch: int = -1
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    start_ms: int = -1
    update_ms: int = -1


@dataclass(frozen=True, slots=True)
class InitDecision:
    """What InitProducerId should do.

    Attributes:
        error: Kafka error code (NONE: go on).
        abort_first: an ongoing transaction to abort (its markers written with the
            metadata's new epoch) before answering.
        new_producer_id: allocate a fresh producer id (first use, or epoch exhausted).
    """

    error: int
    abort_first: bool = False
    new_producer_id: bool = False


def produce_error(meta: TransactionMetadata | None, producer_id: int, producer_epoch: int, topic: str,
                  partition: int) -> int:
    """Whether a transactional batch of ``producer_id`` at ``producer_epoch`` may be appended to
    ``topic``-``partition`` given its transactional id's metadata ``meta`` (in memory at its coordinator,
    or as stored, at a partition leader that does not coordinate it: KIP-890 part 1's verification):
    NONE, INVALID_PRODUCER_EPOCH for an older epoch, INVALID_TXN_STATE when the partition is not in
    the producer's ongoing transaction."""
    if meta is None or meta.producer_id != producer_id:
        return INVALID_TXN_STATE
    if producer_epoch < meta.producer_epoch:
        return INVALID_PRODUCER_EPOCH
    if (producer_epoch != meta.producer_epoch or meta.state is not TxnState.ONGOING
            or (topic, partition) not in meta.partitions):
        return INVALID_TXN_STATE
    return NONE


def fenced_error(version: int, first_version_with_producer_fenced: int) -> int:
    """PRODUCER_FENCED from the request version that knows it (KIP-588), else INVALID_PRODUCER_EPOCH."""
    return PRODUCER_FENCED if version >= first_version_with_producer_fenced else INVALID_PRODUCER_EPOCH


class TransactionCoordinator:
    """Every transactional id's metadata, and the rules (see the module docstring)."""

    def __init__(self, max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS) -> None:
        self.max_timeout_ms = max_timeout_ms
        self.transactions: dict[str, TransactionMetadata] = {}
        self._by_producer: dict[int, TransactionMetadata] = {}

    def load(self, metadata: TransactionMetadata) -> None:
        """Add a stored transactional id (at start, or when this broker becomes its coordinator)."""
        self.transactions[metadata.transactional_id] = metadata
        self._by_producer[metadata.producer_id] = metadata

    def unload(self, transactional_ids: Iterable[str]) -> None:
        """Forget these transactional ids (their coordinator moved to another broker; Kafka
        TransactionStateManager.removeTransactionsForTxnTopicPartition)."""
        for tid in transactional_ids:
            meta = self.transactions.pop(tid, None)
            if meta is not None and self._by_producer.get(meta.producer_id) is meta:
                del self._by_producer[meta.producer_id]

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)

    def by_producer(self, producer_id: int) -> TransactionMetadata | None:
        return self._by_producer.get(producer_id)

    # -- InitProducerId -------------------------------------------------------------

    def judge_init(self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                   fenced: int) -> InitDecision:
        """Kafka ``handleInitProducerId``. ``producer_id``/``producer_epoch``: what a KIP-360 producer
        names (-1: none). ``fenced``: the error for a mismatched epoch at this request version."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return InitDecision(INVALID_TRANSACTION_TIMEOUT)
        meta = self.transactions.get(transactional_id)
        if meta is None:
            return InitDecision(NONE, new_producer_id=True)
        if meta.state.preparing:
            return InitDecision(CONCURRENT_TRANSACTIONS)
        if producer_id >= 0:
            if producer_id != meta.producer_id:
                return InitDecision(INVALID_PRODUCER_ID_MAPPING)
            if producer_epoch not in (meta.producer_epoch, meta.last_epoch):
                return InitDecision(fenced)
        return InitDecision(NONE, abort_first=meta.state is TxnState.ONGOING,
                            new_producer_id=meta.producer_epoch >= MAX_EPOCH)

    def initialise(self, transactional_id: str, timeout_ms: int, now_ms: int, new_producer_id: int | None
                   ) -> TransactionMetadata:
        """Give the id its new producer id (``new_producer_id``, epoch 0) or its next epoch; returns the
        metadata to store (state Empty, nothing ongoing)."""
        meta = self.transactions.get(transactional_id)
        if meta is None or new_producer_id is not None:
            if meta is not None:
                self._by_producer.pop(meta.producer_id, None)
            assert new_producer_id is not None
            meta = TransactionMetadata(transactional_id, new_producer_id, 0, timeout_ms)
            self.transactions[transactional_id] = meta
            self._by_producer[new_producer_id] = meta
        else:
            meta.producer_epoch += 1
        meta.last_epoch = -1
        meta.timeout_ms = timeout_ms
        meta.state = TxnState.EMPTY
        meta.partitions, meta.groups = set(), set()
        meta.start_ms, meta.update_ms = -1, now_ms
        return meta

    # -- the transaction's requests ---------------------------------------------------

    def check(self, transactional_id: str, producer_id: int, producer_epoch: int, fenced: int
              ) -> tuple[int, TransactionMetadata | None]:
        """The checks every transactional request makes first: (error, metadata)."""
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING, meta
        if producer_epoch != meta.producer_epoch:
            return fenced, meta
        if meta.state.preparing:
            return CONCURRENT_TRANSACTIONS, meta
        return NONE, meta

    @staticmethod
    def begin_if_needed(meta: TransactionMetadata, now_ms: int) -> None:
        """AddPartitionsToTxn / AddOffsetsToTxn on a transaction not yet ongoing starts one."""
        if meta.state is not TxnState.ONGOING:
            meta.state = TxnState.ONGOING
            meta.partitions, meta.groups = set(), set()
            meta.start_ms = now_ms
        meta.update_ms = now_ms

    def check_produce(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> int:
        """May this transactional batch be appended? (Kafka verifies with the coordinator from
        KIP-890; here the coordinator is in the same process.) INVALID_PRODUCER_EPOCH for an
        older epoch, INVALID_TXN_STATE when the partition is not in an ongoing transaction."""
        return produce_error(self._by_producer.get(producer_id), producer_id, producer_epoch, topic, partition)

    @staticmethod
    def judge_end(meta: TransactionMetadata, commit: bool) -> tuple[int, bool]:
        """Kafka ``handleEndTransaction`` after ``check``: (error, whether to write markers).
        A retry of an EndTxn already done answers NONE again."""
        if meta.state is TxnState.ONGOING:
            return NONE, True
        if (meta.state is TxnState.COMPLETE_COMMIT and commit) or (meta.state is TxnState.COMPLETE_ABORT
                                                                   and not commit):
            return NONE, False
        return INVALID_TXN_STATE, False

    @staticmethod
    def prepare(meta: TransactionMetadata, commit: bool, now_ms: int, bump_epoch: bool = False) -> None:
        """Ongoing -> PrepareCommit/PrepareAbort. ``bump_epoch``: a fence or a timeout aborts with a new
        epoch (its markers fence the old producer on every partition it wrote)."""
        if bump_epoch:
            meta.last_epoch = meta.producer_epoch
            meta.producer_epoch += 1
        meta.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        meta.update_ms = now_ms

    @staticmethod
    def complete(meta: TransactionMetadata, now_ms: int) -> None:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort, once the markers are written."""
        meta.state = TxnState.COMPLETE_COMMIT if meta.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        meta.partitions, meta.groups = set(), set()
        meta.start_ms, meta.update_ms = -1, now_ms

    def expired(self, now_ms: int) -> list[TransactionMetadata]:
        """Ongoing transactions older than their timeout (Kafka ``abortTimedOutTransactions``)."""
        return [m for m in self.transactions.values()
                if m.state is TxnState.ONGOING and m.start_ms >= 0 and now_ms - m.start_ms > m.timeout_ms]

    def preparing(self) -> list[TransactionMetadata]:
        """Transactions whose markers were not all written (found at start: a crash between)."""
        return [m for m in self.transactions.values() if m.state.preparing]
