"""decode_produce's fast path (issue 13) against the general path (kio + bounds walk + produce_view).

For every Produce version served, on well-formed frames and on many mutations
of them (truncations, byte flips, varints, nulls, tags, trailing bytes): the
fast path either declines (None) or returns exactly the view the general path
returns, and whenever the general path refuses a frame the fast path declines
it too, so ``decode_produce`` accepts and rejects what it did before.
"""

from __future__ import annotations

import random

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from pipeline.protocol import apis
from pipeline.protocol.errors import InvalidRequestError
from pipeline.protocol.header import parse_request_header
from pipeline.protocol.records import summarize_fields
from tests.protocol.protocol_helpers import make, ms, request_frame, request_module, sample_request

VERSIONS = range(3, 12)


def _general(header, frame):
    try:
        return apis.produce_view(apis.decode_request(header, frame))
    except InvalidRequestError:
        return None


def _fast(header, frame):
    body = apis.produce_body(header, frame)
    if body is None:
        return None
    acks, timeout_ms, transactional_id, partitions = body
    return apis.ProduceRequestView(acks, timeout_ms, transactional_id,
                                   [apis.ProducePartition(*p) for p in partitions])


def _frames(version: int) -> list[bytes]:
    module = request_module(0, version)
    Records = type(sample_request(0, version).topic_data[0].partition_data[0].records)
    frames = [request_frame(sample_request(0, version)), request_frame(sample_request(0, version, records=b""))]
    frames.append(request_frame(make(module.ProduceRequest, transactional_id="tx-é", acks=0, timeout=ms(-5),
                                     topic_data=())))
    frames.append(request_frame(make(
        module.ProduceRequest, transactional_id=None, acks=1, timeout=ms(1500),
        topic_data=(module.TopicProduceData(name="t" * 200, partition_data=tuple(
            module.PartitionProduceData(index=i, records=Records(bytes([i]) * (i * 50))) for i in range(5))),))))
    return frames


@pytest.mark.parametrize("version", VERSIONS)
def test_well_formed_frames_take_the_fast_path(version: int) -> None:
    for frame in _frames(version):
        header = parse_request_header(frame)
        view = _fast(header, frame)
        assert view is not None
        assert view == _general(header, frame)
        assert apis.decode_produce(header, frame) == view
        assert apis.decode_produce(header, frame + b"\x00\x01trailing") == view


def _mutants(rng: random.Random, base: bytes, body_at: int, count: int, max_flips: int, cut_step: int = 1,
             ) -> list[bytes]:
    """``base`` cut after each ``cut_step``-th body byte, then ``count`` copies with 1..``max_flips``
    body bytes set to edge values (0, 1, 0x7F, 0x80, 0xFF) or random ones."""
    mutants = [base[:cut] for cut in range(body_at, len(base), cut_step)]
    for _ in range(count):
        m = bytearray(base)
        for _ in range(rng.randint(1, max_flips)):
            i = rng.randrange(body_at, len(m))
            m[i] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        mutants.append(bytes(m))
    return mutants


@pytest.mark.parametrize("version", VERSIONS)
def test_mutations_never_change_the_outcome(version: int) -> None:
    rng = random.Random(version)
    for base in _frames(version):
        header = parse_request_header(base)
        for mutant in _mutants(rng, base, header.body_offset, 400, 3):
            fast = _fast(header, mutant)
            general = _general(header, mutant)
            if fast is not None:
                assert fast == general, mutant
            if general is None:
                assert fast is None


def test_tagged_fields_and_memoryview_frames_go_to_the_general_path() -> None:
    frame = request_frame(sample_request(0, 9))
    header = parse_request_header(frame)
    # the request's tagged-field count is the last byte of the body
    assert frame[-1] == 0
    tagged = frame[:-1] + b"\x01\x05\x01z"
    assert _fast(header, tagged) is None
    view = _general(header, frame)
    assert apis.decode_produce(header, memoryview(frame)) == view  # general path, same view


@pytest.mark.parametrize("version", VERSIONS)
def test_a_bytearray_frame_takes_the_fast_path_and_its_records_come_out_as_bytes(version: int) -> None:
    # Large frames arrive in their own receive buffer (framing.LARGE_FRAME_BYTES): a bytearray.
    for frame in _frames(version):
        header = parse_request_header(frame)
        buffer = bytearray(frame)
        view = apis.decode_produce(header, buffer)
        assert view == _general(header, frame)
        records = [p.records for p in view.partitions if p.records is not None]
        assert all(type(r) is bytes for r in records)
        buffer[header.body_offset:] = bytes(len(buffer) - header.body_offset)  # the buffer is reused or freed
        assert records == [p.records for p in _general(header, frame).partitions if p.records is not None]


# ------------------------------------------------------------- plain_produce_body


def _plain_expected(header, frame):
    """What ``plain_produce_body`` must return: ``produce_body`` and ``summarize_fields`` of each
    partition, under the handler's conditions for a plain request."""
    body = apis.produce_body(header, frame)
    if body is None:
        return None
    acks, timeout_ms, transactional_id, partitions = body
    if transactional_id is not None or acks not in (0, 1, -1) or not partitions:
        return None
    parts = []
    for topic, partition, records in partitions:
        if not records:
            return None
        summary = summarize_fields(records)
        if summary is None or summary[2] != -1 or summary[6]:
            return None
        parts.append((topic, partition, records, summary[0], summary[8]))
    return acks, timeout_ms, parts


def _batch(producer_id: int = -1, transactional: bool = False, records: int = 3) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=int(transactional),
                                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * (10 * i), headers=[])
    return bytes(builder.build())


def _plain_frames(version: int) -> list[bytes]:
    module = request_module(0, version)
    Records = type(sample_request(0, version).topic_data[0].partition_data[0].records)

    def produce(*topics, acks=1, transactional_id=None):
        return request_frame(make(module.ProduceRequest, transactional_id=transactional_id, acks=acks,
                                  timeout=ms(1500), topic_data=tuple(
            module.TopicProduceData(name=name, partition_data=tuple(
                module.PartitionProduceData(index=i, records=None if r is None else Records(r))
                for i, r in parts)) for name, parts in topics)))

    two = _batch() + _batch(records=1)
    return [
        produce(("events", [(0, _batch())])),
        produce(("events", [(0, _batch()), (2, two)]), ("audit", [(1, _batch(records=7))]), acks=-1),
        produce(("events", [(0, _batch())]), acks=0),
        produce(("events", [(0, _batch())]), acks=2),  # not a valid acks: declined
        produce(("events", [(0, _batch())]), transactional_id="tx"),  # declined
        produce(("events", [(0, _batch(producer_id=7))])),  # idempotent: declined
        produce(("events", [(0, _batch(producer_id=7, transactional=True))])),  # declined
        produce(("events", [(0, None)])),  # null records: declined
        produce(("events", [(0, b"")])),  # empty records: declined
        produce(),  # no partition: declined
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_plain_produce_body_is_produce_body_and_summarize_of_each_partition(version: int) -> None:
    rng = random.Random(1000 + version)
    accepted = 0
    for base in _plain_frames(version):
        header = parse_request_header(base)
        mutants = [base, bytearray(base), base + b"\x00trailing"]
        for mutant in mutants + _mutants(rng, base, header.body_offset, 150, 2, cut_step=3):
            got = apis.plain_produce_body(header, mutant)
            assert got == _plain_expected(header, mutant), bytes(mutant)
            accepted += got is not None
    assert accepted >= 3  # the three plain frames, at least
    first = _plain_frames(version)[0]
    assert apis.plain_produce_body(parse_request_header(first), first) is not None
    assert apis.plain_produce_body(parse_request_header(first), memoryview(first)) is None  # the general path's


def test_plain_produce_run_takes_what_plain_produce_body_takes_while_every_partition_is_checked() -> None:
    """The handler's run in one C call (``plain_produce_run``): a request is taken, as
    ``plain_produce_body`` reads it, with its deadline and ``dequeued_at``, while its body is
    plain and each of its partitions is True in the run's memo; it stops at the first other."""
    from pipeline.network.request_channel import Request

    frames = _plain_frames(9)
    plain, two_partitions, acks0, bad_acks = frames[0], frames[1], frames[2], frames[3]

    def request(frame: bytes | bytearray | memoryview, received_at: float = 10.0) -> Request:
        return Request(None, parse_request_header(bytes(frame)), frame, 0, received_at)  # type: ignore[arg-type]

    checked = {("events", 0): True, ("events", 2): True, ("audit", 1): True}
    requests = [request(plain), request(bytearray(acks0), 11.5), request(two_partitions), request(bad_acks),
                request(plain)]
    plains, end = apis.plain_produce_run(requests, 0, checked, 99.0, 1000)
    assert end == 3 and [p[0] for p in plains] == requests[:3]
    for (req, acks, deadline, parts), frame in zip(plains, (plain, acks0, two_partitions)):
        want_acks, timeout_ms, want_parts = apis.plain_produce_body(req.header, frame)
        assert (acks, parts) == (want_acks, want_parts)
        assert deadline == req.received_at + max(timeout_ms, 1000) / 1000.0
        assert req.dequeued_at == 99.0
    assert requests[3].dequeued_at == -1.0  # left to the Python path
    assert apis.plain_produce_run(requests, 4, checked, 99.0, 1000)[1] == 5
    # A partition not checked yet, or checked False, leaves the request to plain_produce.
    assert apis.plain_produce_run(requests, 2, {("events", 0): True, ("events", 2): True}, 0.0, 1000) == ([], 2)
    assert apis.plain_produce_run(requests, 0, {("events", 0): False}, 0.0, 1000) == ([], 0)
    # Not a plain body, not Produce, or a frame that is no bytes: left too.
    assert apis.plain_produce_run([request(frames[5])], 0, checked, 0.0, 1000) == ([], 0)  # idempotent
    metadata = request(request_frame(sample_request(3, 12)))
    assert apis.plain_produce_run([metadata], 0, checked, 0.0, 1000) == ([], 0)
    assert apis.plain_produce_run([request(memoryview(plain))], 0, checked, 0.0, 1000) == ([], 0)
