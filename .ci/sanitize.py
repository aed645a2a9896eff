"""The C extensions' differential and fuzz tests under AddressSanitizer and UndefinedBehaviorSanitizer.

Builds pipeline's C extensions (pyproject's ``[[tool.setuptools.ext-modules]]``) with
``-fsanitize=address,undefined`` into a temporary directory (the installed ``.so`` files stay as they
are), then runs ``TEST_FILES`` on that build: a ``sitecustomize`` first on ``PYTHONPATH`` puts a finder
for the extensions in front of ``sys.meta_path`` in every Python process of the run (the fuzz test's
child process too). libasan is preloaded, as CPython is not built with it; leak detection is off
(CPython leaks at exit by design); UBSan stops at its first report. A report aborts the process, so the
run fails; the run also fails unless every extension it imported is the sanitized build (each one's
``__file__``, printed at the end).

Usage (``make sanitize``; ``.ci/run`` runs it before ``make test``, outside pytest's budget, ~1-2 min)::

    .venv/bin/python .ci/sanitize.py [more pytest arguments]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TEST_FILES = [
    "tests/protocol/test_native_records.py",  # _records.scan/columns against kafka-python, mutated records
    "tests/protocol/test_records_summary.py",  # _records.summarize against the Python walk
    "tests/protocol/test_produce_fast_path.py",  # the C Produce decode against kio's
    "tests/protocol/test_protocol_fuzz.py",  # validate_records (C summary in front) on random bytes
    "tests/protocol/test_fuzz_requests.py",  # hostile frames through the request path, and its child process
    "tests/network/test_take_requests.py",  # _frames.cut against next_request
    "tests/network/test_fuzz_framing.py",  # ConnectionState on fuzzed streams
    "tests/network/test_request_metrics.py",  # _stages.record against the Python rules
    "tests/test_fastinit.py",  # _frames.Layout
    "tests/table/test_arrow.py",  # _records.columns into Arrow
    "tests/table/test_avro_columns.py",  # _avro.columns against fastavro, mutated values, random bytes
]
"""The tests that run the C extensions against Python, or on hostile input."""

FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1"]

SITECUSTOMIZE = '''\
"""Written by .ci/sanitize.py: pipeline's C extensions from its sanitizer build."""
import importlib.util
import sys

BUILT = {built!r}


class SanitizedExtensions:
    @staticmethod
    def find_spec(name, path=None, target=None):
        file = BUILT.get(name)
        return None if file is None else importlib.util.spec_from_file_location(name, file)


sys.meta_path.insert(0, SanitizedExtensions)
'''

PLUGIN = '''\
"""Written by .ci/sanitize.py: which file each extension the run imported came from."""
import json
import sys


def pytest_sessionfinish(session, exitstatus):
    with open({report!r}, "w") as f:
        json.dump({{name: getattr(sys.modules.get(name), "__file__", None) for name in {names!r}}}, f)
'''


def build(out: Path) -> dict[str, str]:
    """Build every extension of pyproject.toml with ``FLAGS`` into ``out``; {module name: .so path}.

    Raises:
        setuptools.errors.CompileError, setuptools.errors.LinkError: gcc failed (its output is above).
    """
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extensions = [Extension(e["name"], [str(ROOT / s) for s in e["sources"]],
                            extra_compile_args=[*e.get("extra-compile-args", []), *FLAGS], extra_link_args=FLAGS)
                  for e in config["tool"]["setuptools"]["ext-modules"]]
    command = build_ext(Distribution({"name": "pipeline-sanitized", "ext_modules": extensions}))
    command.build_lib, command.build_temp = str(out / "lib"), str(out / "obj")
    command.ensure_finalized()
    command.run()
    built = {e.name: str(out / "lib" / command.get_ext_filename(e.name)) for e in extensions}
    assert all(Path(path).exists() for path in built.values()), built
    return built


def main(argv: list[str]) -> int:
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="pipeline-sanitize-") as tmp:
        out = Path(tmp)
        built = build(out)
        site = out / "site"
        site.mkdir()
        report = out / "imported.json"
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(built=built))
        (site / "sanitize_report.py").write_text(PLUGIN.format(report=str(report), names=sorted(built)))
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   LD_PRELOAD=libasan, ASAN_OPTIONS="detect_leaks=0",
                   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
        # --capture=sys: a sanitizer writes its report to file descriptor 2 and ends the process, so
        # pytest's default capture of that descriptor would swallow it.
        code = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "sanitize_report",
                               "--capture=sys", "-q", *TEST_FILES, *argv], cwd=ROOT, env=env).returncode
        imported = json.loads(report.read_text()) if report.exists() else {}
        for name in sorted(built):
            print(f"sanitize: {name} from {imported.get(name)}")
        if code == 0 and imported != built:
            print(f"sanitize: the run did not import every extension from the sanitizer build {out / 'lib'}")
            return 1
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
