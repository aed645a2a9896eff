"""RequestMetrics: stage times, request and error counts, as plain function calls (no clock, no network)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.network.request_metrics import BUCKET_BOUNDS_MS, STAGES, RequestMetrics, add_error

PRODUCE, API_VERSIONS = 0, 18
QUEUE, LOCAL, REMOTE, RESPONSE_QUEUE, SEND, TOTAL = range(6)


def bucket_of(ms: float) -> int:
    """Index of the bucket ``ms`` must land in: the first bound at or above it (the last bucket: +Inf)."""
    return next((i for i, bound in enumerate(BUCKET_BOUNDS_MS) if ms <= bound), len(BUCKET_BOUNDS_MS))


def only_bucket(buckets: list[int]) -> int:
    """The index of the one non-empty bucket, asserting there is exactly one value."""
    assert sum(buckets) == 1, buckets
    return next(i for i, count in enumerate(buckets) if count)


def test_each_stage_is_the_time_between_two_stamps():
    m = RequestMetrics()
    # read at 10 s; taken after 2 ms; handled in 0.8 ms; durable 47.2 ms later;
    # taken by the writer 1.2 ms later; written in 0.4 ms (no time on a bucket bound:
    # float differences of the stamps would put it on either side)
    m.record(PRODUCE, 9, 10.0, 10.002, 10.0028, 10.050, 10.0512, 10.0516)
    api = m.apis[PRODUCE]
    expected_ms = {QUEUE: 2.0, LOCAL: 0.8, REMOTE: 47.2, RESPONSE_QUEUE: 1.2, SEND: 0.4, TOTAL: 51.6}
    for stage, ms in expected_ms.items():
        assert api.sums_ms[stage] == pytest.approx(ms, abs=1e-6), STAGES[stage]
        assert only_bucket(api.buckets[stage]) == bucket_of(ms), STAGES[stage]
    assert api.sums_ms[TOTAL] == pytest.approx(sum(api.sums_ms[:TOTAL]))
    assert api.requests == {9: 1}
    assert api.errors == {}


def test_a_time_on_a_bound_counts_under_that_bound():
    m = RequestMetrics()
    m.record(PRODUCE, 9, 0.0, 0.001, 0.001, 0.001, 0.001, 0.001)  # queue time exactly 1 ms
    queue = m.apis[PRODUCE].buckets[QUEUE]
    assert only_bucket(queue) == BUCKET_BOUNDS_MS.index(1.0)


def test_a_response_complete_before_the_handler_finished_has_no_remote_time():
    """Kafka: apiLocalCompleteTimeNanos takes the response time when the response comes first."""
    m = RequestMetrics()
    # ApiVersions answered inside the handler at 5.004; the handler returned at 5.006
    m.record(API_VERSIONS, 3, 5.0, 5.001, 5.006, 5.004, 5.010, 5.011)
    api = m.apis[API_VERSIONS]
    assert api.sums_ms[LOCAL] == pytest.approx(3.0)
    assert api.sums_ms[REMOTE] == 0.0
    assert api.sums_ms[TOTAL] == pytest.approx(11.0)
    assert api.sums_ms[TOTAL] == pytest.approx(sum(api.sums_ms[:TOTAL]))


def test_unknown_stamps_fall_back_to_their_neighbours():
    """A request no RequestHandler took (a test's scripted handler) has no dequeue or local time."""
    m = RequestMetrics()
    m.record(PRODUCE, 9, 1.0, -1.0, -1.0, 1.010, 1.012, 1.013)
    api = m.apis[PRODUCE]
    assert api.sums_ms[QUEUE] == 0.0
    assert api.sums_ms[LOCAL] == pytest.approx(10.0)  # received -> response
    assert api.sums_ms[REMOTE] == 0.0
    assert api.sums_ms[TOTAL] == pytest.approx(13.0)


def test_clock_readings_out_of_order_count_as_zero_not_negative():
    m = RequestMetrics()
    m.record(PRODUCE, 9, 2.0, 1.999, 2.001, 2.002, 2.002, 2.002)
    api = m.apis[PRODUCE]
    assert api.sums_ms[QUEUE] == 0.0
    assert only_bucket(api.buckets[QUEUE]) == 0
    assert min(api.sums_ms) >= 0.0


def test_times_past_the_last_bound_land_in_the_inf_bucket():
    m = RequestMetrics()
    m.record(PRODUCE, 9, 0.0, 0.0, 0.0, 120.0, 120.0, 120.0)  # two minutes waiting for durability
    api = m.apis[PRODUCE]
    assert only_bucket(api.buckets[REMOTE]) == len(BUCKET_BOUNDS_MS)
    assert api.sums_ms[REMOTE] == pytest.approx(120_000.0)


def test_requests_are_counted_per_api_and_version_and_errors_per_code():
    m = RequestMetrics()
    for version in (9, 9, 7):
        m.record(PRODUCE, version, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    m.record(API_VERSIONS, 3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    add_error(m.errors(PRODUCE), 0, 5)
    add_error(m.errors(PRODUCE), 3)
    add_error(m.errors(PRODUCE), 3)
    assert m.apis[PRODUCE].requests == {9: 2, 7: 1}
    assert m.apis[API_VERSIONS].requests == {3: 1}
    assert m.apis[PRODUCE].errors == {0: 5, 3: 2}
    assert [sum(b) for b in m.apis[PRODUCE].buckets] == [3] * len(STAGES)


def _reference_record(buckets: list[list[int]], sums: list[float], received: float, dequeued: float,
                      local_done: float, response_complete: float, response_dequeued: float, sent: float) -> None:
    """The stage rules of ``RequestMetrics.record`` written out in Python (its C body's reference)."""
    from bisect import bisect_left

    if dequeued < 0:
        dequeued = received
    if response_complete < 0:
        response_complete = response_dequeued
    if local_done < 0 or response_complete < local_done:
        local_done = response_complete
    for stage, seconds in enumerate((dequeued - received, local_done - dequeued, response_complete - local_done,
                                     response_dequeued - response_complete, sent - response_dequeued,
                                     sent - received)):
        ms = seconds * 1000.0 if seconds > 0 else 0.0
        buckets[stage][bisect_left(BUCKET_BOUNDS_MS, ms)] += 1
        sums[stage] += ms


_times = st.one_of(st.floats(-1.0, 100.0, allow_nan=False), st.sampled_from([-1.0, 0.0, 0.0001, 0.06, 60.0]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(*[_times] * 6), min_size=1, max_size=20))
def test_the_c_stage_recording_is_the_python_rules(calls):
    m = RequestMetrics()
    buckets = [[0] * (len(BUCKET_BOUNDS_MS) + 1) for _ in STAGES]
    sums = [0.0] * len(STAGES)
    for times in calls:
        m.record(PRODUCE, 9, *times)
        _reference_record(buckets, sums, *times)
    api = m.apis[PRODUCE]
    assert api.buckets == buckets
    assert api.sums_ms == pytest.approx(sums)
    assert api.requests == {9: len(calls)}


def test_the_c_stage_recording_refuses_lists_of_the_wrong_shape():
    from pipeline._stages import record

    good = [[0] * (len(BUCKET_BOUNDS_MS) + 1) for _ in STAGES]
    with pytest.raises(TypeError):
        record(good[:5], [0.0] * 6, BUCKET_BOUNDS_MS, 0, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        record([[0]] * 6, [0.0] * 6, BUCKET_BOUNDS_MS, 0, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError):
        record(good, [0.0] * 6, (1, 2), 0, 0, 0, 0, 0, 0)


@settings(max_examples=100, deadline=None)
@given(st.tuples(*[_times] * 6), st.integers(1, 50))
def test_a_count_of_responses_with_the_same_times_is_that_many_records(times, count):
    """``record(..., count)`` (the writer's requests of one run) is ``count`` single records."""
    once, many = RequestMetrics(), RequestMetrics()
    for _ in range(count):
        once.record(PRODUCE, 9, *times)
    many.record(PRODUCE, 9, *times, count)
    assert many.apis[PRODUCE].buckets == once.apis[PRODUCE].buckets
    assert many.apis[PRODUCE].sums_ms == pytest.approx(once.apis[PRODUCE].sums_ms)
    assert many.apis[PRODUCE].requests == once.apis[PRODUCE].requests == {9: count}
    with pytest.raises(ValueError):
        many.record(PRODUCE, 9, *times, 0)
