"""No C stage is bypassed on a plain produce (``pipeline.native``'s per-stage counters).

Plain Produce requests (no transactional id, a producer that is not idempotent, uncompressed
valid records) go through the server's own front end in-process (KafkaChannel over memory
streams, MultiQueueRequestChannel, RequestHandler/KafkaApis, BatchingPersister and its WAL;
``tests/requests/test_handler_trio.broker``). Every stage with a C path must have run in C and
none of them may have fallen back to Python: a renamed field, a changed guard or a swallowed
exception that turns a fast path off fails here. An exception from C is no fallback either: the
requests fail loudly (logged, connection closed), and no Python path takes them.
"""

from __future__ import annotations

import logging

import pytest
import trio

from pipeline import native
from tests.requests.test_handler_trio import broker, eventually, partition_result, produce

RUN_STAGES = (native.FRAME_CUT, native.PLAIN_PRODUCE, native.PLAIN_RUN, native.STAGE_METRICS)
"""The stages of a plain produce when handlers take Produce requests in runs (the default)."""
ONE_BY_ONE_STAGES = (native.FRAME_CUT, native.PRODUCE_BODY, native.RECORDS_SUMMARY, native.STAGE_METRICS)
"""The stages of a plain produce handled one request at a time (``yield_before_sequencing``)."""
LIMIT_S = 20
"""Real seconds a test may take (each takes well under one): trio's real clock, since the
persister's worker threads let an autojump clock run any timeout out."""


TABLE_STAGES = (native.AVRO_COLUMNS,)
"""Stages of the table side, not of a produce: tests/table/test_avro_columns.py fails when the bench's
Avro records leave AVRO_COLUMNS' C path."""


def test_the_two_paths_cover_every_stage() -> None:
    assert {s.name for s in RUN_STAGES + ONE_BY_ONE_STAGES + TABLE_STAGES} == {s.name for s in native.STAGES}


async def _produce_read(tmp_path, *, one_by_one: bool) -> None:
    """Four plain Produce requests in one read, after one that teaches the frame cut's header table
    Produce (the first frame of an api key takes the Python header parser, by design)."""
    with trio.fail_after(LIMIT_S):  # a bypass fails the test: it never hangs it
        await _produce_read_within(tmp_path, one_by_one)


async def _produce_read_within(tmp_path, one_by_one: bool) -> None:
    async with broker(tmp_path) as b:
        b.apis.yield_before_sequencing = one_by_one
        client, _ = await b.connect()
        await client.send(produce(1, [b"first"], acks=1))
        await client.wait_responses(1)
        native.reset_counts()
        await client.send(b"".join(produce(c, [b"v%d" % c, b"w"], acks=1) for c in range(2, 6)))
        await client.wait_responses(5)
        assert [partition_result(body) for _, body in client.responses] == [(0, o) for o in (0, 1, 3, 5, 7)]
        await eventually(lambda: native.STAGE_METRICS.native >= 1)  # recorded after the response is written
        await eventually(lambda: len(b.sink.rows()) == 9)


@pytest.mark.trio
@pytest.mark.parametrize("one_by_one", [False, True], ids=["runs", "one-by-one"])
async def test_a_plain_produce_takes_every_c_stage_and_no_python_path(tmp_path, one_by_one) -> None:
    await _produce_read(tmp_path, one_by_one=one_by_one)
    counts = native.counts()
    for stage in ONE_BY_ONE_STAGES if one_by_one else RUN_STAGES:
        assert stage.native >= 1, (stage.name, counts)
    assert native.FRAME_CUT.native == 4, counts  # the whole read in C
    assert all(python == 0 for _, python in counts.values()), counts
    if not one_by_one:
        # the first request of the read starts the run (PLAIN_PRODUCE), the C run takes the rest
        assert (native.PLAIN_PRODUCE.native, native.PLAIN_RUN.native) == (1, 3), counts


@pytest.mark.trio
async def test_an_exception_from_c_fails_the_requests_loudly_with_no_fallback(tmp_path, monkeypatch, caplog) -> None:
    """The C run raising (a bug, never bad input) is not taken as "not plain": the requests it
    concerned fail as any handler error does (logged with its traceback, the connection closed),
    and the one-by-one Python path never sees them."""
    with trio.fail_after(LIMIT_S):
        await _fail_within(tmp_path, monkeypatch, caplog)


async def _fail_within(tmp_path, monkeypatch, caplog) -> None:
    def broken(*args: object) -> object:
        raise RuntimeError("the C run failed")

    async with broker(tmp_path) as b:
        client, channel = await b.connect()
        await client.send(produce(1, [b"first"], acks=1))
        await client.wait_responses(1)
        native.reset_counts()
        monkeypatch.setattr(native, "_plain_run", broken)
        with caplog.at_level(logging.ERROR, logger="pipeline.requests.handler"):
            await client.send(b"".join(produce(c, [b"v"], acks=1) for c in range(2, 5)))
            await eventually(lambda: channel.close_reason is not None)
        assert any(r.exc_info and "the C run failed" in str(r.exc_info[1]) for r in caplog.records)
        await client.wait_responses(2)  # the first, and the run's first request (read before the C run)
        assert channel.close_reason == "internal error while handling a request"
        assert all(python == 0 for _, python in native.counts().values()), native.counts()
