"""Session-scoped ``pipeline serve`` servers that end-to-end tests share (issue 21).

Each start is a Spark JVM (15-40 s on the 2-core CI machine), so a test that
needs neither a restart, nor a crash, nor a server-level setting of its own
joins one of these, and uses topics and group ids no other test uses (its
module's name as a prefix) and the helpers in ``tests/e2e/shared_server.py``.

* ``multiqueue_server``: the default request path, with settings that suit
  all its users: a table commit every second (so table checks do not wait
  long; no background compaction, see shared_server.py), no initial rebalance delay, a
  configured ``log.retention.ms`` (so admin tools see a STATIC_BROKER_CONFIG
  default), a metrics endpoint on a free port.
* ``baseline_server``: the same with ``--mode baseline`` (classic Kafka: one
  shared queue, a handler pool, mute until response).

Each starts on first use and stops at the end of the session with SIGTERM:
exit code 0 and no child process left behind, or the session reports an error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.server_process import ServerProcess
from tests.e2e.shared_server import BASELINE_ARGS, MULTIQUEUE_ARGS, stop_cleanly


def _shared(tmp_path_factory: pytest.TempPathFactory, name: str, args: tuple[str, ...]) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp(name) / "data", *args).start()
    try:
        yield server
    finally:
        if server.running:
            code, left = stop_cleanly(server)
            assert code == 0, server.log_text()
            assert left == [], f"child processes left behind by the {name} server: {left}"
        else:
            server.kill()
            pytest.fail(f"the shared {name} server exited early ({server.proc.returncode}):\n{server.log_text()}")


@pytest.fixture(scope="session")
def multiqueue_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """The shared ``--mode multiqueue`` server (see the module docstring)."""
    yield from _shared(tmp_path_factory, "shared-multiqueue", MULTIQUEUE_ARGS)


@pytest.fixture(scope="session")
def baseline_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """The shared ``--mode baseline`` server (see the module docstring)."""
    yield from _shared(tmp_path_factory, "shared-baseline", BASELINE_ARGS)



@pytest.fixture(autouse=True)
def in_order(request):
    """A story module's steps (tests taking its module-scoped ``story``: test_durability, test_transactions)
    run in file order; after a failed one the rest are skipped (they build on it)."""
    if "story" not in request.fixturenames:
        yield
        return
    story = request.getfixturevalue("story")
    if story.failed_step:
        pytest.skip(f"an earlier step of the story failed: {story.failed_step}")
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        story.failed_step = request.node.name
        story.abort()
