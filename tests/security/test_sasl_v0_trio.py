"""SaslHandshake v0 and its raw SASL tokens (KIP-43), through the real connection.

librdkafka before 2.10 (Debian 12's kcat, confluent-kafka wheels before ~2.10)
uses SaslHandshake v0 whenever the broker lists it, and then sends each SASL
token as a bare size-prefixed frame, expecting a bare frame back (Kafka's
``SaslServerAuthenticator`` without SaslAuthenticate headers). Here a client
speaks that over trio memory streams to the real ``Processor`` /
``KafkaChannel`` / ``ConnectionState``, a real ``RequestHandler`` running
``KafkaApis`` with ``SaslApis``, and a real ``UserStore``; pytest-trio's
autojump clock makes the failure delay virtual time.
"""

from __future__ import annotations

import struct

import pytest
import scramp
import trio
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from pipeline.bench.frames import encode_request
from pipeline.log.manager import LogManager
from pipeline.network.channel import ANONYMOUS
from pipeline.network.framing import encode_frame
from pipeline.network.listeners import Listener
from pipeline.protocol.apis import BrokerInfo
from pipeline.protocol.header import response_header_version
from pipeline.requests.catalog import TopicCatalog
from pipeline.requests.handler import KafkaApis, RequestHandler
from pipeline.security.sasl import FailedAuthenticationThrottle
from pipeline.requests.sasl_apis import SaslApis
from pipeline.security.users import UserStore
from tests.network.trio_harness import serving

pytestmark = pytest.mark.trio

HANDSHAKE, AUTHENTICATE, METADATA, API_VERSIONS = 17, 36, 3, 18
NONE, AUTH_FAILED = 0, 58
SASL_PLAINTEXT = Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT")


class Wire:
    """The client end of one connection: requests and raw frames out, frames in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buf = bytearray()
        self._cid = 0

    async def send_raw(self, token: bytes) -> None:
        await self.stream.send_all(encode_frame(token))

    async def frame(self) -> bytes | None:
        """The next frame's body; None once the server closed the connection."""
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack_from(">i", self._buf)
                if len(self._buf) >= 4 + size:
                    body = bytes(self._buf[4:4 + size])
                    del self._buf[:4 + size]
                    return body
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return None
            self._buf += data

    def request(self, api_key: int, version: int, **fields) -> bytes:
        self._cid += 1
        return encode_request(load_request_schema(api_key, version)(**fields), self._cid, "v0-test")

    async def call(self, api_key: int, version: int, **fields):
        """Send one request; its decoded response (None: the connection closed instead)."""
        await self.stream.send_all(self.request(api_key, version, **fields))
        body = await self.frame()
        if body is None:
            return None
        assert struct.unpack_from(">i", body)[0] == self._cid
        offset = 4 + (1 if response_header_version(api_key, version) >= 1 else 0)
        return entity_reader(load_response_schema(api_key, version))(body, offset)[0]

    async def metadata(self):
        return await self.call(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                               include_topic_authorized_operations=False)


class Broker:
    """A Processor serving in-memory connections, handled by a real RequestHandler with SASL."""

    def __init__(self, harness, users: UserStore, delay_ms: int) -> None:
        self.harness = harness
        self.apis = KafkaApis(BrokerInfo(0, "127.0.0.1", 9092, "test"), TopicCatalog(initial={"t": 1}),
                              LogManager(), persister=None, first_producer_id=1)  # type: ignore[arg-type]
        self.sasl = SaslApis(users, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                             FailedAuthenticationThrottle(delay_ms))
        self.sasl.register(self.apis)

    async def connect(self):
        client, channel = await self.harness.connect(read=False, listener=SASL_PLAINTEXT)
        return Wire(client.stream), channel


@pytest.fixture
def users(tmp_path):
    store = UserStore(tmp_path / "users.db")
    store.add("alice", "pw-alice", iterations=4096)
    return store


class serve_broker:
    """``async with serve_broker(users) as broker``: a Broker serving until the block ends."""

    def __init__(self, users: UserStore, delay_ms: int = 0) -> None:
        self.users, self.delay_ms = users, delay_ms

    async def __aenter__(self) -> Broker:
        self._serving = serving(handler_count=0)
        harness = await self._serving.__aenter__()
        broker = Broker(harness, self.users, self.delay_ms)
        await harness.nursery.start(broker.sasl.run)
        await harness.nursery.start(RequestHandler(0, broker.apis, harness.request_channel).run)
        return broker

    async def __aexit__(self, *exc) -> None:
        await self._serving.__aexit__(*exc)


async def test_v0_handshake_then_a_raw_plain_token_then_requests(users, autojump_clock):
    async with serve_broker(users) as broker:
        wire, channel = await broker.connect()
        versions = await wire.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
        assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[HANDSHAKE] == (0, 1)
        handshake = await wire.call(HANDSHAKE, 0, mechanism="PLAIN")
        assert handshake.error_code == NONE and "PLAIN" in handshake.mechanisms
        await wire.send_raw(b"\0alice\0pw-alice")
        assert await wire.frame() == b""  # PLAIN's server token: empty, still a frame (librdkafka waits for it)
        assert channel.principal == "User:alice"
        assert [t.name for t in (await wire.metadata()).topics] == ["t"]
        # Authenticated: a further handshake is ILLEGAL_SASL_STATE and the connection stays open, as over v1.
        assert (await wire.call(HANDSHAKE, 0, mechanism="PLAIN")).error_code == 34
        assert [t.name for t in (await wire.metadata()).topics] == ["t"]
        assert broker.sasl.successful_by_listener == {"SASL_PLAINTEXT": 1}


async def test_v0_handshake_and_token_pipelined_in_one_write(users, autojump_clock):
    """A client that does not wait for the handshake's answer: the token is still read as a token."""
    async with serve_broker(users) as broker:
        wire, channel = await broker.connect()
        await wire.stream.send_all(wire.request(HANDSHAKE, 0, mechanism="PLAIN") + encode_frame(b"\0alice\0pw-alice"))
        assert struct.unpack_from(">i", await wire.frame())[0] == 1  # the handshake's answer
        assert await wire.frame() == b""
        assert channel.principal == "User:alice"
        assert [t.name for t in (await wire.metadata()).topics] == ["t"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_v0_handshake_then_a_raw_scram_exchange(users, autojump_clock, mechanism):
    async with serve_broker(users) as broker:
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 0, mechanism=mechanism)).error_code == NONE
        client = scramp.ScramClient([mechanism], "alice", "pw-alice")
        await wire.send_raw(client.get_client_first().encode())
        client.set_server_first((await wire.frame()).decode())
        assert channel.principal == ANONYMOUS  # not yet
        await wire.send_raw(client.get_client_final().encode())
        client.set_server_final((await wire.frame()).decode())  # raises if the server signature is wrong
        assert channel.principal == "User:alice"
        assert [t.name for t in (await wire.metadata()).topics] == ["t"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_over_v0_gets_no_answer_and_a_close_after_the_delay(users, autojump_clock, caplog,
                                                                                  mechanism):
    async with serve_broker(users, delay_ms=100) as broker:
        good, good_channel = await broker.connect()
        assert (await good.call(HANDSHAKE, 0, mechanism="PLAIN")).error_code == NONE
        await good.send_raw(b"\0alice\0pw-alice")
        assert await good.frame() == b""
        for expected_delay in (0.1, 0.2):  # the delay grows with the address's failures (KIP-306)
            wire, channel = await broker.connect()
            assert (await wire.call(HANDSHAKE, 0, mechanism=mechanism)).error_code == NONE
            if mechanism == "PLAIN":
                await wire.send_raw(b"\0alice\0not-the-password")
            else:
                client = scramp.ScramClient([mechanism], "alice", "not-the-password")
                await wire.send_raw(client.get_client_first().encode())
                client.set_server_first((await wire.frame()).decode())  # the first step looks normal
                await wire.send_raw(client.get_client_final().encode())
            start = trio.current_time()
            assert await wire.frame() is None  # closed, no answer: a raw token has no error field
            assert trio.current_time() - start == pytest.approx(expected_delay, abs=0.02)
            assert channel.principal == ANONYMOUS
        assert broker.sasl.failures == 2 and broker.sasl.failed_by_listener == {"SASL_PLAINTEXT": 2}
        assert [t.name for t in (await good.metadata()).topics] == ["t"]  # the good one carries on
        assert good_channel.principal == "User:alice"
    text = caplog.text
    assert "failed authentication from 10.0.0.1" in text and "principal tried User:alice" in text
    assert "not-the-password" not in text and "pw-alice" not in text


async def test_a_sasl_authenticate_request_after_a_v0_handshake_is_refused(users, autojump_clock, caplog):
    """After v0 every frame is a raw token (Kafka: no SaslAuthenticate headers): a SaslAuthenticate
    request is a token no mechanism accepts, so it gets no SaslAuthenticate answer and the connection
    closes; even one that wraps the right PLAIN password does not log in."""
    async with serve_broker(users) as broker:
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 0, mechanism="PLAIN")).error_code == NONE
        assert await wire.call(AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-alice") is None
        assert channel.principal == ANONYMOUS and broker.sasl.failures == 1
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 0, mechanism="SCRAM-SHA-256")).error_code == NONE
        client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "pw-alice")
        assert await wire.call(AUTHENTICATE, 1, auth_bytes=client.get_client_first().encode()) is None
        assert channel.principal == ANONYMOUS and broker.sasl.failures == 2
    assert "pw-alice" not in caplog.text


async def test_the_v1_path_is_unchanged(users, autojump_clock):
    async with serve_broker(users) as broker:
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 1, mechanism="SCRAM-SHA-512")).error_code == NONE
        client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", "pw-alice")
        first = await wire.call(AUTHENTICATE, 2, auth_bytes=client.get_client_first().encode())
        assert first.error_code == NONE
        client.set_server_first(first.auth_bytes.decode())
        final = await wire.call(AUTHENTICATE, 2, auth_bytes=client.get_client_final().encode())
        assert final.error_code == NONE
        client.set_server_final(final.auth_bytes.decode())
        assert channel.principal == "User:alice"
        assert [t.name for t in (await wire.metadata()).topics] == ["t"]
        # A wrong password over v1 is still answered SASL_AUTHENTICATION_FAILED, then closed.
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 1, mechanism="PLAIN")).error_code == NONE
        failed = await wire.call(AUTHENTICATE, 2, auth_bytes=b"\0alice\0wrong")
        assert failed.error_code == AUTH_FAILED and await wire.frame() is None
        # A raw token after a v1 handshake is not a request: the connection closes without an answer.
        wire, channel = await broker.connect()
        assert (await wire.call(HANDSHAKE, 1, mechanism="PLAIN")).error_code == NONE
        await wire.send_raw(b"\0alice\0pw-alice")
        assert await wire.frame() is None and channel.principal == ANONYMOUS
