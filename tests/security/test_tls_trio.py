"""TLS listeners in process: the server context, the handshake in the Processor, mTLS principals,
the handshake deadline, and a plaintext client on a TLS port (real sockets on 127.0.0.1,
certificates made by trustme in the test)."""

from __future__ import annotations

import logging
import ssl
import struct
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trustme

from pipeline.network.acceptor import Acceptor
from pipeline.network.channel import KafkaChannel, MemoryWaiters
from pipeline.network.connection_quotas import ConnectionQuotas
from pipeline.network.connection_state import ConnectionLimits, ConnectionState
from pipeline.network.listeners import Listener
from pipeline.network.memory_pool import MemoryPool
from pipeline.network.processor import Processor
from pipeline.network.request_channel import MultiQueueRequestChannel
from pipeline.security.tls import (
    ANONYMOUS,
    TlsConfigError,
    TlsSettings,
    parse_protocols,
    principal_of,
    server_context,
)
from tests.network.trio_harness import ScriptedHandlers, request_frame



@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def files(ca, tmp_path):
    """(keystore: server chain + key PEM, truststore: CA PEM) paths."""
    keystore, truststore = tmp_path / "server.pem", tmp_path / "ca.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(keystore))
    ca.cert_pem.write_to_path(str(truststore))
    return keystore, truststore


def client_context(ca: trustme.CA, common_name: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if common_name is not None:
        ca.issue_cert(f"{common_name}@example.test", common_name=common_name,
                      organization_unit_name="eng").configure_cert(context)
    return context


@asynccontextmanager
async def tls_listener(context: ssl.SSLContext, handshake_timeout_s: float = 5.0):
    """A real Acceptor + Processor on 127.0.0.1:0 whose listener is SSL; requests echoed back.

    Yields (port, processor, channels: every KafkaChannel made, in order).
    """
    pool = MemoryPool(1 << 20)
    memory = MemoryWaiters(pool)
    limits = ConnectionLimits()
    request_channel = MultiQueueRequestChannel(1, 100)
    handlers = ScriptedHandlers(request_channel)
    quotas = ConnectionQuotas()
    channels: list[KafkaChannel] = []

    def factory(connection_id: str, stream: trio.abc.Stream, listener: Listener, principal: str) -> KafkaChannel:
        channel = KafkaChannel(connection_id, stream, request_channel,
                               ConnectionState(pool, limits, trio.current_time()), memory, listener=listener.name,
                               security_protocol=listener.security_protocol, principal=principal)
        channels.append(channel)
        return channel

    processor = Processor(0, factory, quotas)  # type: ignore[arg-type]
    sockets = await trio.open_tcp_listeners(0, host="127.0.0.1")
    kind = Listener("SSL", "SSL", context, handshake_timeout_s)
    acceptor = Acceptor(sockets, [processor], quotas, [kind] * len(sockets))
    async with trio.open_nursery() as nursery:
        await nursery.start(processor.run)
        await nursery.start(handlers.run, 0)
        await nursery.start(acceptor.run)
        yield sockets[0].socket.getsockname()[1], processor, channels
        nursery.cancel_scope.cancel()
    assert quotas.open == 0


async def round_trip(stream: trio.abc.Stream, correlation_id: int) -> int:
    """Send an ApiVersions frame, return the correlation id the echo handler answers with."""
    await stream.send_all(request_frame(correlation_id))
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = await stream.receive_some(4096)
        assert chunk, "closed before the response"
        data += chunk
    return struct.unpack(">i", data[4:8])[0]


async def tls_client(ca, port: int, common_name: str | None = None) -> trio.SSLStream:
    return await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=client_context(ca, common_name))


async def wait_closed_by_server(stream: trio.abc.Stream) -> None:
    """Until the server closes ``stream`` (EOF or reset)."""
    with trio.fail_after(5):
        try:
            while await stream.receive_some(4096):
                pass
        except (trio.BrokenResourceError, ssl.SSLError):
            pass


@pytest.mark.trio
async def test_an_ssl_client_is_served_anonymously_and_knows_its_listener(ca, files):
    keystore, _ = files
    async with tls_listener(server_context(TlsSettings(keystore))) as (port, _processor, channels):
        client = await tls_client(ca, port)
        assert await round_trip(client, 7) == 7
        assert await round_trip(client, 8) == 8
        (channel,) = channels
        assert (channel.listener, channel.security_protocol, channel.principal) == ("SSL", "SSL", ANONYMOUS)
        assert channel.peer_host == "127.0.0.1"
        await client.aclose()


@pytest.mark.trio
async def test_mtls_principal_is_the_subject_and_a_client_without_a_certificate_is_refused(ca, files, caplog):
    keystore, truststore = files
    context = server_context(TlsSettings(keystore, truststore_location=truststore, client_auth="required"))
    async with tls_listener(context) as (port, processor, channels):
        alice = await tls_client(ca, port, "alice")
        assert await round_trip(alice, 1) == 1
        assert channels[0].principal.startswith("User:CN=alice,OU=eng,O=")
        with caplog.at_level(logging.WARNING):
            anonymous = await tls_client(ca, port)  # TLS 1.3: the client learns at its first read
            try:
                await anonymous.send_all(request_frame(2))
            except trio.BrokenResourceError:
                pass
            await wait_closed_by_server(anonymous)
            while processor.handshake_failures == 0:
                await trio.sleep(0.01)
        assert "closing connection" in caplog.text and "on listener SSL: TLS handshake failed" in caplog.text
        assert "CERTIFICATE" in caplog.text.upper()
        assert len(channels) == 1  # the refused one never became a channel
        assert await round_trip(alice, 3) == 3  # the other client carries on
        # Kafka socket-server-metrics successful-/failed-authentication-total, per listener
        assert processor.successful_authentications == {"SSL": 1}
        assert processor.failed_authentications == {"SSL": 1}
        assert processor.connections_created == {"SSL": 1}
        await alice.aclose()


@pytest.mark.trio
async def test_requested_client_auth_serves_both(ca, files):
    keystore, truststore = files
    context = server_context(TlsSettings(keystore, truststore_location=truststore, client_auth="requested"))
    async with tls_listener(context) as (port, _processor, channels):
        bob, anonymous = await tls_client(ca, port, "bob"), await tls_client(ca, port)
        assert (await round_trip(bob, 1), await round_trip(anonymous, 2)) == (1, 2)
        principals = sorted(c.principal for c in channels)
        assert principals[0] == ANONYMOUS and principals[1].startswith("User:CN=bob,")


@pytest.mark.trio
async def test_a_plaintext_client_on_a_tls_port_is_closed_and_others_carry_on(ca, files, caplog):
    keystore, _ = files
    async with tls_listener(server_context(TlsSettings(keystore))) as (port, processor, channels):
        tls = await tls_client(ca, port)
        plain = await trio.open_tcp_stream("127.0.0.1", port)
        with caplog.at_level(logging.WARNING):
            await plain.send_all(request_frame(1))
            await wait_closed_by_server(plain)
            while processor.handshake_failures == 0:
                await trio.sleep(0.01)
        assert "plaintext client on a TLS listener?" in caplog.text
        assert await round_trip(tls, 2) == 2
        assert len(channels) == 1


@pytest.mark.trio
async def test_a_client_that_never_finishes_the_handshake_does_not_hold_up_another(ca, files):
    keystore, _ = files
    # A deadline far beyond the wait below: were handshakes served one at a time, the second
    # client would wait for the silent one's deadline and trip fail_after, however fast the machine.
    async with tls_listener(server_context(TlsSettings(keystore)), handshake_timeout_s=600) as (port, processor, _):
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(60):
            tls = await tls_client(ca, port)
            assert await round_trip(tls, 1) == 1
        assert processor.handshake_failures == 0  # served while the silent handshake was still pending
        await silent.aclose()
        await tls.aclose()


@pytest.mark.trio
async def test_a_client_that_never_finishes_the_handshake_is_closed_after_the_deadline(ca, files, caplog):
    keystore, _ = files
    async with tls_listener(server_context(TlsSettings(keystore)), handshake_timeout_s=0.5) as (port, processor, _):
        started = trio.current_time()  # before the connection exists, so before the server's deadline starts
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        with caplog.at_level(logging.WARNING):
            await wait_closed_by_server(silent)
        assert trio.current_time() - started >= 0.5  # not before the deadline (a later close is load)
        assert "TLS handshake not complete after 0.5 s" in caplog.text
        assert processor.handshake_failures == 1 and processor.failed_authentications["SSL"] == 1
        tls = await tls_client(ca, port)  # the listener carries on
        assert await round_trip(tls, 2) == 2
        await tls.aclose()


def test_server_context_errors_name_the_key_and_never_the_key_material(ca, files, tmp_path):
    keystore, truststore = files
    with pytest.raises(TlsConfigError, match="ssl.keystore.location: an SSL or SASL_SSL listener needs"):
        server_context(TlsSettings(None))
    with pytest.raises(TlsConfigError, match="ssl.keystore.location: no such file"):
        server_context(TlsSettings(tmp_path / "missing.pem"))
    with pytest.raises(TlsConfigError, match="ssl.keystore.location: cannot load") as caught:
        server_context(TlsSettings(truststore))  # a certificate without its key
    assert "PRIVATE KEY" not in str(caught.value)
    with pytest.raises(TlsConfigError, match="ssl.truststore.location: no such file"):
        server_context(TlsSettings(keystore, truststore_location=tmp_path / "nope.pem", client_auth="required"))
    context = server_context(TlsSettings(keystore, enabled_protocols=("TLSv1.3",)))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert context.verify_mode == ssl.CERT_NONE


def test_an_encrypted_key_needs_its_password(ca, tmp_path):
    from cryptography.hazmat.primitives import serialization

    cert = ca.issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"hunter2"))
    keystore = tmp_path / "enc.pem"
    keystore.write_bytes(encrypted + b"".join(b.bytes() for b in cert.cert_chain_pems))
    server_context(TlsSettings(keystore, key_password="hunter2"))
    with pytest.raises(TlsConfigError, match="wrong ssl.key.password") as caught:
        server_context(TlsSettings(keystore, key_password="wrong"))
    assert "hunter2" not in str(caught.value) and "wrong" not in str(caught.value).replace("wrong ssl", "")


def test_protocols_and_anonymous():
    assert parse_protocols("TLSv1.2, TLSv1.3") == ("TLSv1.2", "TLSv1.3")
    for bad in ("", "TLSv1.1", "SSLv3,TLSv1.2"):
        with pytest.raises(ValueError):
            parse_protocols(bad)
    assert principal_of(None) == ANONYMOUS


def _pkcs12_stores(ca: trustme.CA, tmp_path) -> tuple:
    """(keystore, truststore) as PKCS12 files with passwords, as ``keytool -storetype PKCS12`` users have them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    cert = ca.issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
    chain = [x509.load_pem_x509_certificate(b.bytes()) for b in cert.cert_chain_pems]
    keystore, truststore = tmp_path / "server.p12", tmp_path / "trust.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"server", key, chain[0], chain[1:], serialization.BestAvailableEncryption(b"store-secret")))
    truststore.write_bytes(pkcs12.serialize_key_and_certificates(
        None, None, None, [x509.load_pem_x509_certificate(ca.cert_pem.bytes())],
        serialization.BestAvailableEncryption(b"trust-secret")))
    return keystore, truststore


@pytest.mark.trio
async def test_pkcs12_keystore_and_truststore_serve_mtls(ca, tmp_path):
    keystore, truststore = _pkcs12_stores(ca, tmp_path)
    context = server_context(TlsSettings(keystore, truststore_location=truststore, client_auth="required",
                                         keystore_type="PKCS12", keystore_password="store-secret",
                                         truststore_type="PKCS12", truststore_password="trust-secret"))
    async with tls_listener(context) as (port, processor, channels):
        alice = await tls_client(ca, port, "alice")
        assert await round_trip(alice, 5) == 5
        assert channels[0].principal.startswith("User:CN=alice,")
        await alice.aclose()


def test_pkcs12_errors_name_the_key_and_never_the_password(ca, tmp_path):
    keystore, truststore = _pkcs12_stores(ca, tmp_path)
    with pytest.raises(TlsConfigError, match="wrong ssl.keystore.password") as caught:
        server_context(TlsSettings(keystore, keystore_type="PKCS12", keystore_password="guess-1"))
    assert "guess-1" not in str(caught.value) and "store-secret" not in str(caught.value)
    with pytest.raises(TlsConfigError, match="holds no private key"):  # a truststore given as the keystore
        server_context(TlsSettings(truststore, keystore_type="PKCS12", keystore_password="trust-secret"))
    with pytest.raises(TlsConfigError, match="wrong ssl.truststore.password"):
        server_context(TlsSettings(keystore, truststore_location=truststore, client_auth="required",
                                   keystore_type="PKCS12", keystore_password="store-secret",
                                   truststore_type="PKCS12", truststore_password="guess-2"))
    assert list(Path(tempfile.gettempdir()).glob("pipeline-keystore-*")) == []  # the one-time key file is gone
