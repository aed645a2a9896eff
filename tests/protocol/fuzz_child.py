"""Child process for tests/protocol/test_fuzz_requests.py: run thousands of
hostile frames (mutated requests of every served api version, Produce
requests with mutated records in every codec, random bytes after valid
headers) through the server's request path (``fuzz_corpus.serve``) and exit
0 iff only documented exceptions escaped.

A separate process because the failures it also looks for, a native abort
or segfault in kio, pipeline._records (our C record reader), crc32c or a compression codec,
cannot be caught in the process that suffers them. Usable by hand::

    python -m tests.protocol.fuzz_child --seed 1 --count 100000
    python -m tests.protocol.fuzz_child --seed 1 --seconds 300
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import traceback

from tests.protocol.fuzz_corpus import hostile_request
from tests.protocol.fuzz_corpus import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=5000, help="frames to run (0: until --seconds)")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes: collections.Counter[str] = collections.Counter()
    frames = 0
    while (not args.count or frames < args.count) and (
        not args.seconds or time.monotonic() - started < args.seconds
    ):
        # One generator per frame, so a failure is reproducible from its seed alone.
        frame_seed = args.seed * 1_000_000_007 + frames
        frame = hostile_request(random.Random(frame_seed))
        try:
            outcome = serve(frame)
        except BaseException:
            print(f"FAILED: frame seed {frame_seed} (--seed {args.seed}, frame {frames}): "
                  f"{frame.hex()}", file=sys.stderr)
            traceback.print_exc()
            return 1
        frames += 1
        if outcome.request_error:
            outcomes[outcome.request_error] += 1
        else:
            outcomes["answered"] += 1
            for partition in outcome.partitions or ():
                outcomes[f"records {partition}"] += 1
    elapsed = time.monotonic() - started
    summary = ", ".join(f"{name} {count}" for name, count in sorted(outcomes.items()))
    print(f"ok: {frames} frames in {elapsed:.1f} s, seed {args.seed} ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
