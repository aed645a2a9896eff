"""The load generator: its own process, speaking the Kafka Produce protocol over raw sockets.

    python -m pipeline.bench.loadgen SPEC.json RESULT.json [--handshake]

It runs in a separate process so its CPU is not the server's (on a 2-core
machine they still compete for the cores; the report says so). Every request
frame is built before the clock starts (``pipeline.bench.frames``), then one
thread drives ``connections`` non-blocking sockets with ``selectors``:

* acks=1/-1 (and the echo ceiling): each connection keeps up to ``in_flight``
  requests outstanding, sending the next one as soon as a response frees a
  slot, like a Kafka producer with ``max.in.flight.requests.per.connection``.
* acks=0: there are no responses, so a connection writes its requests in
  chunks of ``ACKS0_FENCE_EVERY``, each followed by a Metadata request as a
  *fence*; a server that keeps connections ordered answers a fence only after
  handling every request before it. At most ``in_flight`` fences are
  outstanding per connection, so at most ``in_flight * ACKS0_FENCE_EVERY``
  requests sit unhandled in socket buffers and queues. (Without this bound
  loopback TCP buffers, up to 32 MiB per socket here, swallow minutes of
  work, and a 3 s run takes a minute to drain.) The run ends when the last
  fence is answered, so requests/s counts requests the server has handled.

The load stops at ``max_requests`` (all connections together) or after
``duration_s``, whichever comes first; then the generator waits at most
``drain_timeout_s`` for outstanding responses. Never unbounded.

Protocol on stdout (for the runner's CPU sampling): with ``--handshake`` it
prints ``READY`` once connected and set up, and waits for a line on stdin;
then ``START`` when the clock starts, ``END`` when the last response has
arrived. The result (figures, the
HDR latency histogram, and every response as ``[req, latency_us, base_offset,
error_code]`` per connection, in arrival order) is written as JSON.

``client: "confluent"`` drives confluent-kafka (librdkafka) producers instead,
one per connection; librdkafka decides how records are batched into requests,
so there each *record* is a unit (``req`` = record number on that producer)
and responses are delivery reports.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from hdrh.histogram import HdrHistogram

from pipeline.bench import frames as fr

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message
    from kio.serial.readers import Reader

LATENCY_MAX_US = 3_600_000_000
"""Highest latency the histogram tracks: 1 hour, in microseconds."""
RECEIVE_BYTES = 256 * 1024
ACKS0_FENCE_EVERY = 16
"""acks=0: produce requests between two Metadata fences (see module docstring)."""
_SIZE = struct.Struct(">i")
_FENCE_CID = fr.SETUP_CORRELATION_BASE + 100
"""First fence correlation id; each fence of a connection takes the next one."""


@dataclass(slots=True)
class LoadSpec:
    """One run's load. Sizes in bytes, times in seconds.

    Attributes:
        host, port: the server (127.0.0.1 only).
        protocol: "kafka" (a pipeline server) or "echo" (the framing ceiling:
            no setup, any reply frame carrying the correlation id counts).
        client: "raw" (this module's socket driver) or "confluent".
        topic: topic written (auto-created by the setup Metadata request).
        connections: C. in_flight: K. records: R per request. record_bytes: S.
        partitions: P; connection c writes every request to partition c % P.
        acks: -1, 0 or 1.
        max_requests: bound on requests over all connections.
        duration_s: bound on the time spent sending.
        rate: if > 0, at most this many requests/s in total (a token bucket
            from the start; acks 1/-1 only), for latency at a given load.
        produce_version: Produce api version (9: flexible; 8: last non-flexible).
        max_prebuilt_bytes: memory bound for pre-built frames; ``max_requests``
            is lowered to fit (reported as ``prebuild_capped``).
        drain_timeout_s: how long to wait for outstanding responses after sending stops.
    """

    host: str
    port: int
    protocol: str = "kafka"
    client: str = "raw"
    topic: str = "bench"
    connections: int = 1
    in_flight: int = 5
    records: int = 10
    record_bytes: int = 64
    partitions: int = 1
    acks: int = -1
    max_requests: int = 10_000
    duration_s: float = 10.0
    produce_version: int = 9
    max_prebuilt_bytes: int = 256 * 1024 * 1024
    drain_timeout_s: float = 120.0
    connect_timeout_s: float = 30.0
    timeline_ms: int = 250
    rate: float = 0.0

    def __post_init__(self) -> None:
        if self.host != "127.0.0.1":
            raise ValueError(f"the benchmark only targets 127.0.0.1, got {self.host!r}")
        if self.protocol not in ("kafka", "echo") or self.client not in ("raw", "confluent"):
            raise ValueError(f"bad protocol/client {self.protocol!r}/{self.client!r}")
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be -1, 0 or 1, got {self.acks}")
        if min(self.connections, self.in_flight, self.records, self.partitions, self.max_requests) < 1:
            raise ValueError("connections, in_flight, records, partitions and max_requests must be >= 1")
        if not 0 < self.duration_s <= 3600:
            raise ValueError(f"duration_s must be in (0, 3600], got {self.duration_s}")

    @property
    def expects_responses(self) -> bool:
        return self.protocol == "echo" or self.acks != 0

    def partition_of(self, conn: int) -> int:
        return conn % self.partitions


def split_requests(total: int, connections: int) -> list[int]:
    """``total`` requests dealt over ``connections`` as evenly as possible."""
    base, extra = divmod(total, connections)
    return [base + (1 if c < extra else 0) for c in range(connections)]


def prebuild(spec: LoadSpec, timestamp_ms: int) -> tuple[list[list[bytes]], int, bool]:
    """Every request frame of the run, per connection.

    Returns:
        (frames per connection, bytes of one frame, whether ``max_requests`` was
        lowered to stay within ``max_prebuilt_bytes``).
    """
    shape = fr.RequestShape(spec.topic, spec.records, spec.record_bytes, spec.acks, spec.produce_version)
    templates = [fr.FrameTemplate(shape, c, spec.partition_of(c), timestamp_ms)
                 for c in range(spec.connections)]
    frame_bytes = templates[0].size
    fit = max(spec.connections, spec.max_prebuilt_bytes // frame_bytes)
    total = min(spec.max_requests, fit)
    frames = [[t.frame(req) for req in range(n)]
              for t, n in zip(templates, split_requests(total, spec.connections))]
    return frames, frame_bytes, total < spec.max_requests


# ---------------------------------------------------------------- setup requests


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed by the server during setup")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _round_trip(sock: socket.socket, frame: bytes) -> bytes:
    """Send one request, return its response payload after the correlation id."""
    sock.sendall(frame)
    (size,) = _SIZE.unpack(_recv_exact(sock, 4))
    payload = _recv_exact(sock, size)
    cid = _SIZE.unpack_from(payload)[0]
    if cid != fr.correlation_id_of(frame):
        raise ConnectionError(f"setup response has correlation id {cid}, expected {fr.correlation_id_of(frame)}")
    return payload[4:]


def metadata_frame(topic: str, correlation_id: int) -> bytes:
    """A Metadata v9 request naming ``topic`` (auto-creates it)."""
    from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
    from kio.schema.types import TopicName

    entity = MetadataRequest(topics=(MetadataRequestTopic(name=TopicName(topic)),), allow_auto_topic_creation=True,
                             include_cluster_authorized_operations=False,
                             include_topic_authorized_operations=False)
    return fr.encode_request(entity, correlation_id)


def setup_connection(sock: socket.socket, spec: LoadSpec) -> None:
    """ApiVersions v3, then Metadata v9 naming the topic, as a Kafka client starts.

    Raises:
        ConnectionError: a response is missing or says the topic is not usable
            with ``spec.partitions`` partitions.
    """
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.metadata.v9.response import MetadataResponse
    from kio.schema.types import TopicName
    from kio.serial import entity_reader

    _round_trip(sock, fr.encode_request(
        ApiVersionsRequest(client_software_name="pipeline-bench", client_software_version="1"),
        fr.SETUP_CORRELATION_BASE))
    body = _round_trip(sock, metadata_frame(spec.topic, fr.SETUP_CORRELATION_BASE + 1))
    metadata, _ = entity_reader(MetadataResponse)(body, 1)  # skip the empty tagged fields
    topics = {t.name: t for t in metadata.topics}
    t = topics.get(TopicName(spec.topic))
    if t is None or t.error_code.value != 0 or len(t.partitions) < spec.partitions:
        raise ConnectionError(f"topic {spec.topic!r} not usable with {spec.partitions} partitions: {t}")


# ---------------------------------------------------------------- the raw driver


class _Conn:
    __slots__ = ("idx", "sock", "frames", "next", "inflight", "out", "rbuf", "responses",
                 "mask", "fences", "next_fence")

    def __init__(self, idx: int, sock: socket.socket, frames: list[bytes]) -> None:
        self.idx = idx
        self.sock = sock
        self.frames = frames
        self.next = 0
        self.inflight: dict[int, int] = {}  # correlation id -> send time (ns)
        self.out = bytearray()
        self.rbuf = bytearray()
        self.responses: list[list[int]] = []
        self.mask = 0
        self.fences: dict[int, int] = {}  # outstanding fence correlation id -> send time (ns)
        self.next_fence = _FENCE_CID


def _produce_response_reader(version: int) -> tuple[Reader[Any], int]:
    """(reader, body offset) for Produce responses of ``version``: the entity
    reader and where the body starts after the correlation id (flexible
    versions, 9+, have response header v1 with one tagged-fields byte)."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    return entity_reader(load_response_schema(0, version)), (1 if version >= 9 else 0)


def _no_handshake() -> None:
    pass


def run_raw(spec: LoadSpec, frames: list[list[bytes]], out: TextIO = sys.stdout,
            ready: Callable[[], None] = _no_handshake) -> dict:
    """Drive the server; returns the result dict (see module docstring).

    ``ready`` is called once every connection is set up, before the clock starts.
    """
    socks = []
    for _ in range(spec.connections):
        s = socket.create_connection((spec.host, spec.port), timeout=spec.connect_timeout_s)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    if spec.protocol == "kafka":
        for s in socks:
            setup_connection(s, spec)
    for s in socks:
        s.setblocking(False)
    conns = [_Conn(i, s, f) for i, (s, f) in enumerate(zip(socks, frames))]
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
        c.mask = selectors.EVENT_READ
    reader, body_at = _produce_response_reader(spec.produce_version)
    decode = spec.protocol == "kafka"
    windowed = spec.expects_responses
    window = spec.in_flight
    hist = HdrHistogram(1, LATENCY_MAX_US, 3)
    timeline_ns = spec.timeline_ms * 1_000_000
    timeline: list[int] = []
    now = time.perf_counter_ns
    counters = {"sent": 0, "completed": 0, "unknown": 0, "fenced": 0}
    fence_template = metadata_frame(spec.topic, 0)
    # With a rate, wake up about when the next request is due (not much more
    # often: a busy client takes a core from the server on a 2-core machine).
    select_timeout = min(0.05, max(0.0005, 1 / spec.rate)) if spec.rate else 0.05

    start = [now()]

    def fill(c: _Conn, t: int) -> None:
        frames_, nxt = c.frames, c.next
        if windowed:
            room = min(window - len(c.inflight), len(frames_) - nxt)
            if spec.rate:
                room = min(room, int(spec.rate * (t - start[0]) / 1e9) - counters["sent"])
            if room <= 0:
                return
            batch = frames_[nxt:nxt + room]
            for req in range(nxt, nxt + room):
                c.inflight[req] = t
        else:
            batch = []
            while nxt < len(frames_) and len(c.fences) < window:
                chunk = frames_[nxt:nxt + ACKS0_FENCE_EVERY]
                nxt += len(chunk)
                batch += chunk
                fence = bytearray(fence_template)
                _SIZE.pack_into(fence, 8, c.next_fence)  # the correlation id
                batch.append(bytes(fence))
                c.fences[c.next_fence] = t
                c.next_fence += 1
            room = nxt - c.next
            if not room:
                return
        c.next += room
        counters["sent"] += room
        c.out += b"".join(batch)

    def flush_out(c: _Conn) -> None:
        if c.out:
            try:
                n = c.sock.send(c.out)
            except BlockingIOError:
                n = 0
            del c.out[:n]

    def on_response(c: _Conn, payload: memoryview, t: int) -> None:
        cid = _SIZE.unpack_from(payload)[0]
        if cid >= fr.SETUP_CORRELATION_BASE:
            if c.fences.pop(cid, None) is not None:
                counters["fenced"] += 1
                bucket = (t - t0) // timeline_ns
                while len(timeline) <= bucket:
                    timeline.append(0)
                timeline[bucket] += ACKS0_FENCE_EVERY
            return
        sent_at = c.inflight.pop(cid, None)
        latency_us = -1
        if sent_at is None:
            counters["unknown"] += 1  # answered twice, or never asked: verify reports it
        else:
            latency_us = max(1, (t - sent_at) // 1000)
            hist.record_value(min(latency_us, LATENCY_MAX_US))
        base_offset, error = -1, 0
        if decode:
            entity, _ = reader(payload.toreadonly(), 4 + body_at)
            p = entity.responses[0].partition_responses[0]
            base_offset, error = int(p.base_offset), int(p.error_code.value)
        c.responses.append([cid, latency_us, base_offset, error])
        counters["completed"] += 1
        bucket = (t - t0) // timeline_ns
        while len(timeline) <= bucket:
            timeline.append(0)
        timeline[bucket] += 1

    def on_readable(c: _Conn, t: int) -> None:
        try:
            data = c.sock.recv(RECEIVE_BYTES)
        except BlockingIOError:
            return
        if not data:
            raise ConnectionError(f"connection {c.idx} closed by the server")
        buf = c.rbuf
        buf += data
        pos, end = 0, len(buf)
        with memoryview(buf) as view:
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(view, pos)
                if end - pos - 4 < size:
                    break
                on_response(c, view[pos + 4:pos + 4 + size], t)
                pos += 4 + size
        del buf[:pos]

    ready()
    print("START", file=out, flush=True)
    cpu0 = time.process_time()
    t0 = now()
    start[0] = t0
    send_deadline = t0 + int(spec.duration_s * 1e9)
    drain_deadline: int | None = None
    stopped_by = "count"
    timed_out = False
    last_event = t0
    for c in conns:
        fill(c, t0)
        flush_out(c)
    try:
        while True:
            t = now()
            sending = t < send_deadline
            if not sending and drain_deadline is None:
                stopped_by = "duration" if any(c.next < len(c.frames) for c in conns) else "count"
                drain_deadline = t + int(spec.drain_timeout_s * 1e9)
            if drain_deadline is None and all(c.next == len(c.frames) for c in conns):
                drain_deadline = t + int(spec.drain_timeout_s * 1e9)
            if drain_deadline is not None and t > drain_deadline:
                timed_out = True
                break
            done = True
            for c in conns:
                if sending:
                    fill(c, t)
                if c.out or c.inflight or c.fences or (sending and c.next < len(c.frames)):
                    done = False
                want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
                if want != c.mask:
                    sel.modify(c.sock, want, c)
                    c.mask = want
            if done:
                break
            for key, events in sel.select(timeout=select_timeout):
                c = key.data
                t = now()
                if events & selectors.EVENT_READ:
                    on_readable(c, t)
                    last_event = t
                    if sending:
                        fill(c, t)
                if c.out:
                    flush_out(c)
    finally:
        t_end = last_event
        cpu_s = time.process_time() - cpu0
        print("END", file=out, flush=True)
        for c in conns:
            c.sock.close()
    elapsed = max(1e-9, (t_end - t0) / 1e9)
    return {
        "elapsed_s": elapsed,
        "sent": counters["sent"],
        "completed": counters["completed"],
        "unknown_responses": counters["unknown"],
        "fences": counters["fenced"],
        "client_cpu_s": cpu_s,
        "stopped_by": stopped_by,
        "timed_out": timed_out,
        "latency_hdr": hist.encode().decode() if hist.get_total_count() else None,
        "timeline_ms": spec.timeline_ms,
        "timeline": timeline,
        "connections": [{"conn": c.idx, "partition": spec.partition_of(c.idx), "sent": c.next,
                         "records_per_request": spec.records, "responses": c.responses}
                        for c in conns],
    }


# ---------------------------------------------------------- the confluent driver


def run_confluent(spec: LoadSpec, out: TextIO = sys.stdout, ready: Callable[[], None] = _no_handshake) -> dict:
    """Drive the server with one confluent-kafka Producer per connection.

    Each record is one unit (``req`` = record number on its producer, key
    ``record_key(conn, req, 0)``); ``max_requests * records`` records in total.
    Responses are delivery reports in the order librdkafka delivered them.
    """
    from confluent_kafka import KafkaException, Producer

    bootstrap = f"{spec.host}:{spec.port}"
    producers = [Producer({
        "bootstrap.servers": bootstrap,
        "client.id": f"pipeline-bench-{c}",
        "acks": str(spec.acks),
        "max.in.flight.requests.per.connection": spec.in_flight,
        "batch.num.messages": spec.records,
        "linger.ms": 5,
        "enable.idempotence": False,
        # Bound what waits in librdkafka like the raw driver's window: K requests
        # of R records in flight plus as much again queued (produce() then
        # raises BufferError and the loop polls), so the load stops when
        # the duration does instead of draining a deep client queue.
        "queue.buffering.max.messages": 2 * spec.in_flight * spec.records,
        "broker.address.family": "v4",
    }) for c in range(spec.connections)]
    for p in producers:  # connect and create the topic before the clock starts
        p.list_topics(spec.topic, timeout=spec.connect_timeout_s)
    value = b"v" * spec.record_bytes
    quotas = split_requests(spec.max_requests * spec.records, spec.connections)
    hist = HdrHistogram(1, LATENCY_MAX_US, 3)
    responses: list[list[list[int]]] = [[] for _ in producers]
    sent = [0] * spec.connections
    now = time.perf_counter_ns
    state = {"last": 0}

    def make_callback(conn: int, req: int, started: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            t = now()
            latency_us = max(1, (t - started) // 1000)
            hist.record_value(min(latency_us, LATENCY_MAX_US))
            error = 0 if err is None else (err.code() if isinstance(err.code(), int) else -1)
            delivered = msg.offset() if err is None else None
            offset = delivered if delivered is not None else -1
            responses[conn].append([req, latency_us, offset, error])
            state["last"] = t
        return on_delivery

    ready()
    print("START", file=out, flush=True)
    cpu0 = time.process_time()
    t0 = now()
    deadline = t0 + int(spec.duration_s * 1e9)
    stopped_by = "count"
    try:
        while any(sent[c] < quotas[c] for c in range(spec.connections)):
            if now() >= deadline:
                stopped_by = "duration"
                break
            for c, p in enumerate(producers):
                if sent[c] >= quotas[c]:
                    continue
                req = sent[c]
                try:
                    p.produce(spec.topic, value=value, key=fr.record_key(c, req, 0),
                              partition=spec.partition_of(c), on_delivery=make_callback(c, req, now()))
                    sent[c] += 1
                except BufferError:
                    p.poll(0.005)
                p.poll(0)
        remaining = 0
        drain_end = time.monotonic() + spec.drain_timeout_s
        for p in producers:
            remaining += p.flush(max(0.1, drain_end - time.monotonic()))
    except KafkaException as exc:
        raise ConnectionError(f"confluent producer failed: {exc}") from exc
    finally:
        cpu_s = time.process_time() - cpu0  # includes librdkafka's threads
        print("END", file=out, flush=True)
    t_end = state["last"] or now()
    return {
        "elapsed_s": max(1e-9, (t_end - t0) / 1e9),
        "sent": sum(sent),
        "completed": sum(len(r) for r in responses),
        "unknown_responses": 0,
        "client_cpu_s": cpu_s,
        "stopped_by": stopped_by,
        "timed_out": remaining > 0,
        "latency_hdr": hist.encode().decode() if hist.get_total_count() else None,
        "timeline_ms": spec.timeline_ms,
        "timeline": [],
        "connections": [{"conn": c, "partition": spec.partition_of(c), "sent": sent[c],
                         "records_per_request": 1, "responses": responses[c]}
                        for c in range(spec.connections)],
    }


def run(spec: LoadSpec, out: TextIO = sys.stdout, ready: Callable[[], None] = _no_handshake) -> dict:
    """Pre-build (raw client), drive, and return the result dict with ``spec`` included."""
    started = time.perf_counter()
    if spec.client == "confluent":
        if spec.protocol != "kafka":
            raise ValueError("the confluent client only talks to a Kafka server, not the echo ceiling")
        result = run_confluent(spec, out, ready)
        result.update(prebuilt_requests=0, request_bytes=None, prebuild_capped=False, prebuild_s=0.0)
    else:
        frames, frame_bytes, capped = prebuild(spec, int(time.time() * 1000))
        prebuild_s = time.perf_counter() - started
        result = run_raw(spec, frames, out, ready)
        result.update(prebuilt_requests=sum(map(len, frames)), request_bytes=frame_bytes,
                      prebuild_capped=capped, prebuild_s=prebuild_s)
    result["spec"] = asdict(spec)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    handshake = "--handshake" in argv
    argv = [a for a in argv if a != "--handshake"]
    if len(argv) != 2:
        print("usage: python -m pipeline.bench.loadgen SPEC.json RESULT.json [--handshake]", file=sys.stderr)
        return 2
    spec = LoadSpec(**json.loads(Path(argv[0]).read_text()))

    def ready() -> None:
        if handshake:
            print("READY", flush=True)
            sys.stdin.readline()

    result = run(spec, ready=ready)
    tmp = Path(argv[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, separators=(",", ":")))
    tmp.replace(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
