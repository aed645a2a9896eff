"""The matrix's own reader: what a topic's partition holds, batch by batch, over raw Fetch v12.

A client's claim is checked here, not by that client: the values in the log, in order, with each
batch's producer id and sequence (an idempotent producer's batches carry them, KIP-98) and its
transactional and control flags.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from kafka.record.memory_records import MemoryRecords
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.serial import entity_reader
from kio.static.primitive import i8, i32, i64

from tests.e2e import raw_client as rc


@dataclass(frozen=True)
class Batch:
    base_offset: int
    producer_id: int
    base_sequence: int
    transactional: bool
    control: bool
    values: tuple[str, ...]


def read_partition(host: str, port: int, topic: str, partition: int = 0, isolation_level: int = 0,
                   timeout_s: float = 30.0) -> list[Batch]:
    """Every batch of ``topic``/``partition`` from offset 0 to the high watermark (read_uncommitted
    unless ``isolation_level=1``); raises ``AssertionError`` on a partition error code.

    Read committed, the broker serves up to the last stable offset and lists the aborted
    transactions; dropping their batches is the consumer's work (Kafka's
    ``CompletedFetch.nextFetchedRecord``): a producer's batches are skipped from the listed
    first offset to its ABORT marker, as here."""
    batches: list[Batch] = []
    offset, correlation = 0, 0
    listed: list[tuple[int, int]] = []  # (first offset, producer id) of aborted transactions, not reached yet
    aborting: set[int] = set()
    client = rc.RawClient(host, port, timeout_s=timeout_s)
    try:
        while True:
            correlation += 1
            request = FetchRequest(
                max_wait=datetime.timedelta(milliseconds=100), min_bytes=i32(1), isolation_level=i8(isolation_level),
                topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
                    partition=i32(partition), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 20)),)),),
                forgotten_topics_data=(), rack_id="")
            client.send(rc.frame(request, correlation, client_id="compat-reference"))
            cid, body = client.read_response()
            assert cid == correlation
            assert body[0] == 0  # response header v1: no tagged fields
            response, _ = entity_reader(FetchResponse)(body, 1)
            data = response.responses[0].partitions[0]
            assert data.error_code.value == 0, f"{topic}/{partition}: {data.error_code.name}"
            if isolation_level == 1:
                listed = sorted(set(listed) | {(int(a.first_offset), int(a.producer_id))
                                               for a in data.aborted_transactions or ()})
            records = MemoryRecords(bytes(data.records or b""))
            while (batch := records.next_batch()) is not None:
                offset = batch.next_offset
                while listed and listed[0][0] <= batch.base_offset:
                    aborting.add(listed.pop(0)[1])
                if batch.producer_id in aborting:
                    if batch.is_control_batch:  # its ABORT marker: the aborted transaction ends
                        aborting.discard(batch.producer_id)
                    continue
                values = tuple(r.value.decode() for r in batch if r.value is not None)
                batches.append(Batch(batch.base_offset, batch.producer_id, batch.base_sequence,
                                     bool(batch.is_transactional), bool(batch.is_control_batch),
                                     () if batch.is_control_batch else values))
            end = data.last_stable_offset if isolation_level == 1 else data.high_watermark
            if offset >= end:
                return batches
    finally:
        client.close()


def values(batches: list[Batch]) -> list[str]:
    return [value for batch in batches if not batch.control for value in batch.values]


def partition_count(host: str, port: int, topic: str) -> int | None:
    """How many partitions Metadata v9 lists for ``topic``, ``None`` if it does not exist (asked
    without auto-creation, so asking creates nothing)."""
    from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.metadata.v9.response import MetadataResponse

    client = rc.RawClient(host, port, timeout_s=30)
    try:
        client.send(rc.frame(MetadataRequest(topics=(MetadataRequestTopic(name=topic),),
                                             allow_auto_topic_creation=False,
                                             include_cluster_authorized_operations=False,
                                             include_topic_authorized_operations=False), 1,
                             client_id="compat-reference"))
        _, body = client.read_response()
    finally:
        client.close()
    response, _ = entity_reader(MetadataResponse)(body, 1)
    (described,) = response.topics
    return None if described.error_code.value != 0 else len(described.partitions)


def advertised_apis(host: str, port: int) -> set[int]:
    """The api keys the broker's ApiVersions (v3) answer lists."""
    from kio.schema.api_versions.v3.response import ApiVersionsResponse

    client = rc.RawClient(host, port, timeout_s=30)
    try:
        client.send(rc.frame(rc.api_versions(), 1, client_id="compat-reference"))
        _, body = client.read_response()
    finally:
        client.close()
    response, _ = entity_reader(ApiVersionsResponse)(body, 0)  # ApiVersions answers with header v0
    return {int(key.api_key) for key in response.api_keys}
