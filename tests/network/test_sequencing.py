"""ResponseSequencer: ordering rules, no I/O."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_unordered_mode_releases_in_completion_order():
    seq = ResponseSequencer(ordered=False)
    a, b = seq.register(1), seq.register(2)
    seq.complete(b, b"B")
    assert [r.correlation_id for r in seq.pop_ready()] == [2]
    assert seq.in_flight == 1
    seq.complete(a, b"A")
    assert [r.correlation_id for r in seq.pop_ready()] == [1]
    assert seq.in_flight == 0


@pytest.mark.parametrize("ordered", [True, False])
@given(data=st.data())
def test_popping_unanswered_slots_first_changes_nothing_but_who_pops_them(ordered, data):
    """``pop_unanswered`` then ``pop_ready``, at any points, release the same tokens in the same
    order as ``pop_ready`` alone; it only takes no-response slots."""
    payloads = data.draw(st.lists(st.sampled_from([None, b"r"]), min_size=1, max_size=12))
    completion = data.draw(st.permutations(range(len(payloads))))
    unanswered_at = data.draw(st.lists(st.booleans(), min_size=len(payloads), max_size=len(payloads)))
    ready_at = data.draw(st.lists(st.booleans(), min_size=len(payloads), max_size=len(payloads)))

    def run(interleave: bool) -> list[tuple[int, bytes | None]]:
        seq = ResponseSequencer(ordered=ordered)
        tokens = [seq.register(i) for i in range(len(payloads))]
        out: list[tuple[int, bytes | None]] = []
        for n, i in enumerate(completion):
            seq.complete(tokens[i], payloads[i])
            if interleave and unanswered_at[n]:
                freed = seq.pop_unanswered()
                assert all(payloads[t] is None for t in freed)
                out += [(t, None) for t in freed]
            if ready_at[n]:
                has_ready = seq.has_ready()
                ready = seq.pop_ready()
                assert has_ready == bool(ready)
                out += [(r.token, r.payload) for r in ready]
        out += [(r.token, r.payload) for r in seq.pop_ready()]
        assert seq.in_flight == 0 and not seq.has_ready()
        return out

    assert run(True) == run(False)


def test_pop_unanswered_stops_at_a_response_or_an_incomplete_request():
    seq = ResponseSequencer()
    a, b, c, d = (seq.register(i) for i in range(4))
    seq.complete(b, None)
    assert seq.pop_unanswered() == [] and not seq.has_ready()  # a is not complete
    seq.complete(a, None)
    seq.complete(d, None)
    assert seq.pop_unanswered() == [a, b] and seq.in_flight == 2  # c is not complete: d waits
    seq.complete(c, b"response")
    assert seq.pop_unanswered() == [] and seq.has_ready()  # c has a response: the writer's
    assert [(r.token, r.payload) for r in seq.pop_ready()] == [(c, b"response"), (d, None)]


@pytest.mark.parametrize("ordered", [True, False])
@given(data=st.data())
def test_registering_and_completing_in_batches_is_one_at_a_time(ordered, data):
    """``register_all`` and ``complete_unanswered`` (the read path's and the acks=0 handler's
    batches) leave the sequencer as ``register`` and ``complete(token, None)`` one by one do."""
    cids = data.draw(st.lists(st.integers(-5, 1 << 31), min_size=1, max_size=12))
    payloads = data.draw(st.lists(st.sampled_from([None, b"r"]), min_size=len(cids), max_size=len(cids)))
    completion = data.draw(st.permutations(range(len(cids))))
    cut = data.draw(st.integers(0, len(cids)))

    def run(batched: bool) -> list[tuple[int, int, bytes | None]]:
        seq = ResponseSequencer(ordered=ordered)
        if batched:
            seq.register_all(cids[:cut])
            seq.register_all(cids[cut:])
        else:
            for cid in cids:
                seq.register(cid)
        assert seq.next_token == len(cids) and seq.in_flight == len(cids)
        out: list[tuple[int, int, bytes | None]] = []
        unanswered: list[int] = []
        for i in completion:
            if payloads[i] is None and batched:
                unanswered.append(i)
                continue
            seq.complete_unanswered(unanswered)
            unanswered = []
            seq.complete(i, payloads[i])
            out += [(r.token, r.correlation_id, r.payload) for r in seq.pop_ready()]
        seq.complete_unanswered(unanswered)
        out += [(r.token, r.correlation_id, r.payload) for r in seq.pop_ready()]
        assert seq.in_flight == 0
        return out

    assert run(True) == run(False)


def test_complete_unanswered_refuses_a_token_not_in_flight_after_completing_those_before_it():
    seq = ResponseSequencer()
    a, b = seq.register(1), seq.register(2)
    seq.complete(b, None)
    with pytest.raises(SequencingError):
        seq.complete_unanswered([a, b])
    with pytest.raises(SequencingError):
        seq.complete_unanswered([7])
    assert seq.pop_unanswered() == [a, b]


@pytest.mark.parametrize("ordered", [True, False])
@given(data=st.data())
def test_the_writers_pop_is_pop_ready_without_its_objects(ordered, data):
    """``pop_ready_payloads`` takes what ``pop_ready`` would: the same tokens in the same order,
    and their payloads (no-response ones left out)."""
    payloads = data.draw(st.lists(st.sampled_from([None, b"a", b"bb"]), min_size=1, max_size=12))
    completion = data.draw(st.permutations(range(len(payloads))))
    pop_at = data.draw(st.lists(st.booleans(), min_size=len(payloads), max_size=len(payloads)))
    sequencers = [ResponseSequencer(ordered=ordered) for _ in range(2)]
    for seq in sequencers:
        for i in range(len(payloads)):
            seq.register(100 + i)
    for n, i in enumerate(completion):
        for seq in sequencers:
            seq.complete(i, payloads[i])
        if pop_at[n] or n == len(completion) - 1:
            ready = sequencers[0].pop_ready()
            tokens, sent = sequencers[1].pop_ready_payloads()
            assert tokens == [r.token for r in ready]
            assert sent == [r.payload for r in ready if r.payload is not None]
    assert sequencers[1].in_flight == 0 and not sequencers[1].has_ready()
