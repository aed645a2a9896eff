"""One connection's view: pipelined requests answered in order; bad frames close only that connection.

On the shared server of each request-path mode (tests/e2e/conftest.py), with topics of their own.
"""

from __future__ import annotations

import random
import struct
import threading
import time

import pytest

from tests.e2e import raw_client as rc
from tests.e2e.shared_server import LogCursor

pytestmark = pytest.mark.slow


PIPELINED, STEADY = "connections-pipelined", "connections-steady"


@pytest.fixture(params=["multiqueue", "baseline"])
def server(request):
    """The shared server of that mode (its SIGTERM exit code is checked at the end of the session)."""
    return request.getfixturevalue(f"{request.param}_server")


def test_pipelined_requests_are_answered_in_request_order(server):
    client = rc.RawClient(server.host, server.port)
    try:
        client.send(rc.frame(rc.metadata(PIPELINED), 1))
        assert client.read_response()[0] == 1
        # 5 in flight: produce responses wait for a Spark flush, the others are
        # answered at once, so only the sequencer keeps them in this order.
        requests = [
            rc.produce(PIPELINED, [b"a0", b"a1"]),
            rc.api_versions(),
            rc.produce(PIPELINED, [b"b0"]),
            rc.metadata(PIPELINED),
            rc.produce(PIPELINED, [b"c0", b"c1", b"c2"]),
        ]
        client.send(b"".join(rc.frame(r, 100 + i) for i, r in enumerate(requests)))
        responses = [client.read_response() for _ in requests]
        assert [cid for cid, _ in responses] == [100, 101, 102, 103, 104]
        offsets = []
        for cid in (100, 102, 104):
            produced = rc.decode_produce_response(dict(responses)[cid])
            part = produced.responses[0].partition_responses[0]
            assert part.error_code == 0
            offsets.append(part.base_offset)
        assert offsets[1] == offsets[0] + 2 and offsets[2] == offsets[1] + 1
    finally:
        client.close()


class SteadyProducer(threading.Thread):
    """A kafka-python producer sending a record every few ms until stopped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.stop_event = threading.Event()
        self.sent = 0
        self.acked = 0
        self.errors: list[str] = []

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        futures = []
        deadline = time.monotonic() + 120
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            futures.append(producer.send(STEADY, value=f"steady-{self.sent}".encode()))
            self.sent += 1
            time.sleep(0.005)
        producer.flush(60)
        for f in futures:
            try:
                f.get(timeout=30)
                self.acked += 1
            except Exception as exc:  # noqa: BLE001 - asserted by the test
                self.errors.append(repr(exc))
        producer.close(10)


def bad_inputs() -> list[tuple[str, bytes, bool]]:
    """(what, bytes to send, whether the client closes right after sending)."""
    garbage = bytes(random.Random(7).getrandbits(8) for _ in range(40))
    # a correct Metadata v9 request header (19 bytes with client id "raw-test"), then junk
    metadata_header = rc.frame(rc.metadata("x"), 9)[4 : 4 + 19]
    bad_body = metadata_header + b"\xff" * 13
    return [
        ("negative size", struct.pack(">i", -5), False),
        ("oversize", struct.pack(">i", 200 * 1024 * 1024) + b"x" * 100, False),
        ("truncated frame then close", struct.pack(">i", 1000) + b"y" * 10, True),
        ("garbage after a valid size", struct.pack(">i", len(garbage)) + b"\x7f\x7f" + garbage[2:], False),
        ("valid header, garbage body", struct.pack(">i", len(bad_body)) + bad_body, False),
    ]


def test_bad_frames_close_only_their_connection(server):
    log = LogCursor(server)
    steady = SteadyProducer(server.bootstrap)
    steady.start()
    try:
        time.sleep(2)  # producer connected and producing
        for what, data, client_closes in bad_inputs():
            client = rc.RawClient(server.host, server.port, timeout_s=15)
            try:
                client.send(data)
                if client_closes:
                    continue
                assert client.closed_by_server(), f"{what}: connection not closed by the server"
            finally:
                client.close()
            # another connection is served during and after
            other = rc.RawClient(server.host, server.port)
            other.send(rc.frame(rc.api_versions(), 77))
            assert other.read_response()[0] == 77, what
            other.close()
        sent_before = steady.sent
        time.sleep(1)
        assert steady.sent > sent_before
    finally:
        steady.stop_event.set()
        steady.join(120)
    assert steady.errors == []
    assert steady.acked == steady.sent > 0
    assert server.running
    logged = log.text()
    for reason in ("negative frame size", "socket.request.max.bytes", "truncated frame", "invalid request"):
        assert reason in logged, f"no logged reason containing {reason!r}"
