"""Per-call cost of the produce request path's pieces, in one process (issue 13).

usage: ``PYTHONPATH=TREE python -m pipeline.bench.request_pieces`` (run it
for the old and the new tree alternately: on a shared machine the figures
drift with its load, the ratio between trees much less).

Times one bench request (R=10 records of 64 B, Produce v9, 1050-byte frame)
through each step: cutting frames out of a 90-frame socket read (per frame),
parsing the request header, decoding the Produce body into the handler's
view, validating its records (CRC32C, every record read), and building the
``PartitionAppend`` and ``PartitionResult``. Microseconds per call, the best of
7 repeats. Works on trees without ``apis.decode_produce`` (before issue 13).
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from pipeline.bench.loadgen import LoadSpec, prebuild
from pipeline.network.framing import FrameDecoder
from pipeline.log.batch import PartitionAppend
from pipeline.protocol import apis
from pipeline.protocol.apis import PartitionResult
from pipeline.protocol.header import parse_request_header
from pipeline.protocol.records import validate_records


def measure() -> dict[str, float]:
    """{step: microseconds per call}."""
    spec = LoadSpec(host="127.0.0.1", port=1, connections=1, in_flight=5, records=10, record_bytes=64,
                    partitions=4, acks=0, max_requests=200)
    frames, _bytes, _capped = prebuild(spec, int(time.time() * 1000))
    read = b"".join(frames[0][:90])  # ~94 KB: one 100 KiB socket read of 1050-byte frames
    frame = frames[0][0][4:]
    header = parse_request_header(frame)
    decode = getattr(apis, "decode_produce", None) or (
        lambda h, f: apis.produce_view(apis.decode_request(h, f)))
    part = decode(header, frame).partitions[0]
    records = part.records
    assert records is not None  # prebuild's requests carry records

    def cut() -> None:
        decoder = FrameDecoder()
        decoder.receive_data(read)
        while decoder.next_frame() is not None:
            pass

    def best(fn: Callable[[], object], number: int = 20000, per: int = 1) -> float:
        return min(timeit.repeat(fn, number=number, repeat=7)) / number / per * 1e6

    return {
        "frame cut (per frame)": best(cut, number=300, per=90),
        "parse_request_header": best(lambda: parse_request_header(frame)),
        "produce decode + view": best(lambda: decode(header, frame)),
        "validate_records": best(lambda: validate_records(part.records, 9)),
        "PartitionAppend()": best(lambda: PartitionAppend(part.topic, part.partition, 5, records, 10, 1,
                                                          -1, -1, -1, 1000)),
        "PartitionResult()": best(lambda: PartitionResult(part.topic, part.partition, 0, base_offset=5,
                                                          log_start_offset=0)),
    }


def main() -> int:
    results = measure()
    for name, us in results.items():
        print(f"{name:28s} {us:6.2f} us")
    print(f"{'sum':28s} {sum(results.values()):6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
