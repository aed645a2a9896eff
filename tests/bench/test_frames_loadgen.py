"""Pre-built request frames, and the load generator against the echo ceiling server."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from kafka.record.default_records import DefaultRecordBatch

from pipeline.bench import frames as fr
from pipeline.bench.echo import replies_for
from pipeline.bench.loadgen import LoadSpec, prebuild, run, split_requests
from pipeline.protocol.apis import decode_request, produce_view
from pipeline.protocol.header import parse_request_header
from pipeline.protocol.records import validate_records


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_patched_frames_are_valid_produce_requests_naming_their_records(version):
    shape = fr.RequestShape("bench-t", records=7, record_bytes=33, acks=-1, version=version)
    template = fr.FrameTemplate(shape, conn=12, partition=3, timestamp_ms=1_700_000_000_000)
    for req in (0, 1, 4321, 99_999_999):
        frame = template.frame(req)
        assert len(frame) == template.size
        body = frame[4:]
        header = parse_request_header(body)
        assert header.api_version == version and header.correlation_id == req == fr.correlation_id_of(frame)
        (part,) = produce_view(decode_request(header, body)).partitions
        assert (part.topic, part.partition) == ("bench-t", 3)
        assert validate_records(part.records).record_count == 7  # checks the patched CRC32C
        batch = DefaultRecordBatch(part.records)
        assert batch.validate_crc()
        assert [fr.parse_record_key(r.key) for r in batch] == [(12, req, i) for i in range(7)]
        assert all(r.value == b"v" * 33 for r in DefaultRecordBatch(part.records))


def test_record_keys_round_trip_and_reject_foreign_keys():
    assert fr.parse_record_key(fr.record_key(9999, 12345678, 42)) == (9999, 12345678, 42)
    assert len(fr.record_key(1, 2, 3)) == fr.KEY_BYTES
    for bad in (None, b"", b"hello", b"c0001r00000001i0001x"):
        with pytest.raises(ValueError):
            fr.parse_record_key(bad)
    with pytest.raises(ValueError):
        fr.FrameTemplate(fr.RequestShape("t", 1, 1), conn=10_000, partition=0, timestamp_ms=0)


def test_prebuild_splits_requests_and_respects_the_memory_bound():
    assert split_requests(10, 3) == [4, 3, 3]
    spec = LoadSpec("127.0.0.1", 1, connections=3, max_requests=10, partitions=2)
    frames, size, capped = prebuild(spec, 0)
    assert [len(f) for f in frames] == [4, 3, 3] and not capped
    capped_spec = LoadSpec("127.0.0.1", 1, connections=2, max_requests=1000, max_prebuilt_bytes=20 * size)
    frames, _, capped = prebuild(capped_spec, 0)
    assert sum(map(len, frames)) == 20 and capped


def test_load_spec_refuses_other_hosts_and_unbounded_runs():
    with pytest.raises(ValueError):
        LoadSpec("10.0.0.1", 9092)
    with pytest.raises(ValueError):
        LoadSpec("127.0.0.1", 9092, duration_s=0)
    with pytest.raises(ValueError):
        LoadSpec("127.0.0.1", 9092, max_requests=0)


def test_echo_replies_carry_correlation_ids_in_order():
    frames = [fr.FrameTemplate(fr.RequestShape("t", 1, 1), 0, 0, 0).frame(n)[4:] for n in (5, 6)]
    out = replies_for(frames)
    assert len(out) == 2 * 52  # size prefix + 48 bytes, like a one-partition Produce v9 response
    assert [int.from_bytes(out[i * 52:i * 52 + 4], "big") for i in (0, 1)] == [48, 48]
    assert [int.from_bytes(out[i * 52 + 4:i * 52 + 8], "big") for i in (0, 1)] == [5, 6]


def test_loadgen_against_the_echo_server_is_bounded_and_ordered():
    echo = subprocess.Popen([sys.executable, "-m", "pipeline.bench.echo"], stdout=subprocess.PIPE, text=True)
    try:
        line = echo.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        spec = LoadSpec("127.0.0.1", port, protocol="echo", connections=3, in_flight=4, max_requests=3000,
                        duration_s=20)
        result = run(spec, out=io.StringIO())
    finally:
        echo.terminate()
        echo.wait(10)
    assert result["stopped_by"] == "count" and not result["timed_out"]
    assert result["sent"] == result["completed"] == 3000
    for conn in result["connections"]:
        assert [r[0] for r in conn["responses"]] == list(range(1000))
    assert result["latency_hdr"]
