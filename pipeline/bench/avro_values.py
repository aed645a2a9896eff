"""Registry-framed Avro record values for the sustained bench's typed phase (``--value-format avro``).

A producer of a typed topic sends what Confluent's ``AvroSerializer`` sends: magic
byte 0, the 4-byte big-endian schema id, then the record in Avro binary (no container
header). The record (``AVRO_SCHEMA``) is a page view of 16 fields of mixed types
(strings, longs, doubles, an int, a boolean, a ``timestamp-millis``, an optional
string) whose last field, ``payload``, pads the value to exactly ``record_bytes``.

The generator must cost the producer little: fastavro's ``schemaless_writer`` takes
~12 us per 1 KiB record on the 2-core dev machine, as much as librdkafka's whole
per-record cost here. So fastavro encodes ``POOL`` records with an empty ``payload``
once, before the load; a value is then one of them (framed, the empty payload's
length byte dropped) + the payload's length (Avro zigzag varint) + ``payload``
characters sliced from a 16 MiB random hex buffer, consecutive slices as
``naive_spark.RandomValues`` takes them: every value is a valid Avro record,
distinct from every other within 16 MiB, whose payload neither Parquet's
dictionary nor snappy compresses much (hex: 4 bits per byte).
"""

from __future__ import annotations

import io
import os
import random
from typing import Any

WIRE_MAGIC = b"\x00"

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "PageView", "namespace": "pipeline.bench",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "user_id", "type": "long"},
        {"name": "session_id", "type": "string"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page_url", "type": "string"},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "user_agent", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "duration_ms", "type": "long"},
        {"name": "scroll_depth", "type": "double"},
        {"name": "latitude", "type": "double"},
        {"name": "longitude", "type": "double"},
        {"name": "price", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "is_mobile", "type": "boolean"},
        {"name": "payload", "type": "string"},
    ],
}
"""The typed phase's writer schema, registered under ``<topic>-value`` (the table's columns)."""

POOL = 4096
"""Records fastavro encodes up front (all fields but ``payload`` vary between them)."""

_AGENTS = ["Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0",
           "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.0 "
           "Safari/605.1.15",
           "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
           "Version/18.1 Mobile/15E148 Safari/604.1",
           "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
           "Safari/537.36"]
_COUNTRIES = ["DE", "FR", "US", "GB", "JP", "BR", "IN", "NL", "SE", "ES"]


def zigzag_varint(n: int) -> bytes:
    """Avro's encoding of long ``n``: zigzag, then a little-endian base-128 varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def sample_record(rng: random.Random) -> dict[str, Any]:
    """One page view with an empty ``payload`` (``AVRO_SCHEMA``'s fields, Python values fastavro writes)."""
    user = rng.randrange(1, 10**9)
    return {
        "event_id": "%032x" % rng.getrandbits(128),
        "user_id": user,
        "session_id": "s-%d-%08x" % (user, rng.getrandbits(32)),
        "event_time": 1_764_288_000_000 + rng.randrange(86_400_000),  # 2025-11-28, ms since the epoch
        "page_url": "https://shop.example.com/catalog/%d/item/%d?ref=%08x&utm_source=newsletter&utm_medium=email"
                    % (rng.randrange(1000), rng.randrange(10**6), rng.getrandbits(32)),
        "referrer": None if rng.random() < 0.3 else "https://www.example.org/search?q=%08x" % rng.getrandbits(32),
        "user_agent": rng.choice(_AGENTS),
        "country": rng.choice(_COUNTRIES),
        "duration_ms": rng.randrange(100_000),
        "scroll_depth": rng.random(),
        "latitude": rng.uniform(-90, 90),
        "longitude": rng.uniform(-180, 180),
        "price": round(rng.uniform(0, 500), 2),
        "quantity": rng.randrange(1, 10),
        "is_mobile": rng.random() < 0.5,
        "payload": "",
    }


class AvroValues:
    """Distinct registry-framed ``AVRO_SCHEMA`` values of exactly ``record_bytes`` bytes (module docstring).

    Raises:
        ValueError: ``record_bytes`` is too small for the framing and a pooled record (~440 bytes).
    """

    BUFFER_BYTES = 16 * 2**20

    def __init__(self, record_bytes: int, schema_id: int, seed: int = 0) -> None:
        from fastavro import parse_schema, schemaless_writer

        parsed = parse_schema(AVRO_SCHEMA)
        rng = random.Random(seed)
        header = WIRE_MAGIC + schema_id.to_bytes(4, "big", signed=True)
        self.record_bytes = record_bytes
        self._heads: list[bytes] = []
        self._lengths: list[int] = []
        for _ in range(POOL):
            out = io.BytesIO()
            schemaless_writer(out, parsed, sample_record(rng))
            head = header + out.getvalue()[:-1]  # the empty payload's length (a 0 byte) is rewritten below
            length = record_bytes - len(head) - 2  # 2 bytes of varint: payloads of 64..8191 characters
            if not 64 <= length < 8192:
                raise ValueError(f"--record-bytes {record_bytes} with --value-format avro: a value must have "
                                 f"{len(head) + 66}..{len(head) + 8193} bytes")
            self._heads.append(head + zigzag_varint(length))
            self._lengths.append(length)
        self._buf = os.urandom((self.BUFFER_BYTES + 8192) // 2).hex().encode("ascii")
        self._span = self.BUFFER_BYTES // max(1, record_bytes)
        self._shift = seed * 7919

    def value(self, seq: int) -> bytes:
        """The value of record ``seq`` (``record_bytes`` bytes)."""
        i = seq % POOL
        start = ((seq + self._shift) % self._span) * self.record_bytes
        return self._heads[i] + self._buf[start:start + self._lengths[i]]
