"""TLS for SSL and SASL_SSL listeners: the server context, the handshake, the principal.

Kafka's SslFactory builds one server SSLEngine factory from the ``ssl.*``
configs; its SslTransportLayer runs the handshake before the connection
carries any request, and DefaultKafkaPrincipalBuilder names an mTLS client
``User:`` + its certificate's subject distinguished name. Here the context is
an ``ssl.SSLContext`` (built once, at start-up), the transport is
``trio.SSLStream``, and the handshake runs in the connection's own task under
a deadline, so a slow or silent client holds only itself up.

Key material is never logged: only file paths and what the ssl module says
went wrong.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio
    from cryptography.hazmat.primitives.serialization.pkcs12 import PKCS12KeyAndCertificates

ANONYMOUS = "User:ANONYMOUS"
"""Kafka's KafkaPrincipal.ANONYMOUS: an SSL client that sent no certificate."""

CLIENT_AUTH = ("none", "requested", "required")
"""Kafka ``ssl.client.auth`` values."""

_VERIFY_MODE = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
"""``ssl.enabled.protocols`` names served (Kafka's default is TLSv1.2,TLSv1.3; older ones are refused)."""

DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000
"""How long a client has to complete the TLS handshake (ms) before it is closed."""


class TlsConfigError(ValueError):
    """The ``ssl.*`` configuration cannot make a server context; the message names the key."""


class TlsHandshakeError(Exception):
    """A client did not complete the TLS handshake: timed out, not TLS, or refused (no or a bad certificate)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The ``ssl.*`` configs of one listener (Kafka SslConfigs).

    Attributes:
        keystore_location: PEM file holding the server's certificate chain and
            private key (``ssl.keystore.location`` with ``ssl.keystore.type=PEM``).
        key_password: password of an encrypted private key (``ssl.key.password``), or None.
        truststore_location: PEM bundle of the CAs client certificates must chain
            to (``ssl.truststore.location``); None: the system's default CAs.
        client_auth: ``none``, ``requested`` or ``required`` (``ssl.client.auth``).
        enabled_protocols: TLS versions allowed (``ssl.enabled.protocols``).
        handshake_timeout_ms: deadline of a handshake (ms).
        keystore_type: ``PEM`` or ``PKCS12`` (``ssl.keystore.type``).
        keystore_password: password of a PKCS12 keystore (``ssl.keystore.password``).
        truststore_type: ``PEM`` or ``PKCS12`` (``ssl.truststore.type``).
        truststore_password: password of a PKCS12 truststore (``ssl.truststore.password``).
    """

    keystore_location: Path | None
    key_password: str | None = None
    truststore_location: Path | None = None
    client_auth: str = "none"
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    handshake_timeout_ms: int = DEFAULT_HANDSHAKE_TIMEOUT_MS
    keystore_type: str = "PEM"
    keystore_password: str | None = None
    truststore_type: str = "PEM"
    truststore_password: str | None = None


def parse_protocols(text: str) -> tuple[str, ...]:
    """``TLSv1.2,TLSv1.3`` -> the names, checked (Kafka ``ssl.enabled.protocols``).

    Raises:
        ValueError: empty, or a name other than TLSv1.2 and TLSv1.3.
    """
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in TLS_VERSIONS]
    if not names or bad:
        raise ValueError(f"expected a comma-separated list of {', '.join(TLS_VERSIONS)}, got {text!r}")
    return names


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The server SSLContext for ``settings`` (Kafka SslFactory / DefaultSslEngineFactory).

    Raises:
        TlsConfigError: no keystore, a file that cannot be read or parsed, a
            wrong key password, or a bad ``client_auth``; the message names the
            key and the path, never key material.
    """
    if settings.keystore_location is None:
        raise TlsConfigError("ssl.keystore.location: an SSL or SASL_SSL listener needs a keystore "
                             "(PEM file with the certificate chain and the private key)")
    if settings.client_auth not in _VERIFY_MODE:
        raise TlsConfigError(f"ssl.client.auth: expected one of {', '.join(CLIENT_AUTH)}, "
                             f"got {settings.client_auth!r}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    versions = sorted(TLS_VERSIONS[n] for n in settings.enabled_protocols)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]
    try:
        if settings.keystore_type == "PKCS12":
            _load_pkcs12_keystore(context, Path(settings.keystore_location), settings.keystore_password)
        else:
            context.load_cert_chain(settings.keystore_location, password=settings.key_password)
    except FileNotFoundError:
        raise TlsConfigError(f"ssl.keystore.location: no such file {settings.keystore_location}") from None
    except (ssl.SSLError, OSError) as exc:
        # The ssl module says "PEM lib" or "bad decrypt"; no key bytes are in the message.
        raise TlsConfigError(f"ssl.keystore.location: cannot load the certificate chain and private key "
                             f"from {settings.keystore_location} (wrong ssl.key.password, or not PEM "
                             f"with both): {exc}") from None
    context.verify_mode = _VERIFY_MODE[settings.client_auth]
    if settings.client_auth != "none":
        try:
            if settings.truststore_location is not None and settings.truststore_type == "PKCS12":
                context.load_verify_locations(cadata=_pkcs12_certificates(
                    Path(settings.truststore_location).read_bytes(), settings.truststore_password,
                    "ssl.truststore"))
            elif settings.truststore_location is not None:
                context.load_verify_locations(cafile=settings.truststore_location)
            else:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except FileNotFoundError:
            raise TlsConfigError(f"ssl.truststore.location: no such file {settings.truststore_location}") from None
        except (ssl.SSLError, OSError) as exc:
            raise TlsConfigError(f"ssl.truststore.location: cannot load CA certificates from "
                                 f"{settings.truststore_location}: {exc}") from None
    return context


def _pkcs12(data: bytes, password: str | None, key: str) -> PKCS12KeyAndCertificates:
    """cryptography's PKCS12KeyAndCertificates of ``data``.

    Raises:
        TlsConfigError: not PKCS12, or a wrong password (the message names ``key``, never key material).
    """
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        return pkcs12.load_pkcs12(data, password.encode() if password is not None else None)
    except ValueError:
        raise TlsConfigError(f"{key}.location: cannot read it as PKCS12 (wrong {key}.password, "
                             f"or not a PKCS12 file)") from None


def _pkcs12_certificates(data: bytes, password: str | None, key: str) -> str:
    """Every certificate of a PKCS12 truststore, as one PEM bundle (Java keytool's trusted-certificate
    entries and a key entry's chain alike).

    Raises:
        TlsConfigError: unreadable, or no certificate in it.
    """
    from cryptography.hazmat.primitives.serialization import Encoding

    store = _pkcs12(data, password, key)
    certs = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certs.insert(0, store.cert.certificate)
    if not certs:
        raise TlsConfigError(f"{key}.location: the PKCS12 store holds no certificate")
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certs)


def _load_pkcs12_keystore(context: ssl.SSLContext, location: Path, password: str | None) -> None:
    """Load a PKCS12 keystore's key and chain into ``context`` (Kafka ``ssl.keystore.type=PKCS12``).

    The ssl module loads keys from files only: the key is written, encrypted
    with a random one-time password, to a file in a private (0700) temporary
    directory that is removed at once; it is never on disk in clear.

    Raises:
        TlsConfigError: unreadable, wrong password, or no private key and certificate in it.
        FileNotFoundError: no such file.
    """
    import secrets
    import tempfile

    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, Encoding, PrivateFormat

    store = _pkcs12(location.read_bytes(), password, "ssl.keystore")
    if store.key is None or store.cert is None:
        raise TlsConfigError(f"ssl.keystore.location: {location} holds no private key with its certificate")
    one_time = secrets.token_bytes(32).hex()
    pem = store.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(one_time.encode()))
    pem += store.cert.certificate.public_bytes(Encoding.PEM)
    pem += b"".join(c.certificate.public_bytes(Encoding.PEM) for c in store.additional_certs)
    with tempfile.TemporaryDirectory(prefix="pipeline-keystore-") as private:  # mkdtemp: mode 0700
        path = Path(private) / "keystore.pem"
        path.write_bytes(pem)
        context.load_cert_chain(path, password=one_time)


def principal_of(der_certificate: bytes | None) -> str:
    """``User:`` + the certificate subject in RFC 2253/4514 form, ``CN=alice,OU=eng,O=acme``
    (most specific first, as Java's ``X500Principal.getName()`` and so Kafka's
    DefaultKafkaPrincipalBuilder give it); ANONYMOUS without a certificate.

    Attribute types without a short name are written as dotted OIDs.
    """
    if not der_certificate:
        return ANONYMOUS
    from cryptography import x509

    return "User:" + x509.load_der_x509_certificate(der_certificate).subject.rfc4514_string()


async def server_handshake(transport: trio.abc.Stream, context: ssl.SSLContext,
                           timeout_s: float) -> tuple[trio.SSLStream, str]:
    """Wrap ``transport`` in TLS and complete the server side of the handshake.

    Returns:
        (the SSLStream to serve the connection on, the client's principal).

    Raises:
        TlsHandshakeError: no handshake within ``timeout_s`` seconds, the peer
            is not speaking TLS (e.g. a plaintext Kafka client on a TLS port),
            sent no certificate where one is required, or one that does not
            verify, or closed the connection. The caller closes ``transport``.
    """
    import trio  # here, not at the top: every `pipeline` command loads this module's defaults

    stream = trio.SSLStream(transport, context, server_side=True)
    try:
        with trio.fail_after(timeout_s):
            await stream.do_handshake()
    except trio.TooSlowError:
        raise TlsHandshakeError(f"TLS handshake not complete after {timeout_s:g} s") from None
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            hint = " (a plaintext client on a TLS listener?)" if reason in (
                "WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE") else ""
            raise TlsHandshakeError(f"TLS handshake failed: {reason}{hint}") from None
        raise TlsHandshakeError(f"TLS handshake failed: peer closed the connection ({cause or exc})") from None
    return stream, principal_of(stream.getpeercert(binary_form=True))
