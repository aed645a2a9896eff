"""The SCRAM credential store: salted and hashed, never the password, survives reopening."""

from __future__ import annotations

import hashlib
import sqlite3
import stat

import pytest
import scramp

from pipeline.security.users import (
    DEFAULT_ITERATIONS,
    CredentialError,
    UserStore,
    credential_from_salted_password,
    make_credential,
)


def test_add_stores_salted_hashes_not_the_password(tmp_path):
    store = UserStore(tmp_path / "users.db")
    store.add("alice", "s3cret-password")
    raw = (tmp_path / "users.db").read_bytes()
    assert b"s3cret-password" not in raw
    rows = sqlite3.connect(tmp_path / "users.db").execute(
        "SELECT user, mechanism, length(salt) >= 16, length(stored_key), iterations FROM scram_credentials").fetchall()
    assert sorted(rows) == [("alice", "SCRAM-SHA-256", 1, 32, DEFAULT_ITERATIONS),
                            ("alice", "SCRAM-SHA-512", 1, 64, DEFAULT_ITERATIONS)]
    assert stat.S_IMODE((tmp_path / "users.db").stat().st_mode) == 0o600
    # Two users with one password get different salts, so different keys.
    store.add("bob", "s3cret-password")
    assert store.get("alice", "SCRAM-SHA-256").stored_key != store.get("bob", "SCRAM-SHA-256").stored_key


def test_survives_reopen_and_remove(tmp_path, metadata_target):
    url = metadata_target("users.db")
    url = url if isinstance(url, str) else None  # on SQLite: the data dir's file
    UserStore.for_data_dir(tmp_path, url).add("alice", "pw-alice", ("SCRAM-SHA-256",), iterations=4096)
    store = UserStore.for_data_dir(tmp_path, url)
    assert (tmp_path / "_pipeline" / "users.db").exists() is (url is None)
    assert store.users() == {"alice": {"SCRAM-SHA-256": 4096}}
    assert store.verify_plain("alice", "pw-alice")
    assert store.remove("alice", "SCRAM-SHA-512") == 0
    assert store.remove("alice") == 1
    assert store.users() == {} and not store.verify_plain("alice", "pw-alice")


def test_verify_plain(metadata_target):
    store = UserStore(metadata_target("u.db"))
    store.add("alice", "pw-alice")
    assert store.verify_plain("alice", "pw-alice")
    assert not store.verify_plain("alice", "pw-alicE")
    assert not store.verify_plain("nobody", "pw-alice")
    assert not store.verify_plain("alice", "\u0007bell")  # SASLprep prohibits control characters


def test_credential_checks():
    with pytest.raises(CredentialError):
        make_credential("SCRAM-SHA-1", "pw")
    with pytest.raises(CredentialError):
        make_credential("SCRAM-SHA-256", "pw", iterations=1000)
    with pytest.raises(CredentialError):
        make_credential("SCRAM-SHA-256", "")
    with pytest.raises(CredentialError):
        credential_from_salted_password("SCRAM-SHA-256", b"", b"x", 4096)


def test_salted_password_path_matches_scramp():
    """KIP-554 sends Hi(password, salt, i); the keys derived from it are scramp's."""
    salt = b"0123456789abcdef"
    for mechanism, digest in (("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")):
        salted = hashlib.pbkdf2_hmac(digest, b"pw", salt, 4096)
        mine = credential_from_salted_password(mechanism, salt, salted, 4096)
        _salt, stored_key, server_key, _i = scramp.ScramMechanism(mechanism).make_auth_info("pw", 4096, salt)
        assert (mine.stored_key, mine.server_key) == (stored_key, server_key)
