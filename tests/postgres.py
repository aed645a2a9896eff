"""A real PostgreSQL server for tests: Debian's binaries, a private data dir, socket dir and port.

``initdb`` into a fresh temporary folder, then ``postgres`` on a free port of
127.0.0.1 only, its Unix socket in that folder too, so it meets no other
server on the machine (Debian's own cluster on 5432 included). PostgreSQL
refuses to run as root: as root the server runs as the ``postgres`` user that
Debian's package creates (``.ci/run`` installs the package when ``initdb`` is
missing). ``stop`` asks for a fast shutdown and waits for the process, so no
server outlives the session; its folder is removed then.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.e2e.server_process import free_port

SUPERUSER = "postgres"


def binaries() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: Debian's newest /usr/lib/postgresql/N/bin, else PATH's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class PostgresServer:
    """One ``postgres`` process (``start``/``stop``); ``url(db)`` names a database on it.

    ``listen``: the addresses it listens on, 127.0.0.1 first (its own checks and ``url``'s
    default use that one); the multi-host failover test adds its bridge's address, which
    brokers in network namespaces reach (``url(db, host=...)``). ``clients``: networks
    (CIDR) besides loopback whose connections ``pg_hba.conf`` trusts (that test's subnet).
    """

    def __init__(self, bin_dir: Path, listen: tuple[str, ...] = ("127.0.0.1",), clients: tuple[str, ...] = ()) -> None:
        self.bin_dir = bin_dir
        self.listen = listen
        self.clients = clients
        self.dir = Path(tempfile.mkdtemp(prefix="pipeline-pg-"))
        self.data = self.dir / "data"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = self.dir / "postgres.log"
        self._names = itertools.count()
        # Root may not run the server: it runs as Debian's postgres user, who must own the folder.
        self._user = SUPERUSER if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)

    def _run_as(self) -> dict:
        return {"user": self._user} if self._user is not None else {}

    def start(self, timeout_s: float = 120.0) -> None:
        """initdb, then start the server and wait until it accepts connections.

        Raises:
            RuntimeError: initdb failed, or the server exited or did not answer within ``timeout_s``.
        """
        init = subprocess.run([str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust",
                               "-E", "UTF8", "--locale=C", "--no-sync"],
                              capture_output=True, text=True, cwd=self.dir, **self._run_as())
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
        if self.clients:
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in self.clients)
        for _attempt in range(3):  # a free port can be taken between the pick and the bind
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                     "-c", f"listen_addresses={','.join(self.listen)}", "-c", f"unix_socket_directories={self.dir}",
                     "-c", "max_connections=200"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
                    **self._run_as())
            if self._wait_ready(timeout_s):
                return
            if self.proc.poll() is None:
                self.stop(remove=False)
                raise RuntimeError(f"postgres did not answer in {timeout_s} s: {self.log()}")
        raise RuntimeError(f"postgres did not start: {self.log()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def url(self, database: str, host: str | None = None) -> str:
        """``postgresql://postgres@HOST:PORT/<database>`` (trust authentication: no password); HOST
        is the first of ``listen`` unless given."""
        return f"postgresql://{SUPERUSER}@{host or self.listen[0]}:{self.port}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"{prefix}_{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self, remove: bool = True) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit), wait for the process
        (SIGKILL after 60 s), then remove the folder."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


# -- fixtures (imported by tests/conftest.py) -------------------------------------------------------

import pytest  # noqa: E402

from tests.missing import missing  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the session (per pytest-xdist worker that asks for it), stopped after.

    Without PostgreSQL's binaries the tests that need it are skipped, except under CI (``tests.missing``: ``CI`` set),
    where ``.ci/run`` installs them and their absence is a failure.
    """
    bin_dir = binaries()
    if bin_dir is None:
        missing("PostgreSQL's initdb is missing (apt-get install postgresql)")
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_target(request, tmp_path):
    """Where a test's metadata stores live, once per backend: ``target(file)`` is ``tmp_path / file``
    on SQLite (one file per store, as a server's ``DATA_DIR/_pipeline``), and the URL of a fresh
    database of the session's PostgreSQL server (every store in it, as ``pipeline.metadata.url``)."""
    if request.param == "sqlite":
        return lambda file: tmp_path / file
    url = request.getfixturevalue("postgres_server").create_database()
    return lambda file: url
