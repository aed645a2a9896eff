"""SASL and SCRAM-credential apis in-process, through ``KafkaApis.handle``.

Requests are encoded with kio as a client would, parsed with the server's
header parser and handled by a real ``KafkaApis`` with ``SaslApis`` registered;
connections are recorders whose ``security_protocol`` the test sets, as the
TLS engineer's listeners do. Responses are decoded with kio's readers.
"""

from __future__ import annotations

import hashlib

import pytest
import scramp
import trio
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from pipeline.bench.frames import encode_request
from pipeline.log.manager import LogManager
from pipeline.network.channel import ANONYMOUS
from pipeline.protocol.apis import BrokerInfo
from pipeline.protocol.header import parse_request_header, response_header_version
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import Request
from pipeline.requests.handler import KafkaApis
from pipeline.security.sasl import FailedAuthenticationThrottle
from pipeline.requests.sasl_apis import SaslApis
from pipeline.security.users import UserStore

pytestmark = pytest.mark.trio

NONE, UNSUPPORTED_MECHANISM, ILLEGAL_STATE, AUTH_FAILED = 0, 33, 34, 58
RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL = 91, 92, 93
HANDSHAKE, AUTHENTICATE, METADATA, API_VERSIONS, DESCRIBE_SCRAM, ALTER_SCRAM = 17, 36, 3, 18, 50, 51


class Connection:
    """A ConnectionHandle that records responses and closes."""

    def __init__(self, protocol: str = "SASL_PLAINTEXT", host: str = "10.0.0.1") -> None:
        self.connection_id = f"127.0.0.1:9092-{host}:5000-0"
        self.client_software = None
        self.listener = protocol
        self.security_protocol = protocol
        self.principal = ANONYMOUS
        self.peer_host = host
        self.completed: list[tuple[int, bytes | None]] = []
        self.closed: list[str] = []

    def complete(self, token: int, payload: bytes | None) -> None:
        self.completed.append((token, payload))

    def close(self, reason: str) -> None:
        self.closed.append(reason)

    def authenticated(self, principal: str) -> None:
        self.principal = principal

    def identified(self, software: tuple[str, str]) -> None:
        self.client_software = software


class Broker:
    def __init__(self, tmp_path, delay_ms: int = 0) -> None:
        self.users = UserStore(tmp_path / "users.db")
        self.users.add("alice", "pw-alice", iterations=4096)
        # Only Metadata of the non-SASL apis is used here: no persister needed.
        self.apis = KafkaApis(BrokerInfo(0, "127.0.0.1", 9092, "test"), TopicCatalog(initial={"t": 1}),
                              LogManager(), persister=None, first_producer_id=1)  # type: ignore[arg-type]
        self.sasl = SaslApis(self.users, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                             FailedAuthenticationThrottle(delay_ms))
        self.sasl.register(self.apis)
        self._cid = 0

    async def call(self, connection: Connection, api_key: int, version: int, **fields):
        """Handle one request; its decoded response, or None if it got none."""
        self._cid += 1
        entity = _build(load_request_schema(api_key, version), fields)
        frame = encode_request(entity, self._cid, "sasl-test")[4:]
        before = len(connection.completed)
        await self.apis.handle(Request(connection, parse_request_header(frame), frame, self._cid))
        return self.response(connection, api_key, version, before)

    @staticmethod
    def response(connection, api_key, version, index):
        if len(connection.completed) <= index or connection.completed[index][1] is None:
            return None
        payload = connection.completed[index][1]
        offset = 4 + (1 if response_header_version(api_key, version) >= 1 else 0)
        return entity_reader(load_response_schema(api_key, version))(payload, offset)[0]

    async def scram(self, connection, mechanism, user, password, version=2):
        assert (await self.call(connection, HANDSHAKE, 1, mechanism=mechanism)).error_code == NONE
        client = scramp.ScramClient([mechanism], user, password)
        first = await self.call(connection, AUTHENTICATE, version, auth_bytes=client.get_client_first().encode())
        assert first.error_code == NONE
        client.set_server_first(first.auth_bytes.decode())
        final = await self.call(connection, AUTHENTICATE, version, auth_bytes=client.get_client_final().encode())
        if final is not None and final.error_code == NONE:
            client.set_server_final(final.auth_bytes.decode())
        return final


def _build(cls, fields: dict):
    import typing

    hints = typing.get_type_hints(cls)
    out = {}
    for name, value in fields.items():
        if isinstance(value, list):
            args = [a for a in typing.get_args(hints[name]) if a is not type(None)]
            inner = typing.get_args(args[0])[0] if args and typing.get_args(args[0]) else typing.get_args(hints[name])[0]
            value = tuple(_build(inner, v) if isinstance(v, dict) else v for v in value)
        out[name] = value
    return cls(**out)


async def metadata(broker, connection):
    return await broker.call(connection, METADATA, 12, topics=None, allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("version", [0, 1, 2])
async def test_scram_then_other_apis_are_served(tmp_path, mechanism, version):
    broker = Broker(tmp_path)
    c = Connection()
    versions = await broker.call(c, API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    assert {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}[HANDSHAKE] == (0, 1)
    final = await broker.scram(c, mechanism, "alice", "pw-alice", version)
    assert final.error_code == NONE and c.principal == "User:alice" and not c.closed
    assert [t.name for t in (await metadata(broker, c)).topics] == ["t"]
    # Kafka KafkaApis.handleSaslHandshakeRequest/-Authenticate after authentication: ILLEGAL_SASL_STATE, stays open.
    assert (await broker.call(c, HANDSHAKE, 1, mechanism="PLAIN")).error_code == ILLEGAL_STATE
    assert (await broker.call(c, AUTHENTICATE, version, auth_bytes=b"x")).error_code == ILLEGAL_STATE
    assert not c.closed


async def test_plain_and_refusal_before_authentication(tmp_path):
    broker = Broker(tmp_path)
    early = Connection()
    assert await metadata(broker, early) is None
    assert early.closed and "ILLEGAL_SASL_STATE" in early.closed[0]
    c = Connection()
    assert (await broker.call(c, HANDSHAKE, 1, mechanism="PLAIN")).mechanisms == (
        "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    assert await metadata(broker, c) is None and c.closed  # after the handshake, before the token
    c = Connection()
    await broker.call(c, HANDSHAKE, 1, mechanism="PLAIN")
    assert (await broker.call(c, AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-alice")).error_code == NONE
    assert c.principal == "User:alice"
    assert (await metadata(broker, c)).topics[0].name == "t"


async def test_failures_close_only_their_connection(tmp_path, caplog):
    broker = Broker(tmp_path)
    good = Connection(host="10.0.0.9")
    await broker.call(good, HANDSHAKE, 1, mechanism="PLAIN")
    await broker.call(good, AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-alice")
    messages = []
    for attempt in ("wrong", "unknown", "garbage"):
        bad = Connection()
        if attempt == "garbage":
            await broker.call(bad, HANDSHAKE, 1, mechanism="SCRAM-SHA-256")
            response = await broker.call(bad, AUTHENTICATE, 2, auth_bytes=b"\x00garbage\xff")
        else:
            response = await broker.scram(bad, "SCRAM-SHA-512", "alice" if attempt == "wrong" else "mallory",
                                          "not-the-password")
        assert response.error_code == AUTH_FAILED and bad.closed and bad.principal == ANONYMOUS
        messages.append(response.error_message)
        assert await metadata(broker, bad) is None  # nothing more is served
    assert messages[0] == messages[1]  # wrong password and unknown user look the same
    assert not good.closed and (await metadata(broker, good)).topics[0].name == "t"
    assert broker.sasl.failures == 3
    listener = good.listener
    assert broker.sasl.failed_by_listener == {listener: 3} and broker.sasl.successful_by_listener == {listener: 1}
    text = caplog.text
    assert "User:mallory" in text and "10.0.0.1" in text
    assert "not-the-password" not in text and "pw-alice" not in text


async def test_plaintext_connection_and_unsupported_mechanism(tmp_path):
    broker = Broker(tmp_path)
    plain = Connection("PLAINTEXT")
    response = await broker.call(plain, HANDSHAKE, 1, mechanism="PLAIN")
    assert response.error_code == ILLEGAL_STATE and not plain.closed
    assert (await broker.call(plain, AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-alice")).error_code == ILLEGAL_STATE
    assert plain.principal == ANONYMOUS and (await metadata(broker, plain)).topics[0].name == "t"
    c = Connection()
    response = await broker.call(c, HANDSHAKE, 1, mechanism="GSSAPI")
    assert response.error_code == UNSUPPORTED_MECHANISM and "PLAIN" in response.mechanisms and c.closed
    c = Connection()
    assert await broker.call(c, AUTHENTICATE, 2, auth_bytes=b"\0alice\0pw-alice") is None  # no handshake
    assert c.closed and c.principal == ANONYMOUS


async def test_failure_answer_is_delayed_per_address(tmp_path, autojump_clock):
    broker = Broker(tmp_path, delay_ms=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.sasl.run)
        for expected in (0.1, 0.2, 0.4):
            c = Connection(host="10.0.0.66")
            await broker.call(c, HANDSHAKE, 1, mechanism="PLAIN")
            start = trio.current_time()
            await broker.call(c, AUTHENTICATE, 2, auth_bytes=b"\0alice\0bad")
            assert len(c.completed) == 1 and not c.closed  # the handler did not wait
            while not c.closed:
                await trio.sleep(0.01)
            assert trio.current_time() - start == pytest.approx(expected, abs=0.02)
            assert Broker.response(c, AUTHENTICATE, 2, 1).error_code == AUTH_FAILED
        other = Connection(host="10.0.0.67")
        await broker.call(other, HANDSHAKE, 1, mechanism="PLAIN")
        start = trio.current_time()
        await broker.call(other, AUTHENTICATE, 2, auth_bytes=b"\0alice\0bad")
        while not other.closed:
            await trio.sleep(0.01)
        assert trio.current_time() - start == pytest.approx(0.1, abs=0.02)
        nursery.cancel_scope.cancel()


async def test_describe_and_alter_scram_credentials(tmp_path):
    broker = Broker(tmp_path)
    admin = Connection("PLAINTEXT")
    described = await broker.call(admin, DESCRIBE_SCRAM, 0, users=None)
    assert [(r.user, sorted((i.mechanism, i.iterations) for i in r.credential_infos)) for r in described.results] \
        == [("alice", [(1, 4096), (2, 4096)])]
    described = await broker.call(admin, DESCRIBE_SCRAM, 0, users=[{"name": "nobody"}, {"name": "alice"},
                                                                    {"name": "alice"}])
    assert {r.user: r.error_code for r in described.results} == {"nobody": RESOURCE_NOT_FOUND,
                                                                "alice": DUPLICATE_RESOURCE}
    salt = b"salt-of-bob-0001"
    salted = hashlib.pbkdf2_hmac("sha256", b"pw-bob", salt, 4096)
    altered = await broker.call(admin, ALTER_SCRAM, 0, deletions=[
        {"name": "alice", "mechanism": 2}, {"name": "ghost", "mechanism": 1}, {"name": "eve", "mechanism": 9},
    ], upsertions=[
        {"name": "bob", "mechanism": 1, "iterations": 4096, "salt": salt, "salted_password": salted},
        {"name": "weak", "mechanism": 1, "iterations": 10, "salt": salt, "salted_password": salted},
    ])
    assert {r.user: r.error_code for r in altered.results} == {
        "alice": NONE, "ghost": RESOURCE_NOT_FOUND, "eve": UNSUPPORTED_MECHANISM, "bob": NONE,
        "weak": UNACCEPTABLE_CREDENTIAL}
    assert broker.users.users() == {"alice": {"SCRAM-SHA-256": 4096}, "bob": {"SCRAM-SHA-256": 4096}}
    c = Connection()
    assert (await broker.scram(c, "SCRAM-SHA-256", "bob", "pw-bob")).error_code == NONE
    assert c.principal == "User:bob"


async def test_a_listener_offers_its_own_mechanisms(tmp_path):
    """listener.name.<name>.sasl.enabled.mechanisms (KIP-103): only that listener's list is offered there."""
    broker = Broker(tmp_path)
    broker.sasl.mechanisms_by_listener = {"SASL_SSL": ("SCRAM-SHA-512",)}
    strict = Connection("SASL_SSL")
    response = await broker.call(strict, HANDSHAKE, 1, mechanism="PLAIN")
    assert response.error_code == UNSUPPORTED_MECHANISM and response.mechanisms == ("SCRAM-SHA-512",)
    assert strict.closed
    final = await broker.scram(Connection("SASL_SSL"), "SCRAM-SHA-512", "alice", "pw-alice", 2)
    assert final.error_code == NONE
    other = Connection("SASL_PLAINTEXT")  # no override: the broker-wide list
    assert (await broker.call(other, HANDSHAKE, 1, mechanism="PLAIN")).mechanisms == (
        "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
