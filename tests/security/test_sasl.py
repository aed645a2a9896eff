"""The per-connection SASL state machine (PLAIN, SCRAM with scramp's client) and the failure throttle."""

from __future__ import annotations

import pytest
import scramp

from pipeline.security.sasl import (
    FAILED_MESSAGE,
    AuthenticationFailedError,
    FailedAuthenticationThrottle,
    IllegalSaslStateError,
    SaslServer,
    SaslState,
    UnsupportedMechanismError,
)
from pipeline.security.users import UserStore

SCRAMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture
def store(tmp_path):
    s = UserStore(tmp_path / "users.db")
    s.add("alice", "pw-alice", iterations=4096)
    return s


def server(store, mechanism, enabled=("PLAIN", *SCRAMS)) -> SaslServer:
    s = SaslServer(enabled, store)
    assert s.handshake(mechanism) == enabled
    assert s.state is SaslState.AUTHENTICATE
    return s


def scram_login(s: SaslServer, mechanism: str, user: str, password: str) -> scramp.ScramClient:
    client = scramp.ScramClient([mechanism], user, password)
    first = s.authenticate(client.get_client_first().encode())
    assert not first.complete and s.state is SaslState.AUTHENTICATE
    client.set_server_first(first.token.decode())
    final = s.authenticate(client.get_client_final().encode())
    assert final.complete
    client.set_server_final(final.token.decode())  # raises if the server signature is wrong
    return client


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_success(store, mechanism):
    s = server(store, mechanism)
    scram_login(s, mechanism, "alice", "pw-alice")
    assert s.state is SaslState.COMPLETE and s.principal == "User:alice"
    with pytest.raises(IllegalSaslStateError):
        s.authenticate(b"n,,n=alice,r=abc")


@pytest.mark.parametrize("mechanism", SCRAMS)
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "pw-alice")])
def test_scram_failure_does_not_say_whether_the_user_exists(store, mechanism, user, password):
    s = server(store, mechanism)
    with pytest.raises(AuthenticationFailedError) as failed:
        scram_login(s, mechanism, user, password)
    assert str(failed.value) == FAILED_MESSAGE and failed.value.user == user
    assert s.state is SaslState.FAILED and s.principal is None


def test_unknown_scram_user_gets_a_stable_made_up_salt(store):
    salts = []
    for _ in range(2):
        s = server(store, "SCRAM-SHA-256")
        client = scramp.ScramClient(["SCRAM-SHA-256"], "mallory", "x")
        salts.append(dict(kv.split("=", 1) for kv in s.authenticate(client.get_client_first().encode())
                          .token.decode().split(","))["s"])
    assert salts[0] == salts[1]


@pytest.mark.parametrize("token", [b"", b"\xff\xfe", b"garbage", b"n,,n=alice", b"p=tls-unique,,n=a,r=x"])
def test_scram_garbage_token(store, token):
    s = server(store, "SCRAM-SHA-512")
    with pytest.raises(AuthenticationFailedError) as failed:
        s.authenticate(token)
    assert str(failed.value).startswith("Authentication failed")
    assert s.state is SaslState.FAILED


def test_plain(store):
    s = server(store, "PLAIN")
    assert s.authenticate(b"\0alice\0pw-alice").complete
    assert s.principal == "User:alice"
    assert server(store, "PLAIN").authenticate(b"alice\0alice\0pw-alice").complete
    for token in (b"\0alice\0wrong", b"\0mallory\0pw-alice", b"garbage", b"\0\0", b"bob\0alice\0pw-alice",
                  b"\0al\xffice\0pw"):
        s = server(store, "PLAIN")
        with pytest.raises(AuthenticationFailedError) as failed:
            s.authenticate(token)
        assert b"pw-alice".decode() not in str(failed.value)
        assert s.state is SaslState.FAILED
    s = server(store, "PLAIN")
    with pytest.raises(AuthenticationFailedError) as wrong:
        s.authenticate(b"\0alice\0wrong")
    s = server(store, "PLAIN")
    with pytest.raises(AuthenticationFailedError) as unknown:
        s.authenticate(b"\0mallory\0wrong")
    assert str(wrong.value) == str(unknown.value) == FAILED_MESSAGE


def test_user_added_later_can_log_in(store):
    s = server(store, "PLAIN")
    store.add("carol", "pw-carol", ("SCRAM-SHA-256",), iterations=4096)
    assert s.authenticate(b"\0carol\0pw-carol").complete  # PLAIN falls back to the SHA-256 credential


def test_handshake_rules(store):
    s = SaslServer(("SCRAM-SHA-256",), store)
    with pytest.raises(IllegalSaslStateError):
        s.authenticate(b"\0alice\0pw-alice")  # a token before the handshake
    assert s.state is SaslState.FAILED
    s = SaslServer(("SCRAM-SHA-256",), store)
    with pytest.raises(UnsupportedMechanismError) as unsupported:
        s.handshake("PLAIN")
    assert unsupported.value.enabled == ("SCRAM-SHA-256",) and s.state is SaslState.FAILED
    s = SaslServer(("SCRAM-SHA-256",), store)
    s.handshake("SCRAM-SHA-256")
    with pytest.raises(IllegalSaslStateError):
        s.handshake("SCRAM-SHA-256")


def _client_final(mechanism: str, password: str, client_first_bare: str, server_first: str, nonce: str) -> str:
    """A client-final with ``nonce`` in it and a proof over it (RFC 5802 section 3), built by hand
    the way librdkafka before 2.6.1 builds it when ``nonce`` is its client nonce + the server's."""
    import base64
    import hashlib
    import hmac

    name = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={nonce}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


@pytest.mark.parametrize("mechanism", SCRAMS)
def test_scram_accepts_librdkafkas_doubled_client_nonce_as_kafka_3_does(store, mechanism):
    """librdkafka < 2.6.1 (librdkafka#4895; Debian 12's kcat) sends r=<client nonce><server-first nonce>;
    Kafka 3.8.1-3.9 ScramSaslServer accepts a nonce that ends with the server's (CVE-2024-56128 fix)."""
    client_nonce = "fyko+d2lbbFgONRv9qkxdawL"
    for nonce_of, password, accepted in ((lambda n: client_nonce + n, "pw-alice", True),
                                         (lambda n: n, "pw-alice", True),
                                         (lambda n: client_nonce + n[:-1], "pw-alice", False),  # not the server's
                                         (lambda n: "x" + n, "wrong", False)):
        s = server(store, mechanism)
        first_bare = f"n=alice,r={client_nonce}"
        server_first = s.authenticate(f"n,,{first_bare}".encode()).token.decode()
        nonce = server_first.split(",")[0][2:]
        final = _client_final(mechanism, password, first_bare, server_first, nonce_of(nonce))
        if accepted:
            assert s.authenticate(final.encode()).complete and s.principal == "User:alice"
        else:
            with pytest.raises(AuthenticationFailedError):
                s.authenticate(final.encode())
            assert s.state is SaslState.FAILED


def test_a_v0_handshake_takes_raw_tokens_only_and_a_v1_handshake_requests_only(store):
    s = SaslServer(("PLAIN",), store)
    s.handshake("PLAIN", 0)
    assert s.raw_tokens
    with pytest.raises(IllegalSaslStateError):
        s.authenticate(b"\0alice\0pw-alice")  # a SaslAuthenticate request's token after a v0
    assert s.state is SaslState.FAILED
    s = SaslServer(("PLAIN",), store)
    s.handshake("PLAIN", 0)
    assert s.authenticate(b"\0alice\0pw-alice", raw=True).complete
    s = SaslServer(("PLAIN",), store)
    s.handshake("PLAIN", 1)
    with pytest.raises(IllegalSaslStateError):
        s.authenticate(b"\0alice\0pw-alice", raw=True)


def test_throttle_grows_is_bounded_per_host_and_forgets():
    t = FailedAuthenticationThrottle(100, max_delay_ms=1000, forget_after_s=60)
    assert [t.failure("10.0.0.1", now) for now in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert t.failure("10.0.0.2", 6) == 0.1  # another address is not slowed down
    assert t.failure("10.0.0.1", 6 + 61) == 0.1  # a quiet minute starts over
    t.failure("10.0.0.1", 68)
    t.success("10.0.0.1")
    assert t.failures("10.0.0.1") == 0 and t.failure("10.0.0.1", 69) == 0.1
    assert FailedAuthenticationThrottle(0).failure("10.0.0.1", 0) == 0.0
    small = FailedAuthenticationThrottle(100, max_hosts=2)
    for i, host in enumerate(("a", "b", "c")):
        small.failure(host, i)
    assert small.failures("a") == 0 and small.failures("c") == 1
