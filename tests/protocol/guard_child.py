"""Child process for tests/protocol/test_protocol_guard.py: decode thousands
of hostile request bodies per served request wire format (the first served
version of each, ``protocol_helpers.one_per_wire_format``) and exit 0 iff
every one either decoded or raised InvalidRequestError.

It runs in a subprocess because the failure it looks for, kio's native
reader aborting the process on a huge length (SIGABRT), cannot be caught in
the process that suffers it. Usable by hand::

    python -m tests.protocol.guard_child --seed 1 --count 3000
"""

from __future__ import annotations

import argparse
import random
import struct
import sys

from pipeline.protocol import InvalidRequestError
from pipeline.protocol import decode_request
from pipeline.protocol import parse_request_header
from tests.protocol.protocol_helpers import one_per_wire_format
from tests.protocol.protocol_helpers import request_frame
from tests.protocol.protocol_helpers import sample_request
from tests.protocol.protocol_helpers import served_versions

# Length-like values that reach kio's allocations: max int32, -2, huge
# uvarints (5 bytes), null markers.
_HOSTILE_FIELDS = (
    struct.pack(">i", 0x7FFFFFFF),
    struct.pack(">i", 0x10000000),
    struct.pack(">i", -2),
    struct.pack(">h", 0x7FFF),
    b"\xff\xff\xff\xff\x0f",
    b"\x9b\xde\xe5\xbb\x32",
    b"\xff\xff\xff\x7f",
    b"\x80\x80\x80\x80\x08",
    b"\xff",
    b"\x00",
)


def hostile_bodies(rng: random.Random, valid_body: bytes, count: int) -> list[bytes]:
    """``count`` bodies: a third random bytes, a third the valid body with
    bytes overwritten, a third the valid body with a length-like value
    spliced in (then maybe cut)."""
    bodies = []
    for n in range(count):
        kind = n % 3
        if kind == 0:
            bodies.append(rng.randbytes(rng.randint(0, 60)))
            continue
        body = bytearray(valid_body)
        if kind == 1:
            for _ in range(rng.randint(1, 4)):
                if body:
                    value = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.getrandbits(8)))
                    body[rng.randrange(len(body))] = value
        else:
            position = rng.randint(0, len(body))
            field = rng.choice(_HOSTILE_FIELDS)
            if rng.random() < 0.5:
                body[position : position + len(field)] = field  # overwrite
            else:
                body[position:position] = field  # insert
            if rng.random() < 0.3:
                del body[rng.randint(0, len(body)) :]
        bodies.append(bytes(body))
    return bodies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=3000, help="bodies per request wire format")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    frames = 0
    formats = one_per_wire_format(served_versions())
    for api_key, version in formats:
        valid = request_frame(sample_request(api_key, version))
        header_size = parse_request_header(valid).body_offset
        header_bytes, valid_body = valid[:header_size], valid[header_size:]
        for body in hostile_bodies(rng, valid_body, args.count):
            frame = header_bytes + body
            header = parse_request_header(frame)
            try:
                decode_request(header, frame)
            except InvalidRequestError:
                pass
            frames += 1
    print(f"ok: {frames} frames, {len(formats)} wire formats, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
