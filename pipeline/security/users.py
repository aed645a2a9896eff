"""SCRAM credentials of SASL users, salted and hashed, in SQLite or PostgreSQL.

Kafka keeps, per user and SCRAM mechanism, a salt, an iteration count, the
stored key and the server key (``ScramCredential``, RFC 5802 section 3) and
never the password. So do we, in ``DATA_DIR/_pipeline/users.db`` (or the
``scram_credentials`` table of the PostgreSQL database of ``pipeline.metadata.url``). A PLAIN
login is checked against the same credential: the password is salted again
with the stored salt and iterations and its stored key compared in constant
time, so no clear password nor a second hash is ever kept.

Written by ``pipeline users add|remove`` (another process, possibly while the
server runs) and by AlterUserScramCredentials (KIP-554); read by the server on
every authentication, so a user added while it runs can log in at once: every
call is a transaction of its own on the store's one connection
(``pipeline.metadata.database``), which sees what other processes committed
(SQLite's file locking, or PostgreSQL).

The salting itself is scramp's (``ScramMechanism.make_auth_info``); only the
KIP-554 path, where the client sends an already salted password, derives the
two keys with the RFC 5802 formulas (as Kafka's ``ScramFormatter`` does).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.metadata.database import Migration, Target, is_postgres_url, open_database, store_target

USERS_FILE = "users.db"
"""The store's file name under ``DATA_DIR/_pipeline``."""

SCRAM_MECHANISMS: dict[str, int] = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
"""SCRAM mechanisms and Kafka's type ids for them (``ScramMechanism``, KIP-554)."""
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}

MIN_ITERATIONS = 4096
"""Kafka's lower bound for SCRAM iterations (``ScramMechanism.minIterations``, also RFC 7677's minimum)."""
MAX_ITERATIONS = 16384
"""Kafka's upper bound for AlterUserScramCredentials iterations (``ScramMechanism.maxIterations``)."""
DEFAULT_ITERATIONS = 8192
"""Iterations of ``pipeline users add`` unless ``--iterations`` says otherwise."""

COMPONENT = "users"
"""The store's name in ``schema_version``."""

# "user" is quoted: a reserved word in PostgreSQL (SQLite takes the quotes too).
MIGRATIONS = (
    Migration(1, sqlite="""
CREATE TABLE IF NOT EXISTS scram_credentials (
    "user" TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BLOB NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    PRIMARY KEY ("user", mechanism)
)
""", postgresql="""
CREATE TABLE IF NOT EXISTS scram_credentials (
    "user" TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BYTEA NOT NULL,
    stored_key BYTEA NOT NULL,
    server_key BYTEA NOT NULL,
    iterations INTEGER NOT NULL,
    PRIMARY KEY ("user", mechanism)
)
"""),
)

_PUT = ('INSERT INTO scram_credentials VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT ("user", mechanism) DO UPDATE SET '
        "salt = excluded.salt, stored_key = excluded.stored_key, server_key = excluded.server_key, "
        "iterations = excluded.iterations")


class CredentialError(ValueError):
    """A credential that cannot be stored: empty user name, unknown mechanism,
    iterations outside ``MIN_ITERATIONS..MAX_ITERATIONS``, empty salt or
    password, or a password SASLprep (RFC 4013) prohibits."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One user's credential for one SCRAM mechanism (Kafka ``ScramCredential``).

    ``salt``, ``stored_key`` and ``server_key`` are raw bytes; ``stored_key`` is
    H(HMAC(SaltedPassword, "Client Key")) and ``server_key`` HMAC(SaltedPassword,
    "Server Key") (RFC 5802 section 3); ``iterations`` is the PBKDF2 count.
    """

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def _check(user: str, mechanism: str, iterations: int) -> None:
    if not user:
        raise CredentialError("the user name must not be empty")
    if mechanism not in SCRAM_MECHANISMS:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r}, expected one of {sorted(SCRAM_MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """Salt and hash ``password`` for ``mechanism`` (scramp; a random salt unless given).

    Raises:
        CredentialError: unknown mechanism, iterations out of range, empty
            password, or one SASLprep prohibits.
    """
    _check("-", mechanism, iterations)
    if not password:
        raise CredentialError("the password must not be empty")
    import scramp  # here, not at the top: every `pipeline` command loads this module's names

    try:
        salt, stored_key, server_key, iterations = scramp.ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations, salt=salt)
    except scramp.ScramException as exc:
        raise CredentialError(f"password not usable for {mechanism}: {exc}") from None
    return ScramCredential(mechanism, salt, stored_key, server_key, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted_password: bytes,
                                    iterations: int) -> ScramCredential:
    """The credential for a password the client already salted (AlterUserScramCredentials, KIP-554).

    StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey =
    HMAC(SaltedPassword, "Server Key") (RFC 5802 section 3; Kafka
    ``ScramFormatter.generateCredential``).

    Raises:
        CredentialError: unknown mechanism, iterations out of range, empty salt or salted password.
    """
    _check("-", mechanism, iterations)
    if not salt or not salted_password:
        raise CredentialError("salt and salted password must not be empty")
    digest = _HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    server_key = hmac.new(salted_password, b"Server Key", digest).digest()
    return ScramCredential(mechanism, bytes(salt), digest(client_key).digest(), server_key, iterations)


class UserStore:
    """SCRAM credentials in ``target``: a SQLite file (created with its folder, mode 0600), or a
    PostgreSQL URL.

    Raises ``sqlite3.Error`` or ``psycopg.Error`` when the database cannot be read or written.
    """

    def __init__(self, target: Target) -> None:
        if not is_postgres_url(target):
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                # Only hashes inside, but still nobody else's business.
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        # SQLite's rollback journal, as before the shared seam: `pipeline users add` writes it from
        # another process while a server reads it.
        self._db = open_database(target, wal=False)
        self._db.migrate(COMPONENT, MIGRATIONS)
        self.path = target if self._db.dialect == "sqlite" else self._db.name
        """The SQLite file, or the URL without its password (for logs)."""

    @classmethod
    def for_data_dir(cls, data_dir: Path | str, metadata_url: str | None = None) -> "UserStore":
        """The store of a server: ``DATA_DIR/_pipeline/users.db``, or the database of ``metadata_url``."""
        return cls(store_target(metadata_url, data_dir, USERS_FILE))

    def close(self) -> None:
        self._db.close()

    def put(self, user: str, credential: ScramCredential) -> None:
        """Add or replace ``user``'s credential for ``credential.mechanism``.

        Raises:
            CredentialError: empty user name, unknown mechanism, iterations out of range.
        """
        _check(user, credential.mechanism, credential.iterations)
        with self._db.transaction() as cur:
            cur.execute(_PUT, (user, credential.mechanism, credential.salt, credential.stored_key,
                               credential.server_key, credential.iterations))

    def add(self, user: str, password: str, mechanisms: tuple[str, ...] = tuple(SCRAM_MECHANISMS),
            iterations: int = DEFAULT_ITERATIONS) -> None:
        """Salt and store ``password`` for ``user`` under each of ``mechanisms`` (replacing old ones).

        Raises:
            CredentialError: see ``make_credential``; nothing is stored then.
        """
        credentials = [make_credential(m, password, iterations) for m in mechanisms]
        for credential in credentials:
            _check(user, credential.mechanism, credential.iterations)
        with self._db.transaction() as cur:
            cur.executemany(_PUT, [(user, c.mechanism, c.salt, c.stored_key, c.server_key, c.iterations)
                                   for c in credentials])

    def remove(self, user: str, mechanism: str | None = None) -> int:
        """Delete ``user``'s credential for ``mechanism`` (all of them if None); how many were deleted."""
        with self._db.transaction() as cur:
            if mechanism is None:
                return cur.execute('DELETE FROM scram_credentials WHERE "user" = ?', (user,)).rowcount
            return cur.execute('DELETE FROM scram_credentials WHERE "user" = ? AND mechanism = ?',
                               (user, mechanism)).rowcount

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        """``user``'s credential for ``mechanism``, None if there is none."""
        with self._db.transaction(write=False) as cur:
            row = cur.execute('SELECT salt, stored_key, server_key, iterations FROM scram_credentials '
                              'WHERE "user" = ? AND mechanism = ?', (user, mechanism)).fetchone()
        return None if row is None else ScramCredential(mechanism, bytes(row[0]), bytes(row[1]), bytes(row[2]),
                                                         row[3])

    def users(self) -> dict[str, dict[str, int]]:
        """Every user -> {mechanism: iterations}, users sorted by name. No secret leaves the store."""
        with self._db.transaction(write=False) as cur:
            rows = cur.execute('SELECT "user", mechanism, iterations FROM scram_credentials '
                               'ORDER BY "user", mechanism').fetchall()
        result: dict[str, dict[str, int]] = {}
        for user, mechanism, iterations in rows:
            result.setdefault(user, {})[mechanism] = iterations
        return result

    def verify_plain(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (SASL/PLAIN, RFC 4616), against the SCRAM credential.

        Salts ``password`` again with the stored salt and iterations of the
        user's SCRAM-SHA-512 credential (else SCRAM-SHA-256) and compares the
        stored keys in constant time. An unknown user costs the same PBKDF2 as
        a known one, so the time taken does not say whether the user exists.
        """
        credential = self.get(user, "SCRAM-SHA-512") or self.get(user, "SCRAM-SHA-256")
        if credential is None:
            credential, known = _DUMMY_PLAIN, False
        else:
            known = True
        import scramp

        try:
            _salt, stored_key, _server_key, _i = scramp.ScramMechanism(credential.mechanism).make_auth_info(
                password, iteration_count=credential.iterations, salt=credential.salt)
        except scramp.ScramException:  # SASLprep-prohibited characters: never anyone's password
            return False
        return hmac.compare_digest(stored_key, credential.stored_key) and known


_DUMMY_PLAIN = ScramCredential("SCRAM-SHA-512", b"\0" * 16, b"\0" * 64, b"\0" * 64, DEFAULT_ITERATIONS)
