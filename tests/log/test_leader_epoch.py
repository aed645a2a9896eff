"""The current leader epoch check of Fetch and ListOffsets (KIP-320), sans-I/O; served in-process in
tests/log/test_fetch_trio.py, end to end in tests/e2e/test_cluster_metadata.py."""

from __future__ import annotations

from pipeline.log.fetch import NO_LEADER_EPOCH, leader_epoch_error

FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75


def test_an_older_epoch_is_fenced_a_newer_one_unknown_and_minus_1_is_not_checked():
    """Kafka Partition.checkCurrentLeaderEpoch."""
    assert [leader_epoch_error(asked, 3) for asked in (NO_LEADER_EPOCH, 3, 2, 0, 4, 99)] == [
        0, 0, FENCED_LEADER_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH]


def test_with_static_leaders_epoch_0_and_minus_1_pass():
    """Static leaders never move: their epoch is 0, what a client read from Metadata."""
    assert leader_epoch_error(0, 0) == 0 and leader_epoch_error(NO_LEADER_EPOCH, 0) == 0
    assert leader_epoch_error(1, 0) == UNKNOWN_LEADER_EPOCH
