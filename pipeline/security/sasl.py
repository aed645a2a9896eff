"""SASL authentication of one connection, and the throttle of failed ones (sans-I/O).

Kafka authenticates a SASL_PLAINTEXT / SASL_SSL connection before serving
it (``SaslServerAuthenticator``): the client may send ApiVersions, then
SaslHandshake naming a mechanism (KIP-43), then the mechanism's tokens until
it is done: in SaslAuthenticate requests after a SaslHandshake v1 (KIP-152),
as raw size-prefixed frames after a v0 (KIP-43, what librdkafka before 2.10
uses when the broker lists SaslHandshake v0). Only
then is the connection's principal known (``User:<name>``) and any other api
served. ``SaslServer`` is that exchange for one connection: tokens in, tokens
or a documented exception out, no socket, no clock, no store of its own (the
credentials come from a ``Credentials`` such as ``pipeline.security.users.UserStore``).

Mechanisms: PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802,
RFC 7677) through the ``scramp`` library's server side. An unknown SCRAM user
gets a made-up salt (stable per user, RFC 5802 section 9's advice) and fails
at the proof exactly like a wrong password, so neither the answer nor the
step it comes at says whether the user exists.

``FailedAuthenticationThrottle`` decides how long to hold a failure's answer
per client address (Kafka's ``connection.failed.authentication.delay.ms``,
KIP-306), growing with repeated failures.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pipeline.security.users import MIN_ITERATIONS, SCRAM_MECHANISMS, ScramCredential

if TYPE_CHECKING:
    import scramp

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS: tuple[str, ...] = (PLAIN, *SCRAM_MECHANISMS)
"""What ``sasl.enabled.mechanisms`` may list."""
DEFAULT_MECHANISMS: tuple[str, ...] = SUPPORTED_MECHANISMS
"""``sasl.enabled.mechanisms`` unless configured (Kafka's default is GSSAPI, which we do not serve)."""

ILLEGAL_SASL_STATE = 34
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58

FAILED_MESSAGE = "Authentication failed: Invalid username or password"
"""The one message every credential failure gets (Kafka PlainSaslServer's wording): it never
says whether the user exists."""


class Credentials(Protocol):
    """Where ``SaslServer`` looks users up (``pipeline.security.users.UserStore``)."""

    def get(self, user: str, mechanism: str) -> ScramCredential | None: ...

    def verify_plain(self, user: str, password: str) -> bool: ...


class SaslState(enum.Enum):
    """Kafka ``SaslServerAuthenticator.SaslState``, reduced to what KIP-152 clients go through."""

    HANDSHAKE = "handshake"          # ApiVersions or SaslHandshake expected
    AUTHENTICATE = "authenticate"    # SaslAuthenticate tokens of the chosen mechanism
    COMPLETE = "complete"            # authenticated: ``principal`` is set
    FAILED = "failed"                # the connection must be closed


class IllegalSaslStateError(Exception):
    """A SASL request out of turn (a second handshake, a token before the handshake, any
    request after a failure). Kafka throws ``IllegalSaslStateException`` and closes."""


class UnsupportedMechanismError(Exception):
    """SaslHandshake named a mechanism not enabled (UNSUPPORTED_SASL_MECHANISM, then Kafka closes).

    ``enabled`` lists the mechanisms the answer carries.
    """

    def __init__(self, mechanism: str, enabled: tuple[str, ...]) -> None:
        super().__init__(f"unsupported SASL mechanism {mechanism!r}, enabled: {', '.join(enabled)}")
        self.enabled = enabled


class AuthenticationFailedError(Exception):
    """SaslAuthenticate failed (SASL_AUTHENTICATION_FAILED, then the connection closes).

    ``str(exc)`` is safe to send to the client and to log: it never holds a
    password, proof or key, and never says whether the user exists.
    ``user`` is the user name tried ("" if none could be read), for the log.
    """

    def __init__(self, user: str, message: str = FAILED_MESSAGE) -> None:
        super().__init__(message)
        self.user = user


@dataclass(frozen=True, slots=True)
class Step:
    """What one SaslAuthenticate token produced: ``token`` to send back (may be
    empty) and whether authentication is now complete."""

    token: bytes
    complete: bool


# Made-up salts for unknown SCRAM users come from a per-process secret: the same
# user gets the same salt on every try (a real user's salt does not change
# either), and nobody can tell made-up salts from real ones.
_FAKE_SALT_KEY = secrets.token_bytes(32)


def _fake_credential(mechanism: str, user: str) -> ScramCredential:
    salt = hmac.new(_FAKE_SALT_KEY, f"{mechanism}\0{user}".encode(), hashlib.sha256).digest()[:16]
    # Random keys: no proof can match them.
    return ScramCredential(mechanism, salt, secrets.token_bytes(64), secrets.token_bytes(64), MIN_ITERATIONS * 2)


class SaslServer:
    """The SASL exchange of one connection (Kafka ``SaslServerAuthenticator``).

    Args:
        enabled: the mechanisms a client may choose (``sasl.enabled.mechanisms``).
        credentials: where users are looked up, at every authentication.

    ``handshake`` then ``authenticate`` (once for PLAIN, twice for SCRAM);
    ``state`` says where it is, ``principal`` who the client is once COMPLETE.
    Every method raises ``IllegalSaslStateError`` when called out of turn;
    after any exception the state is FAILED and stays so.
    """

    def __init__(self, enabled: tuple[str, ...], credentials: Credentials) -> None:
        self.enabled = enabled
        self.credentials = credentials
        self.state = SaslState.HANDSHAKE
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.user = ""
        """The user name tried (for logs), "" until a token named one."""
        self.raw_tokens = False
        """The tokens come as raw frames (after a SaslHandshake v0), not in SaslAuthenticate requests."""
        self._scram: scramp.ScramServer | None = None

    def handshake(self, mechanism: str, version: int = 1) -> tuple[str, ...]:
        """Choose ``mechanism`` (SaslHandshake ``version``, KIP-43); returns the enabled mechanisms
        for the answer. After a v0 the tokens come raw (``raw_tokens``), after a v1 in
        SaslAuthenticate requests (Kafka ``SaslServerAuthenticator.handleHandshakeRequest``).

        Raises:
            IllegalSaslStateError: not in the HANDSHAKE state.
            UnsupportedMechanismError: ``mechanism`` is not enabled.
        """
        self._expect(SaslState.HANDSHAKE)
        if mechanism not in self.enabled:
            self.state = SaslState.FAILED
            raise UnsupportedMechanismError(mechanism, self.enabled)
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        self.state = SaslState.AUTHENTICATE
        return self.enabled

    def authenticate(self, token: bytes, *, raw: bool = False) -> Step:
        """Take one client token and return the server's: from a SaslAuthenticate request
        (KIP-152), or a raw frame (``raw``, after a SaslHandshake v0).

        PLAIN: one token ``authzid NUL authcid NUL passwd`` (RFC 4616); an
        authzid other than empty or the user is refused, as Kafka's
        ``PlainSaslServer`` does. SCRAM: client-first then client-final
        (RFC 5802 section 5); the server-final carries the server signature.

        Raises:
            IllegalSaslStateError: no handshake yet, already complete/failed, or
                the token came the other way than the handshake's version says
                (a SaslAuthenticate request after a v0, a raw token after a v1).
            AuthenticationFailedError: wrong password, unknown user, a token
                that is not what the mechanism expects.
        """
        self._expect(SaslState.AUTHENTICATE)
        if raw != self.raw_tokens:
            self.state = SaslState.FAILED
            raise IllegalSaslStateError(
                "SaslAuthenticate request after a SaslHandshake v0 (its tokens come raw)" if self.raw_tokens
                else "raw SASL token after a SaslHandshake v1 (its tokens come in SaslAuthenticate)")
        try:
            if self.mechanism == PLAIN:
                return self._plain(token)
            return self._scram_step(token)
        except AuthenticationFailedError:
            self.state = SaslState.FAILED
            raise

    def _expect(self, state: SaslState) -> None:
        if self.state is not state:
            current = self.state
            self.state = SaslState.FAILED
            raise IllegalSaslStateError(f"SASL request in state {current.value}, expected {state.value}")

    def _complete(self, user: str) -> Step:
        self.state = SaslState.COMPLETE
        self.principal = f"User:{user}"
        return Step(b"", True)

    def _plain(self, token: bytes) -> Step:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthenticationFailedError("", "Authentication failed: PLAIN token is not authzid NUL user NUL password")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailedError("", "Authentication failed: PLAIN token is not UTF-8") from None
        self.user = user
        if not user or not password:
            raise AuthenticationFailedError(user, "Authentication failed: username or password not specified")
        if authzid and authzid != user:
            raise AuthenticationFailedError(
                user, "Authentication failed: Client requested an authorization id that is different from username")
        if not self.credentials.verify_plain(user, password):
            raise AuthenticationFailedError(user)
        return self._complete(user)

    def _scram_step(self, token: bytes) -> Step:
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailedError(self.user, "Authentication failed: SCRAM message is not UTF-8") from None
        assert self.mechanism is not None
        import scramp  # here, not at the top: every `pipeline` command loads this module's defaults

        try:
            if self._scram is None:
                self._scram = scramp.ScramMechanism(self.mechanism).make_server(self._lookup)
                self._scram.set_client_first(message)
                return Step(self._scram.get_server_first().encode(), False)
            self._accept_doubled_nonce(self._scram, message)
            self._scram.set_client_final(message)
            server_final = self._scram.get_server_final()
        except scramp.ScramException as exc:
            if self.user and getattr(exc.server_error, "value", None) == "invalid-proof":
                raise AuthenticationFailedError(self.user) from None
            # Malformed messages: scramp's reason names the part, never a secret.
            raise AuthenticationFailedError(self.user, f"Authentication failed: invalid SCRAM message ({exc})") from None
        self._complete(self.user)
        return Step(server_final.encode(), True)

    @staticmethod
    def _accept_doubled_nonce(server: scramp.ScramServer, client_final: str) -> None:
        """Take a client-final whose nonce *ends with* the server-first's, as Kafka 3.x does.

        librdkafka before 2.6.1 puts its client nonce in front of the whole
        server-first nonce (which already starts with it) in its client-final
        (librdkafka#4895, present since 0.0.99): Debian 12's kcat and
        confluent-kafka wheels before 2.6.1 do. Kafka 3.8.1-3.9's
        ``ScramSaslServer`` (the CVE-2024-56128 fix) checks ``endsWith`` rather
        than equality to keep them working; scramp checks equality. The server's
        nonce must still be in the message and the proof still covers the
        message as sent, so a replayed exchange still fails.
        """
        for attribute in client_final.split(","):
            if attribute.startswith("r="):
                nonce, expected = attribute[2:], str(server.nonce)  # scramp keeps a ``Nonce``
                if nonce != expected and nonce.endswith(expected):
                    server.nonce = type(server.nonce)(nonce)
                return

    def _lookup(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn``: the credential of ``user``, a made-up one if unknown."""
        self.user = user
        assert self.mechanism is not None
        credential = self.credentials.get(user, self.mechanism) or _fake_credential(self.mechanism, user)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations


class FailedAuthenticationThrottle:
    """How long to hold the answer to a failed authentication, per client address (sans-I/O).

    Kafka holds a failed authentication's response and close for
    ``connection.failed.authentication.delay.ms`` (KIP-306), which slows a
    password guesser down. We double the delay with every further failure
    from the same address within ``forget_after_s`` of the previous one, up
    to ``max_delay_ms``; a success or ``forget_after_s`` without failures
    starts over. At most ``max_hosts`` addresses are remembered (the ones
    quiet longest are forgotten first), so memory stays bounded.

    Args:
        delay_ms: the first failure's delay (ms); 0 turns throttling off.
        max_delay_ms: the bound of the growing delay (ms).
        forget_after_s: quiet time after which an address starts over (s).
        max_hosts: addresses remembered at most.
    """

    def __init__(self, delay_ms: int, max_delay_ms: int | None = None, forget_after_s: float = 60.0,
                 max_hosts: int = 10_000) -> None:
        self.delay_ms = delay_ms
        self.max_delay_ms = max_delay_ms if max_delay_ms is not None else 50 * delay_ms
        self.forget_after_s = forget_after_s
        self.max_hosts = max_hosts
        self._failures: dict[str, tuple[int, float]] = {}  # host -> (failures, time of the last, s)

    def failure(self, host: str, now: float) -> float:
        """Record a failure from ``host`` at ``now`` (s, any monotonic clock); the delay before answering it (s)."""
        if self.delay_ms <= 0:
            return 0.0
        count, last = self._failures.pop(host, (0, now))
        if now - last > self.forget_after_s:
            count = 0
        count += 1
        self._failures[host] = (count, now)  # re-inserted: dict order is quiet-longest first
        while len(self._failures) > self.max_hosts:
            del self._failures[next(iter(self._failures))]
        return min(self.delay_ms * 2 ** min(count - 1, 32), self.max_delay_ms) / 1000.0

    def success(self, host: str) -> None:
        """``host`` authenticated: its next failure starts over at ``delay_ms``."""
        self._failures.pop(host, None)

    def failures(self, host: str) -> int:
        """Failures remembered for ``host``."""
        return self._failures.get(host, (0, 0.0))[0]
