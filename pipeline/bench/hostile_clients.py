"""The hostile clients of ``pipeline bench --hostile``: every case of ``pipeline.bench.hostile``, on repeat.

    python -m pipeline.bench.hostile_clients SPEC.json RESULT.json

A separate process (its CPU is not the server's, and not the runner's RSS
sampler's), blocking sockets to 127.0.0.1, one thread per *lane*; a lane
repeats its cases until ``duration_s`` is over, then finishes the execution
under way (each bounded by socket timeouts) and stops; its first round (every
case once) is completed even past ``duration_s``, for at most ``grace_s``:

* ``quick``: bad frame sizes, bad headers, unknown api keys and versions,
  invalid topic names, every bad RecordBatch, acks=0 with a bad batch, a
  Produce body whose records length lies; ``pause_s`` between two cases.
* ``slow``: the 1-byte-at-a-time sender, a frame never completed (the server
  closes it after request.receive.timeout), a client that never reads its
  responses (paused, then closed after response.send.timeout).
* ``memory``: the memory attack: ``memory_attack_connections`` connections
  each declaring a ``memory_attack_declared_bytes`` frame, sending
  ``memory_attack_sent_bytes`` of it and stalling. The pool lends one of them
  its frame at a time; the others are muted (time muted does not count
  against the receive timeout), so a round takes about connections x the
  receive timeout. A round is shortened to what fits in the time left.
* ``burst``: ``burst_connections`` connections opened in waves of
  ``BURST_WAVE`` and dropped with a reset, then one new connection must be
  served; later bursts are ``burst_repeat_connections`` every
  ``burst_every_s``. While a burst runs the other lanes open no connections
  (they would be refused at accept like the burst's; that is the burst's
  answer, not theirs).

Every execution is recorded: case, expected answer, observed answer, the
client's local ports and wall-clock start/end, so the runner can match the
server log's "closing connection ...: reason" lines to it, and for produce
requests that were acknowledged the records (their keys name case and
execution) so the table check can find them.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from pipeline.bench import hostile as h

BURST_WAVE = 1000
BURST_QUIET_S = 1.0
"""A burst starts once no lane has opened a connection for this long."""
CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 10.0
_SIZE = struct.Struct(">i")


@dataclass(slots=True)
class HostileSpec:
    """What the hostile clients need to know about the server and the run. Sizes in bytes, times in seconds."""

    host: str
    port: int
    topic: str
    duration_s: float
    socket_request_max_bytes: int
    pool_bytes: int
    receive_timeout_ms: int
    send_timeout_ms: int
    response_buffer_max_bytes: int
    max_connections: int
    memory_attack_connections: int = 40
    memory_attack_declared_bytes: int = 90 * h.MiB
    memory_attack_sent_bytes: int = 40 * h.MiB
    burst_connections: int = 10_000
    burst_repeat_connections: int = 2_000
    burst_every_s: float = 30.0
    stall_frame_bytes: int = 1 * h.MiB
    pause_s: float = 0.05
    grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.host != "127.0.0.1":
            raise ValueError(f"the benchmark only targets 127.0.0.1, got {self.host!r}")
        if not 0 < self.duration_s <= 3600:
            raise ValueError(f"duration_s must be in (0, 3600], got {self.duration_s}")
        if self.memory_attack_declared_bytes > min(self.pool_bytes, self.socket_request_max_bytes):
            raise ValueError("the memory attack's declared frame must fit the pool and socket.request.max.bytes")


@dataclass(slots=True)
class Execution:
    """One execution of one case."""

    case: str
    expected: str
    answer: str = ""
    detail: str = ""
    reason: str | None = None
    """Regex the server log's closing line for each of ``ports`` must match (None: no log check)."""
    ports: list[int] = field(default_factory=list)
    t0: float = 0.0
    t1: float = 0.0
    acked: list[list[int]] = field(default_factory=list)
    """[conn, req, records, base offset] of each acknowledged produce."""

    @property
    def ok(self) -> bool:
        return self.answer == self.expected


class Answer(Exception):
    """Ends a case early with an observed answer that is not the expected one."""


# ------------------------------------------------------------------ sockets


class _Opening:
    """Connections of the lanes being opened, so a burst can wait until the server has
    accepted them: a connection still in the listen backlog when a burst fills
    max.connections would be refused at accept, which is the burst's answer, not its case's."""

    lock = threading.Lock()
    count = 0
    last = 0.0

    @classmethod
    def quiet_for(cls) -> float:
        with cls.lock:
            return float("-inf") if cls.count else time.monotonic() - cls.last


def connect(spec: HostileSpec, timeout_s: float = ANSWER_TIMEOUT_S,
            sockopts: Iterable[tuple[int, int, int]] = ()) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for level, name, value in sockopts:
        s.setsockopt(level, name, value)
    s.settimeout(CONNECT_TIMEOUT_S)
    with _Opening.lock:
        _Opening.count += 1
    try:
        s.connect((spec.host, spec.port))
    except BaseException:
        s.close()
        raise
    finally:
        with _Opening.lock:
            _Opening.count -= 1
            _Opening.last = time.monotonic()
    s.settimeout(timeout_s)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = s.recv(n)
        if not chunk:
            raise Answer("closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_response(s: socket.socket) -> tuple[int, bytes]:
    """(correlation id, body after it); Answer("closed"/"no answer") otherwise."""
    try:
        (size,) = _SIZE.unpack(recv_exact(s, 4))
        payload = recv_exact(s, size)
    except (ConnectionResetError, BrokenPipeError):
        raise Answer("closed") from None
    except socket.timeout:
        raise Answer("no answer") from None
    return _SIZE.unpack_from(payload)[0], payload[4:]


def wait_closed(s: socket.socket, timeout_s: float) -> str:
    """"closed" if the server closes (EOF or reset) within ``timeout_s`` and sent nothing,
    "answered, then closed" if it sent bytes first, "open" if it did not close."""
    s.settimeout(timeout_s)
    got = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                return "closed" if not got else "answered, then closed"
            got += len(data)
    except (ConnectionResetError, BrokenPipeError):
        return "closed" if not got else "answered, then closed"
    except socket.timeout:
        pass
    return "open"


def send(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        raise Answer("closed") from None
    except socket.timeout:
        raise Answer("send blocked") from None


def still_served(s: socket.socket, correlation_id: int = 4242) -> bool:
    """An ApiVersions round trip on the connection works."""
    try:
        send(s, h.api_versions_frame(correlation_id))
        return read_response(s)[0] == correlation_id
    except Answer:
        return False


# ------------------------------------------------------------------ the driver


class Driver:
    """Runs the lanes; ``executions`` and ``bursts`` are the record."""

    def __init__(self, spec: HostileSpec) -> None:
        self.spec = spec
        self.executions: list[Execution] = []
        self.bursts: list[dict] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.may_connect = threading.Event()
        self.may_connect.set()
        self.started = time.monotonic()
        self.deadline = self.started + spec.duration_s
        self.case_numbers: dict[str, int] = {}

    # -- bookkeeping

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def may_start(self, first_round: bool) -> bool:
        """Start another execution? Until the deadline; a lane's first round (every
        case once) may run on past it, up to ``grace_s``."""
        return self.remaining() > (-self.spec.grace_s if first_round else 0)

    def case_number(self, case: str) -> int:
        with self._lock:
            return self.case_numbers.setdefault(case, 1000 + len(self.case_numbers))

    def run_case(self, case: str, expected: str, body: Callable[[Execution, int, int], None],
                 reason: str | None = None) -> Execution:
        """Run ``body(ex, conn, req)``; it sets ``ex.answer`` (or raises Answer)."""
        self.may_connect.wait(120)
        with self._lock:
            req = self._counts.get(case, 0)
            self._counts[case] = req + 1
        ex = Execution(case, expected, reason=reason, t0=time.time())
        try:
            body(ex, self.case_number(case), req)
        except Answer as a:
            ex.answer = str(a)
        except OSError as exc:
            ex.answer = f"client error: {type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a bug here is reported, not fatal to the run
            ex.answer = f"driver error: {type(exc).__name__}: {exc}"
        ex.t1 = time.time()
        with self._lock:
            self.executions.append(ex)
        return ex

    # -- cases with a closed connection as the answer

    def closed_case(self, case: str, data: bytes, reason: str, wait_s: float = ANSWER_TIMEOUT_S,
                    within_s: float | None = None) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            s = connect(self.spec)
            try:
                ex.ports.append(s.getsockname()[1])
                started = time.monotonic()
                send(s, data)
                ex.answer = wait_closed(s, wait_s)
                took = time.monotonic() - started
                ex.detail = f"{took:.2f} s"
                if ex.answer == "closed" and within_s is not None and took > within_s:
                    ex.answer = f"closed after {took:.1f} s (expected within {within_s:.1f} s)"
            finally:
                s.close()

        return self.run_case(case, "closed", body, reason)

    def quick_lane(self) -> None:
        sp = self.spec
        recv_timeout_s = sp.receive_timeout_ms / 1000
        cases = [
            lambda: self.closed_case("size: negative", _SIZE.pack(-1),
                                     r"invalid receive: negative frame size -1"),
            lambda: self.closed_case("size: over socket.request.max.bytes",
                                     _SIZE.pack(sp.socket_request_max_bytes + 1) + b"x" * 100,
                                     rf"frame size {sp.socket_request_max_bytes + 1} bytes is larger than "
                                     rf"socket\.request\.max\.bytes {sp.socket_request_max_bytes}"),
            lambda: self.closed_case("size: larger than the pool", _SIZE.pack(sp.pool_bytes + 1) + b"x" * 100,
                                     rf"frame size {sp.pool_bytes + 1} bytes is larger than the whole memory "
                                     rf"pool \(queued\.max\.request\.bytes {sp.pool_bytes}\)",
                                     within_s=recv_timeout_s / 2),
            lambda: self.closed_case("header: truncated inside the client id",
                                     _frame(struct.pack(">hhih", 0, 9, 21, 20) + b"abc"),
                                     r"invalid request: bad client_id in request header \(api_key=0, "
                                     r"correlation_id=21\)"),
            lambda: self.closed_case("api key: unknown (9999)", h.raw_frame(9999, 0, 31),
                                     r"invalid request: unknown api key 9999$"),
            lambda: self.closed_case("api key: unknown (-1)", h.raw_frame(-1, 0, 31),
                                     r"invalid request: unknown api key -1$"),
            lambda: self.closed_case("api key: known, not served (DeleteRecords v0)",
                                     h.raw_frame(21, 0, 32, b"\x00" * 40),
                                     r"api key 21 \(delete_records\) is not served"),
            lambda: self.closed_case("api version: Produce v2", h.raw_frame(0, 2, 33, b"\x00" * 20),
                                     r"produce v2 is not supported, only v3-v11 \(correlation_id=33\)"),
            lambda: self.closed_case("api version: Produce v99", h.raw_frame(0, 99, 33, b"\x00" * 21),
                                     r"produce v99 is not supported, only v3-v11 \(correlation_id=33\)"),
            lambda: self.closed_case("api version: Metadata v13", h.raw_frame(3, 13, 33, b"\x00" * 21),
                                     r"metadata v13 is not supported, only v0-v12 \(correlation_id=33\)"),
            self.api_versions_v99,
            self.invalid_topic_metadata,
            self.invalid_topic_produce,
            *[(lambda name=name, make=make, code=code: self.bad_batch(name, make, code))
              for name, make, code in h.RECORD_BATCH_CASES],
            self.zstd_before_v7,
            self.bad_batch_acks_0,
            self.lying_body_length,
        ]
        first = True
        while first or self.remaining() > 0:
            for case in cases:
                if not self.may_start(first):
                    break
                case()
                time.sleep(sp.pause_s)
            first = False

    # -- cases answered with error codes

    def api_versions_v99(self) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            with connect(self.spec) as s:
                ex.ports.append(s.getsockname()[1])
                send(s, h.raw_frame(18, 99, 34, b"\x00" + b"\x05future\x00"))
                cid, rest = read_response(s)
                code = h.decode_api_versions_error(rest)
                ex.answer = f"error {code}" + ("" if still_served(s) else ", then not served")

        return self.run_case("api version: ApiVersions v99", f"error {h.UNSUPPORTED_VERSION}", body)

    def invalid_topic_metadata(self) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            with connect(self.spec) as s:
                ex.ports.append(s.getsockname()[1])
                send(s, h.metadata_frame(h.INVALID_TOPIC_NAMES, 41, auto_create=True))
                cid, rest = read_response(s)
                codes = h.decode_metadata_errors(rest)
                got = sorted({codes.get(n, -1) for n in h.INVALID_TOPIC_NAMES})
                ex.answer = " ".join(f"error {c}" for c in got)

        return self.run_case("topic: invalid names in Metadata", f"error {h.INVALID_TOPIC_EXCEPTION}", body)

    def invalid_topic_produce(self) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            with connect(self.spec) as s:
                ex.ports.append(s.getsockname()[1])
                got = set()
                for i, name in enumerate(h.INVALID_TOPIC_NAMES):
                    records = h.batch([b"reject:topic:%d" % i], h.keys(conn, req * 10 + i, 1))
                    send(s, h.produce_frame(records, 50 + i, name))
                    got.add(h.decode_produce(read_response(s)[1])[0])
                ex.answer = " ".join(f"error {c}" for c in sorted(got))

        return self.run_case("topic: Produce to invalid names", f"error {h.UNKNOWN_TOPIC_OR_PARTITION}", body)

    def bad_batch(self, name: str, make: Callable[[int, int], bytes], code: int, version: int = 9) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            records = make(conn, req)
            with connect(self.spec) as s:
                ex.ports.append(s.getsockname()[1])
                send(s, h.produce_frame(records, 61, self.spec.topic, version=version))
                got, base = h.decode_produce(read_response(s)[1], version)
                if got == 0:
                    ex.acked.append([conn, req, _count(records), base])
                ex.answer = f"error {got}" + ("" if still_served(s) else ", then not served")

        return self.run_case(name, f"error {code}", body)

    def zstd_before_v7(self) -> Execution:
        return self.bad_batch("batch: zstd on Produce v6",
                              lambda conn, req: h.batch([b"reject:zstd:%d" % i for i in range(3)],
                                                        h.keys(conn, req, 3), codec=4),
                              h.UNSUPPORTED_COMPRESSION_TYPE, version=6)

    def bad_batch_acks_0(self) -> Execution:
        conn, req = self.case_number("batch: bad CRC with acks=0"), self._counts.get("batch: bad CRC with acks=0", 0)
        return self.closed_case("batch: bad CRC with acks=0",
                                h.produce_frame(h.bad_crc(conn, req), 81, self.spec.topic, acks=0),
                                r"acks=0 produce failed for 1 partition\(s\), first error code 2")

    def lying_body_length(self) -> Execution:
        conn, req = self.case_number("body: records length lies"), self._counts.get("body: records length lies", 0)
        return self.closed_case("body: records length lies",
                                h.lying_body_length_frame(conn, req, self.spec.topic, 91),
                                r"invalid request \(api key 0 v9, correlation id 91\): cannot parse produce v9 "
                                r"request body .*exceeds the \d+ bytes remaining")

    # -- slow cases

    def slow_lane(self) -> None:
        sp = self.spec
        recv_s, send_s = sp.receive_timeout_ms / 1000, sp.send_timeout_ms / 1000
        first = True
        while first or self.remaining() > 0:
            if self.may_start(first):
                self.one_byte_at_a_time()
            if self.may_start(first) and (first or self.remaining() > recv_s + 2):
                self.frame_never_completed()
            if self.may_start(first) and (first or self.remaining() > send_s + 3):
                self.never_reads()
            first = False
            time.sleep(sp.pause_s)

    def one_byte_at_a_time(self) -> Execution:
        def body(ex: Execution, conn: int, req: int) -> None:
            values = [b"slow:%d" % i for i in range(3)]
            records = h.batch(values, h.keys(conn, req, 3))
            frame = h.produce_frame(records, 11, self.spec.topic)
            pause = min(0.004, self.spec.receive_timeout_ms / 1000 * 0.5 / len(frame))
            with connect(self.spec) as s:
                ex.ports.append(s.getsockname()[1])
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for i in range(len(frame)):
                    send(s, frame[i:i + 1])
                    time.sleep(pause)
                cid, rest = read_response(s)
                code, base = h.decode_produce(rest)
                if code == 0:
                    ex.acked.append([conn, req, len(values), base])
                ex.answer = f"error {code}" if code else "acknowledged"
                ex.detail = f"{len(frame)} bytes, 1 per send"

        return self.run_case("slow: 1 byte at a time", "acknowledged", body)

    def frame_never_completed(self) -> Execution:
        sp = self.spec
        t = sp.receive_timeout_ms / 1000
        size = sp.stall_frame_bytes

        def body(ex: Execution, conn: int, req: int) -> None:
            with connect(sp) as s:
                ex.ports.append(s.getsockname()[1])
                started = time.monotonic()
                send(s, _SIZE.pack(size) + b"y" * 1000)
                answer = wait_closed(s, t + 10)
                took = time.monotonic() - started
                ex.detail = f"closed after {took:.2f} s"
                if answer == "closed" and not t * 0.9 <= took < t + 5:
                    answer = f"closed after {took:.1f} s (receive timeout {t:g} s)"
                ex.answer = answer

        return self.run_case("slow: frame never completed", "closed", body,
                             rf"request frame not completed within {sp.receive_timeout_ms} ms "
                             rf"\(\d+ bytes received, frame size {size}\)")

    def never_reads(self) -> Execution:
        sp = self.spec
        names = [f"absent-{i:04d}-" + "n" * 180 for i in range(800)]
        request = h.metadata_frame(names, 0, auto_create=False)

        def body(ex: Execution, conn: int, req: int) -> None:
            s = connect(sp, sockopts=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096),
                                      (socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)])
            try:
                ex.ports.append(s.getsockname()[1])
                s.setblocking(False)
                blocked_since = 0.0
                sent = requests = 0
                pending = memoryview(request)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and requests < 200:
                    try:
                        n = s.send(pending)
                    except BlockingIOError:
                        n = 0
                    except (ConnectionResetError, BrokenPipeError):
                        raise Answer("closed while still being read") from None
                    if n:
                        sent += n
                        blocked_since = 0.0
                        pending = pending[n:]
                        if not pending:
                            requests += 1
                            pending = memoryview(request)
                        continue
                    if not blocked_since:
                        blocked_since = time.monotonic()
                    elif time.monotonic() - blocked_since > 1.0:
                        break
                    time.sleep(0.01)
                if not blocked_since or time.monotonic() - blocked_since <= 1.0:
                    raise Answer(f"kept reading ({requests} requests, {sent} bytes)")
                s.setblocking(True)
                closed = _closed_without_reading(s, sp.send_timeout_ms / 1000 + 1.5, 10.0)
                ex.detail = f"{requests} requests, {sent} bytes sent before the server stopped reading"
                ex.answer = "paused, then closed" if closed else "paused, never closed"
            finally:
                s.close()

        return self.run_case("slow: never reads its responses", "paused, then closed", body,
                             rf"client did not read its responses for {sp.send_timeout_ms} ms "
                             rf"\(\d+ bytes unsent\)")

    # -- the memory attack

    def memory_lane(self) -> None:
        sp = self.spec
        per_conn_s = sp.receive_timeout_ms / 1000 + 1.5
        first = True
        while first or self.remaining() > per_conn_s * 2:
            n = min(sp.memory_attack_connections, max(1, int(self.remaining() // per_conn_s)))
            self.memory_attack(n)
            first = False
            time.sleep(1.0)

    def memory_attack(self, n: int) -> Execution:
        sp = self.spec
        t = sp.receive_timeout_ms / 1000
        payload = memoryview(b"m" * sp.memory_attack_sent_bytes)
        header = _SIZE.pack(sp.memory_attack_declared_bytes)

        def body(ex: Execution, conn: int, req: int) -> None:
            round_bound = n * (t + 3) + 30
            answers: list[str] = [""] * n
            socks: list[socket.socket] = []
            for _ in range(n):
                s = connect(sp, timeout_s=round_bound)
                socks.append(s)
                ex.ports.append(s.getsockname()[1])

            def attacker(i: int, s: socket.socket) -> None:
                try:
                    started = time.monotonic()
                    s.sendall(header)
                    s.sendall(payload)
                    answers[i] = wait_closed(s, max(1.0, round_bound - (time.monotonic() - started)))
                except (ConnectionResetError, BrokenPipeError):
                    answers[i] = "closed while sending"
                except socket.timeout:
                    answers[i] = "send blocked past the round bound"
                except OSError as exc:
                    answers[i] = f"client error: {exc}"

            threads = [threading.Thread(target=attacker, args=(i, s), daemon=True) for i, s in enumerate(socks)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(round_bound + 15)
            for s in socks:
                s.close()
            closed = sum(a == "closed" for a in answers)
            others = sorted({a for a in answers if a != "closed"})
            ex.answer = "closed" if closed == n else f"{closed}/{n} closed; others: {', '.join(others)}"
            ex.detail = (f"{n} connections x {sp.memory_attack_sent_bytes // h.MiB} MiB of a declared "
                         f"{sp.memory_attack_declared_bytes // h.MiB} MiB frame")

        return self.run_case("memory: many connections stalling in big frames", "closed", body,
                             rf"request frame not completed within {sp.receive_timeout_ms} ms "
                             rf"\(\d+ bytes received, frame size {sp.memory_attack_declared_bytes}\)")

    # -- the burst

    def burst_lane(self) -> None:
        sp = self.spec
        size = sp.burst_connections
        while self.remaining() > 0:
            started = time.monotonic()
            self.burst(size)
            size = sp.burst_repeat_connections
            while self.remaining() > 0 and time.monotonic() - started < sp.burst_every_s:
                time.sleep(0.2)

    def burst(self, total: int) -> Execution:
        sp = self.spec
        record: dict[str, float] = {"connections": total, "connected": 0, "refused": 0, "connect_failures": 0}

        def body(ex: Execution, conn: int, req: int) -> None:
            linger_rst = struct.pack("ii", 1, 0)
            started = time.monotonic()
            self.may_connect.clear()
            try:
                # connections the lanes opened just before must be accepted first
                while _Opening.quiet_for() < BURST_QUIET_S and time.monotonic() - started < 15:
                    time.sleep(0.05)
                done = 0
                while done < total and time.monotonic() - started < 120:
                    wave = min(BURST_WAVE, total - done)
                    done += wave
                    socks = []
                    for _ in range(wave):
                        s = socket.socket()
                        s.settimeout(5)
                        try:
                            s.connect((sp.host, sp.port))
                        except OSError:
                            record["connect_failures"] += 1
                            s.close()
                            continue
                        socks.append(s)
                    record["connected"] += len(socks)
                    record["refused"] += _count_closed(socks, max(1, len(socks) - sp.max_connections), 2.0)
                    for s in socks:  # dropped: reset, not a polite close
                        try:
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_rst)
                        except OSError:
                            pass
                        s.close()
                record["opened_and_dropped"] = done
                record["burst_s"] = time.monotonic() - started
                # every slot comes back: a new connection is admitted and served. The
                # other lanes wait for that and BURST_QUIET_S more: the server releases
                # the dropped connections' slots as it notices the resets, and until
                # then a new connection is refused at accept (over max.connections).
                deadline = time.monotonic() + 20
                while True:
                    try:
                        with connect(sp, timeout_s=5) as s:
                            if still_served(s, 61):
                                ex.answer = "served after the burst"
                                break
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        ex.answer = "not served within 20 s after the burst"
                        break
                    time.sleep(0.5)
                time.sleep(BURST_QUIET_S)
            finally:
                self.may_connect.set()
            ex.detail = (f"{record['opened_and_dropped']} opened and dropped in {record['burst_s']:.1f} s: "
                         f"{record['connected']} connected, {record['refused']} closed by the server at once, "
                         f"{record['connect_failures']} connect failures")
            if record["opened_and_dropped"] < total:
                ex.answer = f"burst cut short by its time bound ({record['opened_and_dropped']} of {total})"

        ex = self.run_case(f"burst: {BURST_WAVE}-connection waves opened and dropped", "served after the burst",
                           body)
        with self._lock:
            self.bursts.append(record)
        return ex

    # -- running

    def create_topic(self) -> None:
        """Metadata with auto-creation for the hostile topic (Produce does not create topics)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with connect(self.spec) as s:
                    send(s, h.metadata_frame([self.spec.topic], 1, auto_create=True))
                    if h.decode_metadata_errors(read_response(s)[1]).get(self.spec.topic) == 0:
                        return
            except (Answer, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {self.spec.topic!r} could not be created")
            time.sleep(0.5)

    def run(self) -> dict:
        self.create_topic()
        lanes = [self.quick_lane, self.slow_lane, self.memory_lane, self.burst_lane]
        threads = [threading.Thread(target=self._guard, args=(lane,), name=lane.__name__, daemon=True)
                   for lane in lanes]
        for th in threads:
            th.start()
        hard = self.deadline + self.spec.grace_s + self.spec.memory_attack_connections * (
            self.spec.receive_timeout_ms / 1000 + 3) + 60
        for th in threads:
            th.join(max(0.0, hard - time.monotonic()))
        still = [th.name for th in threads if th.is_alive()]
        if still:
            self.errors.append(f"lanes still running at the hard bound: {', '.join(still)}")
        with self._lock:
            executions = sorted(self.executions, key=lambda e: e.t0)
        return {
            "spec": asdict(self.spec),
            "elapsed_s": time.monotonic() - self.started,
            "errors": self.errors,
            "case_numbers": self.case_numbers,
            "bursts": self.bursts,
            "executions": [{**asdict(e), "ok": e.ok} for e in executions],
        }

    def _guard(self, lane: Callable[[], object]) -> None:
        try:
            lane()
        except Exception as exc:  # noqa: BLE001 - reported in the result
            self.errors.append(f"{lane.__name__}: {type(exc).__name__}: {exc}")


def _frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


def _count(records: bytes) -> int:
    """Records of a v2 batch (its count field), for acknowledged hostile batches."""
    return struct.unpack_from(">i", records, h.COUNT_OFFSET)[0]


def _closed_without_reading(s: socket.socket, wait_s: float, read_s: float) -> bool:
    """Whether the server has closed ``s`` after ``wait_s`` without a byte read (the
    send timeout and a margin), reading (and dropping) what it sent only then, for
    at most ``read_s``: reading earlier would let its writes progress."""
    time.sleep(wait_s)
    s.settimeout(read_s)
    try:
        while True:
            if not s.recv(1 << 20):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _count_closed(socks: list[socket.socket], want: int, timeout_s: float) -> int:
    """How many of ``socks`` the server closes (EOF or reset) within ``timeout_s``;
    stops early once ``want`` have been."""
    import selectors

    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, s)
    closed = 0
    deadline = time.monotonic() + timeout_s
    try:
        while closed < want and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.1):
                try:
                    data = key.data.recv(1)  # the socket, registered as the key's data
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                if data == b"":
                    closed += 1
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
    return closed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m pipeline.bench.hostile_clients SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = HostileSpec(**json.loads(Path(argv[0]).read_text()))
    print("START", flush=True)
    result = Driver(spec).run()
    tmp = Path(argv[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, separators=(",", ":")))
    tmp.replace(argv[1])
    print("END", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
