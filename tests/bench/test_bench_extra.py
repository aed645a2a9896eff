"""The benchmarks' libraries are pyproject's ``bench`` extra, not dependencies of the broker (issue 36).

``pip install pipeline`` without extras must serve, run ``pipeline sql`` and the rest without matplotlib
and confluent-kafka; ``pipeline bench`` without them exits naming the extra. The second half runs in
a child process whose imports of those two fail as they would on such an install (a ``sys.meta_path``
finder in front of every other), so it checks the real import graph of every module outside
``pipeline.bench``.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

from packaging.requirements import Requirement

from pipeline.bench.dispatch import BENCH_MODULES


def requirements(extra: str | None) -> set[str]:
    """The installed distribution's requirement names: unconditional ones (``extra`` None) or an extra's."""
    names = set()
    for text in importlib.metadata.requires("pipeline") or []:
        requirement = Requirement(text)
        if extra is None and requirement.marker is None:
            names.add(requirement.name)
        elif extra is not None and requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
            names.add(requirement.name)
    return names


def test_the_benchmarks_libraries_are_the_bench_extra_only():
    runtime = requirements(None)
    assert runtime and not runtime & set(BENCH_MODULES.values())
    assert requirements("bench") == set(BENCH_MODULES.values())
    assert "pipeline" in requirements("dev")  # dev pulls pipeline[bench]: tests/bench runs the benchmarks


CHILD = r"""
import contextlib, importlib, io, pkgutil, sys

BLOCKED = {"matplotlib", "confluent_kafka"}


class Blocked:
    '''Refuses the bench extra's packages as an install without them does.'''

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, Blocked)
import pipeline
from pipeline.cli import main

imported = 0
for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
    if info.name == "pipeline.bench" or info.name.startswith("pipeline.bench."):
        continue
    importlib.import_module(info.name)
    imported += 1
for argv in (["serve", "--help"], ["sql", "--help"], ["bench", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
try:
    main(["bench", "--quick"])
except SystemExit as exc:
    print("bench:", exc.code)
print("imported", imported)
print("loaded", sorted(BLOCKED & {m.split(".")[0] for m in sys.modules}))
"""


def test_the_broker_imports_and_bench_names_the_extra_without_the_bench_libraries():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert "bench: pipeline bench: matplotlib, confluent-kafka missing; the benchmarks need the bench extra: " \
           "pip install 'pipeline[bench]' (make installs it)" in lines, proc.stdout
    assert int(next(line for line in lines if line.startswith("imported ")).split()[1]) > 50
    assert "loaded []" in lines
