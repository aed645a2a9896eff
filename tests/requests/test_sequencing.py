"""ResponseSequencer and OffsetSequencer: ordering rules, no I/O."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.log.sequencing import OffsetSequencer
from pipeline.network.sequencing import ResponseSequencer, SequencingError


def test_responses_wait_for_earlier_requests():
    seq = ResponseSequencer()
    a, b, c = (seq.register(cid) for cid in (10, 11, 12))
    seq.complete(c, b"C")
    seq.complete(b, b"B")
    assert seq.pop_ready() == []
    seq.complete(a, b"A")
    assert [(r.correlation_id, r.payload) for r in seq.pop_ready()] == [(10, b"A"), (11, b"B"), (12, b"C")]
    assert seq.in_flight == 0


def test_no_response_slot_is_released_in_order():
    seq = ResponseSequencer()
    a, b = seq.register(1), seq.register(2)
    seq.complete(b, b"B")
    seq.complete(a, None)  # acks=0
    assert [(r.correlation_id, r.payload) for r in seq.pop_ready()] == [(1, None), (2, b"B")]


def test_double_or_unknown_completion_raises():
    seq = ResponseSequencer()
    a = seq.register(1)
    seq.complete(a, b"x")
    with pytest.raises(SequencingError):
        seq.complete(a, b"x")
    seq.pop_ready()
    with pytest.raises(SequencingError):
        seq.complete(a, b"x")
    with pytest.raises(SequencingError):
        seq.complete(99, b"x")


@given(st.permutations(list(range(30))), st.integers(1, 30))
def test_any_completion_order_pops_in_request_order(order, pop_every):
    seq = ResponseSequencer()
    tokens = [seq.register(1000 + i) for i in range(30)]
    popped = []
    for n, i in enumerate(order, 1):
        seq.complete(tokens[i], str(i).encode())
        if n % pop_every == 0:
            popped += seq.pop_ready()
    popped += seq.pop_ready()
    assert [r.correlation_id for r in popped] == [1000 + i for i in range(30)]


def test_offsets_are_contiguous_per_partition():
    offsets = OffsetSequencer()
    assert offsets.assign("t", 0, 3) == 0
    assert offsets.assign("t", 1, 2) == 0
    assert offsets.assign("t", 0, 1) == 3
    assert offsets.log_end_offset("t", 0) == 4
    offsets.restore("u", 0, 42)
    assert offsets.assign("u", 0, 1) == 42
    with pytest.raises(ValueError):
        offsets.assign("t", 0, 0)


def test_unordered_mode_releases_in_completion_order():
    seq = ResponseSequencer(ordered=False)
    a, b = seq.register(1), seq.register(2)
    seq.complete(b, b"B")
    assert [r.correlation_id for r in seq.pop_ready()] == [2]
    assert seq.in_flight == 1
    seq.complete(a, b"A")
    assert [r.correlation_id for r in seq.pop_ready()] == [1]
    assert seq.in_flight == 0
