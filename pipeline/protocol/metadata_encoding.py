"""Metadata responses (api key 3, v0-v12) encoded straight from tuples, without kio entities.

kio builds one validated entity per broker, topic and partition and writes
each field through a generic writer: ~75 us for a one-topic answer and
~45 ms for all 1,000 topics of 4 partitions (measured on the project's 2-core
machine), the event loop blocked for every connection meanwhile. Clients ask
for all topics routinely (kafka-python and Kafka Connect subscribe by
pattern, admin tools and UIs list the cluster), and at acks=0 the benchmark's
fences are Metadata requests. This module writes the same bytes with one
``struct`` pack per partition (Kafka ``MetadataResponse.json``, the layout
of each version): tests/protocol/test_metadata_encoding.py checks it against
kio's encoding of the same response, byte for byte, for every version served.

What is written is what the server answers: no rack, every partition with
its leader as sole replica and in-sync replica (none when the leader is -1),
no offline replicas, authorized operations not requested (-2147483648),
``is_internal`` false, throttle time 0.
"""

from __future__ import annotations

import struct
import uuid
from typing import Sequence

BrokerTuple = tuple[int, str, int]
"""(node id, host, port)."""
PartitionTuple = tuple[int, int, int, int]
"""(error code, partition index, leader id (-1: none), leader epoch)."""
TopicTuple = tuple[int, "str | None", uuid.UUID, Sequence[PartitionTuple]]
"""(error code, name (None only in v12 answers by topic id), topic id, partitions)."""

FIRST_FLEXIBLE_VERSION = 9
"""Metadata v9+ uses compact strings and arrays and tagged fields (KIP-482)."""
_AUTHORIZED_OPERATIONS_OMITTED = -2147483648
"""Kafka's default for topic/cluster authorized operations that were not requested (KIP-430)."""

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_TOPIC_OPERATIONS = _INT32.pack(_AUTHORIZED_OPERATIONS_OMITTED)


def _partition_formats(version: int) -> tuple[struct.Struct, struct.Struct]:
    """(with a leader, without one) formats of a partition entry in ``version``."""
    epoch = "i" if version >= 7 else ""
    if version >= FIRST_FLEXIBLE_VERSION:
        # error, index, leader, epoch, replicas [leader], isr [leader], offline [], tagged fields
        return struct.Struct(">hiiiBiBiBB"), struct.Struct(">hiiiBBBB")
    offline = "i" if version >= 5 else ""
    return struct.Struct(f">hii{epoch}iiii{offline}"), struct.Struct(f">hii{epoch}ii{offline}")


_PARTITION_FORMATS = {version: _partition_formats(version) for version in range(13)}


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _array_length(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _INT32.pack(n)


def _string(value: str | None, flexible: bool) -> bytes:
    """A (nullable) string: compact (length + 1, 0 = null) when flexible, else int16 length (-1 = null)."""
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = value.encode()
    return (_uvarint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def encode_metadata_response(version: int, brokers: Sequence[BrokerTuple], cluster_id: str | None,
                             controller_id: int, topics: Sequence[TopicTuple]) -> bytes:
    """The body of a MetadataResponse ``version`` (0-12), without the response header.

    Args:
        version: the request's api version.
        brokers: every listed broker.
        cluster_id: written from v2 (nullable).
        controller_id: written from v1.
        topics: in answer order; a topic's partitions in index order.

    Raises:
        ValueError: ``version`` outside 0-12.
    """
    if not 0 <= version <= 12:
        raise ValueError(f"Metadata v{version} is not encoded here (0-12)")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    tags = b"\x00" if flexible else b""
    out: list[bytes] = []
    if version >= 3:
        out.append(_INT32.pack(0))  # throttle_time_ms
    out.append(_array_length(len(brokers), flexible))
    for node_id, host, port in brokers:
        out.append(_INT32.pack(node_id))
        out.append(_string(host, flexible))
        out.append(_INT32.pack(port))
        if version >= 1:
            out.append(_string(None, flexible))  # rack
        out.append(tags)
    if version >= 2:
        out.append(_string(cluster_id, flexible))
    if version >= 1:
        out.append(_INT32.pack(controller_id))
    out.append(_array_length(len(topics), flexible))
    with_leader, without_leader = _PARTITION_FORMATS[version]
    pack_with, pack_without = with_leader.pack, without_leader.pack
    for error, name, topic_id, partitions in topics:
        out.append(_INT16.pack(error))
        out.append(_string(name, flexible))
        if version >= 10:
            out.append(topic_id.bytes)
        if version >= 1:
            out.append(b"\x00")  # is_internal
        out.append(_array_length(len(partitions), flexible))
        if flexible:
            for p_error, index, leader, epoch in partitions:
                out.append(pack_with(p_error, index, leader, epoch, 2, leader, 2, leader, 1, 0) if leader >= 0
                           else pack_without(p_error, index, leader, epoch, 1, 1, 1, 0))
        elif version >= 7:
            for p_error, index, leader, epoch in partitions:
                out.append(pack_with(p_error, index, leader, epoch, 1, leader, 1, leader, 0) if leader >= 0
                           else pack_without(p_error, index, leader, epoch, 0, 0, 0))
        elif version >= 5:
            for p_error, index, leader, _epoch in partitions:
                out.append(pack_with(p_error, index, leader, 1, leader, 1, leader, 0) if leader >= 0
                           else pack_without(p_error, index, leader, 0, 0, 0))
        else:
            for p_error, index, leader, _epoch in partitions:
                out.append(pack_with(p_error, index, leader, 1, leader, 1, leader) if leader >= 0
                           else pack_without(p_error, index, leader, 0, 0))
        if version >= 8:
            out.append(_TOPIC_OPERATIONS)
        out.append(tags)
    if 8 <= version <= 10:
        out.append(_INT32.pack(_AUTHORIZED_OPERATIONS_OMITTED))  # cluster_authorized_operations
    out.append(tags)
    return b"".join(out)
