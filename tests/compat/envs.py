"""The client generations of the compatibility matrix and their cached environments (issue 22).

Each client runs from an environment of its own, never from the project's dependencies: a
virtual environment per Python client release, a ``node_modules`` per kafkajs release, all
under ``CACHE`` (``.cache/compat`` in the work tree, or ``$COMPAT_CACHE``: not a ``PIPELINE_*``
name, which the server would take for a configuration key). Building is
idempotent: an environment whose stamp file names exactly its requirements is kept, any other
is removed and built again, the stamp written last (an interrupted build is redone).

``.ci/run`` builds them before ``make test``::

    python3 -m tests.compat.envs      # or: python3 tests/compat/envs.py

and ``tests/compat/test_matrix.py`` calls ``build`` itself for any that is missing. Standard
library only: it runs before the project's own ``.venv`` exists.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("COMPAT_CACHE", ROOT / ".cache" / "compat"))
BUILD_COMMAND = "python3 -m tests.compat.envs"


@dataclass(frozen=True)
class Client:
    """One client generation: ``family`` picks its driver (``tests/compat/driver_<family>``)."""

    family: str  # confluent | kafka_python | aiokafka | kafkajs | kcat
    version: str
    requirements: tuple[str, ...] = ()  # pip requirements (Python families) or npm specs (kafkajs)
    note: str = ""  # why this release, shown under the matrix

    @property
    def name(self) -> str:
        return {"confluent": "confluent-kafka", "kafka_python": "kafka-python"}.get(self.family, self.family)

    @property
    def key(self) -> str:
        """``family-version``: the environment's directory and the topics' and groups' prefix."""
        return f"{self.family}-{self.version}".replace("_", "-")

    @property
    def env(self) -> Path:
        return CACHE / ("node" if self.family == "kafkajs" else "venvs") / self.key

    @property
    def command(self) -> list[str]:
        """The driver's command line (its input file is appended)."""
        here = Path(__file__).resolve().parent
        if self.family == "kafkajs":
            return ["node", str(here / "driver_kafkajs.js"), str(self.env / "node_modules")]
        if self.family == "kcat":
            return [sys.executable, str(here / "driver_kcat.py")]
        return [str(self.env / "bin" / "python"), str(here / f"driver_{self.family}.py")]

    @property
    def built(self) -> bool:
        return not self.requirements or _stamp(self.env) == self._stamp_text()

    def _stamp_text(self) -> str:
        return json.dumps({"requirements": list(self.requirements), "python": sys.version_info[:2]})


# "Latest" is the newest release when this list was last updated (November 2026); bump it here.
CLIENTS = (
    Client("confluent", "2.0.2", ("confluent-kafka==2.0.2",), "bundles librdkafka 2.0.2"),
    Client("confluent", "2.6.0", ("confluent-kafka==2.6.0",), "October 2024"),
    Client("confluent", "2.16.1", ("confluent-kafka==2.16.1",), "latest"),
    Client("kcat", "1.7.1", (), "Debian 12's package, librdkafka 2.0.2 (/usr/bin/kcat)"),
    Client("kafka_python", "2.0.2", ("kafka-python==2.0.2",), "the last 2.0 release (2020)"),
    Client("kafka_python", "3.0.12", ("kafka-python==3.0.12",), "latest"),
    # 0.7.0 is the oldest aiokafka that installs and runs on Python 3.11: 0.6.0 installs but passes
    # loop= to asyncio.Lock (removed in Python 3.10), 0.5.x and older fail to import
    # (asyncio.coroutine, removed in 3.11). Its sdist is compiled here (no cp311 wheel before 0.8.0)
    # and it needs the kafka-python of its time (kafka.conn, gone in kafka-python 3).
    Client("aiokafka", "0.7.0", ("aiokafka==0.7.0", "kafka-python==2.0.2"),
           "oldest that runs on Python 3.11, with kafka-python 2.0.2"),
    Client("aiokafka", "0.14.0", ("aiokafka==0.14.0",), "latest"),
    Client("kafkajs", "1.16.0", ("kafkajs@1.16.0",), "the last 1.x release"),
    Client("kafkajs", "2.2.4", ("kafkajs@2.2.4",), "latest"),
)


def _stamp(env: Path) -> str | None:
    try:
        return (env / ".stamp").read_text()
    except OSError:
        return None


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}; see {log}")


def build_one(client: Client, python: str = sys.executable) -> str:
    """Build ``client``'s environment unless its stamp says it is built; returns what was done."""
    if client.built:
        return f"{client.key}: cached"
    env = client.env
    shutil.rmtree(env, ignore_errors=True)
    env.mkdir(parents=True)
    log = env.parent / f"{client.key}.log"
    log.unlink(missing_ok=True)
    if client.family == "kafkajs":
        _run(["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(env), *client.requirements],
             log)
    else:
        _run([python, "-m", "venv", str(env)], log)
        _run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              *client.requirements], log)
    (env / ".stamp").write_text(client._stamp_text())
    return f"{client.key}: built"


def build(clients: tuple[Client, ...] = CLIENTS, python: str = sys.executable) -> list[str]:
    """Build every missing environment, four at a time, under a lock on the cache directory."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda c: build_one(c, python), clients))


def main() -> None:
    for line in build():
        print(line)
    if shutil.which("kcat") is None:
        print("kcat is not installed (apt-get install kcat; .ci/run installs it)")


if __name__ == "__main__":
    main()
