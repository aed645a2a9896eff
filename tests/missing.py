"""What a test does when a tool it needs is not on this machine (kcat, tini, socat, PostgreSQL, the
JVM's class-data archive, network namespaces): skip, naming it, on a developer's machine; fail under
CI (``CI`` set), where ``.ci/run`` installs every one of them, so a missing tool cannot pass as a skip."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def missing(reason: str) -> NoReturn:
    """Skip the test with ``reason``, or fail it under CI.

    Raises:
        pytest.fail.Exception: ``CI`` is set.
        pytest.skip.Exception: otherwise.
    """
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; under CI it must be there (.ci/run installs it)")
    pytest.skip(reason)


def need_command(name: str, package: str) -> str:
    """The path of command ``name``; if it is not on PATH, ``missing`` (Debian's ``package`` has it)."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (apt-get install {package})")
    return path
