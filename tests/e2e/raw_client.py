"""A blocking raw Kafka-protocol client for tests: kio schemas, kafka.record batches."""

from __future__ import annotations

import datetime
import socket
import struct

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v9.response import ProduceResponse
from kio.serial import entity_reader
from kio.static.primitive import i16, i32

from pipeline.bench.frames import encode_request


def record_batch(values: list[bytes], timestamp_ms: int = 1_700_000_000_000) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp_ms + i, key=None, value=value, headers=[])
    return bytes(builder.build())


def frame(entity, correlation_id: int, client_id: str = "raw-test") -> bytes:
    """Size prefix + request header (the version the entity's schema names) + body."""
    return encode_request(entity, correlation_id, client_id)


def api_versions() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="raw-test", client_software_version="1")


def metadata(*topics: str) -> MetadataRequest:
    return MetadataRequest(topics=tuple(MetadataRequestTopic(name=t) for t in topics),
                           allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)


def produce(topic: str, values: list[bytes], acks: int = -1, partition: int = 0,
            timeout_ms: int = 30_000) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None, acks=i16(acks), timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=i32(partition), records=record_batch(values)),)),),
    )


def decode_produce_response(body: bytes) -> ProduceResponse:
    """``body`` as returned by ``RawClient.read_response`` for a v9 Produce (response header v1)."""
    # response header v1: correlation id (already stripped) + tagged fields (0 = none)
    assert body[0] == 0
    entity, _ = entity_reader(ProduceResponse)(body, 1)
    return entity


class RawClient:
    """One blocking TCP connection to 127.0.0.1 with a receive timeout."""

    def __init__(self, host: str, port: int, timeout_s: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("connection closed by server")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def read_response(self) -> tuple[int, bytes]:
        """(correlation id, rest of the response after the correlation id)."""
        (size,) = struct.unpack(">i", self._recv_exact(4))
        payload = self._recv_exact(size)
        return struct.unpack_from(">i", payload)[0], payload[4:]

    def closed_by_server(self) -> bool:
        """True if the server closed the connection (EOF or reset) within the timeout."""
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()
