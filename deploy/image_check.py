"""The image check: build deploy/Containerfile for real, then serve from the image's own filesystem.

    python3 deploy/image_check.py       # from the repository root, as root, on Debian 12; .ci/run runs it

What it does (issue 24, "The image is built for real"):

1. installs Debian's ``podman`` and ``debootstrap`` (and ``iproute2``) if they are missing;
2. builds a local base image: ``debootstrap --variant=minbase bookworm`` from the Debian mirror apt already
   uses (``apt-get indextargets``), with Debian's python3.11 as ``python`` (python-is-python3), pip and venv
   (what ``ARG PYTHON_IMAGE`` must provide, as ``python:3.11-slim-bookworm`` does), apt sources for bookworm,
   its updates and security, and this host's own CA certificates (``/usr/local/share/ca-certificates``: a
   TLS-inspecting proxy's CA must be trusted inside the build too), then ``podman import``;
3. builds deploy/Containerfile on it: ``podman build --isolation chroot --format docker
   --build-arg PYTHON_IMAGE=<base>`` (the docker format keeps the HEALTHCHECK);
4. creates a container of the image without starting it (``podman run`` needs crun's setrlimit, which some
   sandboxes refuse), ``podman mount``s its root filesystem and runs the image's ENTRYPOINT + CMD there
   under ``chroot``, as its USER (with that user's primary group), in its WORKDIR, with its ENV (plus
   HOSTNAME, and HOME from its passwd), in namespaces of its own: network (the image's fixed ports collide
   with nothing on the host; only loopback inside), PID (tini is PID 1, as in a container), UTS and mount
   (/dev, /sys, a new /proc, and a fresh directory for each VOLUME, owned as the image's directory is, as a
   new named volume is). It waits until ``/readyz`` on the command's ``--metrics-port`` answers 200 from
   inside (the image's python, as the probes of deploy/ do), runs the image's HEALTHCHECK command the same
   way, produces ``RECORDS`` records with the image's kafka-python to the port of ``--listen`` and waits
   until the image's Spark has written them to the table (``pipeline_flush_records_total``), then sends the
   STOPSIGNAL and expects exit status 0 within ``STOP_S``.

Everything it starts, mounts or creates for a run is stopped, unmounted and removed whatever happens (also on
SIGTERM or Ctrl-C); every wait is bounded. Exit status 1 with ``image check FAILED: <step>: <why>`` on a
failure.

Cached between runs, under ``$IMAGE_CACHE`` (default ``.cache/image``, git-ignored): a podman storage of the
check's own (``--root``), so nothing of the host's podman images is touched, holding the base image (keyed by
its recipe: a new mirror, package list or CA certificate builds a new one) and the last build's layers; unused
images are pruned after each build. Logs of each step are in ``$IMAGE_CACHE/logs``. Standard library only: it
runs on the host's ``python3`` before any virtual environment exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
CONTAINERFILE = REPO / "deploy" / "Containerfile"
IGNOREFILE = REPO / "deploy" / "Containerfile.dockerignore"
CACHE = Path(os.environ.get("IMAGE_CACHE", REPO / ".cache" / "image")).resolve()

SUITE = "bookworm"
"""Debian 12, the release of ``python:3.11-slim-bookworm`` (the Containerfile's default base): its archive has
openjdk-17 (see the Containerfile)."""
BASE_PACKAGES = ("python3.11", "python-is-python3", "python3-pip", "python3-venv", "ca-certificates")
"""What ``ARG PYTHON_IMAGE`` must provide: ``python`` and ``pip`` on PATH (the build stage runs ``pip wheel``,
the runtime stage ``python -m venv``), and CA certificates for pip's downloads."""
BASE_RECIPE_VERSION = 1
"""Bump to rebuild the base when the recipe changes in a way the key below does not see."""
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
FALLBACK_MIRROR = "http://deb.debian.org/debian"
IMAGE = "localhost/pipeline-image-check:latest"
BUILD_STAGE = "build"
"""The Containerfile's first stage, tagged too so its layers (the wheels) survive the prune for the next run."""
CONTAINER = "pipeline-image-check"
HOSTNAME = "pipeline-image-check"

APT_S = 900
DEBOOTSTRAP_S = 1200
BUILD_S = 3600
"""One ``podman build``: pip downloads pyspark (~460 MB) and Debian's JRE; ~2 min here, bounded generously."""
READY_S = 600
"""From the command's start to /readyz 200: the interpreter's imports, Spark's JVM, WAL recovery (20-90 s
here on a loaded machine)."""
PROBE_S = 15
STOP_S = 120
"""The stop grace the deploy files give (deploy/README.md): the drain (30 s) then Spark's stop (60 s), and margin."""
KILL_S = 15
RECORDS = 10
PRODUCE_S = 120
PRODUCE = """
import sys
from kafka import KafkaProducer
producer = KafkaProducer(bootstrap_servers="127.0.0.1:{port}", enable_idempotence=True, acks="all")
futures = [producer.send("image-check", value=b"record %d" % i) for i in range({n})]
producer.flush(100)
errors = [str(f.exception) for f in futures if f.failed()]
left = sum(1 for f in futures if not f.is_done)
producer.close(10)
sys.exit(f"{{left}} not delivered, errors: {{errors}}" if left or errors else 0)
"""
"""Run by the image's python inside: ``n`` records with kafka-python (a dependency of the package; the
image has no bench extra, so no confluent-kafka), each acknowledged."""
FLUSHED = """
import urllib.request
text = urllib.request.urlopen({url!r}, timeout=5).read().decode()
print(next((l.split()[-1] for l in text.splitlines() if l.startswith("pipeline_flush_records_total ")), 0))
"""
"""Prints the server's ``pipeline_flush_records_total``: records Spark wrote to the table."""
LOCK_S = 3600
"""Another check on the same cache (a second CI job on the host) is waited for this long at most."""
ATTEMPTS = 3
"""Tries of a step that downloads (apt, debootstrap, podman build): a mirror's or PyPI's hiccup is not a failure
of the image."""
RETRY_PAUSE_S = 15


class CheckFailed(Exception):
    """A step failed; the message says which and why."""


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the check: clean up and exit non-zero."""


@dataclass(frozen=True)
class Step:
    name: str
    log: Path


def log(message: str) -> None:
    print(f"image check: {message}", flush=True)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run(
    cmd: Sequence[str],
    *,
    step: Step,
    timeout: float,
    attempts: int = 1,
    env: dict[str, str] | None = None,
    before_retry: Sequence[str] | None = None,
) -> str:
    """Run ``cmd`` to completion, its output appended to ``step.log``; return its stdout.

    Raises:
        CheckFailed: it exited non-zero or ran past ``timeout`` seconds ``attempts`` times, with the log's tail.
    """
    for attempt in range(1, attempts + 1):
        with step.log.open("a") as out:
            out.write(f"$ {shlex.join(cmd)}  # attempt {attempt}/{attempts}\n")
            out.flush()
            try:
                done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, text=True, timeout=timeout, env=env)
                out.write(done.stdout)
                if done.returncode == 0:
                    return done.stdout
                why = f"exit status {done.returncode}"
            except subprocess.TimeoutExpired as exc:
                out.write(exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or "")
                why = f"no end within {timeout:.0f} s"
        if attempt < attempts:
            log(f"{step.name}: {shlex.join(cmd[:3])} ...: {why}; again in {RETRY_PAUSE_S} s")
            if before_retry:
                subprocess.run(before_retry, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            time.sleep(RETRY_PAUSE_S)
    raise CheckFailed(f"{step.name}: `{shlex.join(cmd)}`: {why}; {step.log}:\n{tail(step.log)}")


def step(name: str) -> Step:
    logs = CACHE / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{name}.log"
    path.write_text("")
    return Step(name, path)


# ------------------------------------------------------------------ podman, on the check's own storage


def podman_cmd() -> list[str]:
    """``podman`` on the storage under ``CACHE``; its run-time state in /run, named after that storage."""
    storage = CACHE / "storage"
    run_dir = Path("/run") / f"pipeline-image-check-{hashlib.sha256(bytes(storage)).hexdigest()[:12]}"
    return ["podman", "--root", str(storage), "--runroot", str(run_dir / "runroot"), "--tmpdir", str(run_dir / "tmp")]


PODMAN = podman_cmd()


def podman(*args: str, step: Step, timeout: float = 120, attempts: int = 1) -> str:
    return run([*PODMAN, *args], step=step, timeout=timeout, attempts=attempts).strip()


def podman_ok(*args: str, timeout: float = 120) -> bool:
    """``podman ARGS`` exited 0 (for questions such as ``image exists``, and cleanup that may find nothing)."""
    try:
        done = subprocess.run([*PODMAN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


# ------------------------------------------------------------------ 1. tools


def install_tools() -> None:
    wanted = {"podman": "podman", "debootstrap": "debootstrap", "ip": "iproute2", "unshare": "util-linux"}
    missing = sorted({package for command, package in wanted.items() if shutil.which(command) is None})
    if not missing:
        return
    s = step("apt")
    log(f"installing {' '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], step=s, timeout=APT_S, attempts=ATTEMPTS, env=env)
    run(["apt-get", "install", "-y", "-qq", *missing], step=s, timeout=APT_S, attempts=ATTEMPTS, env=env)


# ------------------------------------------------------------------ 2. the base image


def apt_sources() -> list[tuple[str, str, str]]:
    """(URI, suite, component) of this host's apt sources for ``SUITE``, its updates and its security suite,
    as apt itself reads them (one-line or deb822 files); Debian's own mirror if the host has none."""
    suites = {SUITE, f"{SUITE}-updates", f"{SUITE}-security"}
    done = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE) $(COMPONENT)", "Identifier: Packages"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found: list[tuple[str, str, str]] = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in suites and urllib.parse.urlsplit(parts[0]).scheme in ("http", "https"):
            entry = (parts[0].rstrip("/"), parts[1], parts[2])
            if entry not in found:
                found.append(entry)
    if not any(suite == SUITE for _, suite, _ in found):
        security = FALLBACK_MIRROR + "-security"
        found = [(FALLBACK_MIRROR, SUITE, "main"), (FALLBACK_MIRROR, f"{SUITE}-updates", "main")]
        found.append((security, f"{SUITE}-security", "main"))
    return found


def host_ca_certificates() -> list[Path]:
    return sorted(p for p in HOST_CA_DIR.rglob("*.crt") if p.is_file()) if HOST_CA_DIR.is_dir() else []


def base_tag(sources: list[tuple[str, str, str]], certificates: list[Path]) -> str:
    """The base image's name: its recipe's hash, so a changed recipe builds a new one."""
    recipe = {
        "version": BASE_RECIPE_VERSION,
        "suite": SUITE,
        "packages": BASE_PACKAGES,
        "sources": sources,
        "certificates": [hashlib.sha256(p.read_bytes()).hexdigest() for p in certificates],
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return f"localhost/pipeline-image-check-base:{SUITE}-{key}"


def sources_list(sources: list[tuple[str, str, str]]) -> str:
    lines: dict[tuple[str, str], list[str]] = {}
    for uri, suite, component in sources:
        lines.setdefault((uri, suite), []).append(component)
    return "".join(f"deb {uri} {suite} {' '.join(components)}\n" for (uri, suite), components in lines.items())


def build_base() -> str:
    """The base image's tag, built (debootstrap, then ``podman import``) unless the cache has it."""
    sources = apt_sources()
    certificates = host_ca_certificates()
    tag = base_tag(sources, certificates)
    if podman_ok("image", "exists", tag):
        log(f"base {tag}: cached")
        return tag
    mirror = next(uri for uri, suite, _ in sources if suite == SUITE)
    s = step("base")
    rootfs = CACHE / "rootfs"
    clean_rootfs = ["rm", "-rf", "--one-file-system", str(rootfs)]
    subprocess.run(clean_rootfs, check=True, timeout=600)
    log(f"base {tag}: debootstrap --variant=minbase {SUITE} from {mirror}")
    started = time.monotonic()
    try:
        run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), mirror],
            step=s,
            timeout=DEBOOTSTRAP_S,
            attempts=ATTEMPTS,
            before_retry=clean_rootfs,
        )
        (rootfs / "etc/apt/sources.list").write_text(sources_list(sources))
        if certificates:
            target = rootfs / HOST_CA_DIR.relative_to("/")
            for cert in certificates:
                destination = target / cert.relative_to(HOST_CA_DIR)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cert, destination)
            run(["chroot", str(rootfs), "update-ca-certificates"], step=s, timeout=120)
        # As a slim image: no package lists or archives (the Containerfile runs apt-get update itself), and
        # nothing of this host's identity (a container engine provides these files at run time).
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        for identity in ("etc/hostname", "etc/resolv.conf", "etc/hosts"):
            (rootfs / identity).unlink(missing_ok=True)
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["python3"]',
        ]
        import_cmd = f"tar -C {shlex.quote(str(rootfs))} -c . | {shlex.join(PODMAN)} import"
        import_cmd += "".join(f" --change {shlex.quote(c)}" for c in changes) + f" - {shlex.quote(tag)}"
        run(["bash", "-o", "pipefail", "-c", import_cmd], step=s, timeout=600)
    finally:
        subprocess.run(clean_rootfs, timeout=600)
    for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}", step=s).split():
        if old.startswith(tag.split(":")[0] + ":") and old != tag:
            podman_ok("rmi", old)
    log(f"base {tag}: built in {time.monotonic() - started:.0f} s")
    return tag


# ------------------------------------------------------------------ 3. the project's image


def build_image(base: str) -> None:
    s = step("build")
    common = ["build", "--isolation", "chroot", "--format", "docker", "-f", str(CONTAINERFILE)]
    common += ["--ignorefile", str(IGNOREFILE), "--build-arg", f"PYTHON_IMAGE={base}"]
    log(f"podman build --isolation chroot -f deploy/Containerfile --build-arg PYTHON_IMAGE={base}")
    started = time.monotonic()
    podman(*common, "-t", IMAGE, str(REPO), step=s, timeout=BUILD_S, attempts=ATTEMPTS)
    # The build stage from the layers just made (seconds), tagged so that the prune keeps it for the next run.
    if not podman_ok(*common, "--target", BUILD_STAGE, "-t", IMAGE.replace(":latest", ":build"), str(REPO),
                     timeout=BUILD_S):
        log(f"(no stage {BUILD_STAGE!r} to keep: the next run rebuilds its wheels)")
    podman_ok("image", "prune", "-f", timeout=600)
    log(f"{IMAGE} built in {time.monotonic() - started:.0f} s")


# ------------------------------------------------------------------ 4. its command, from its filesystem


@dataclass(frozen=True)
class ImageConfig:
    """What ``podman image inspect`` says the image runs: argv = ENTRYPOINT + CMD."""

    argv: list[str]
    env: list[str]
    user: str
    workdir: str
    volumes: list[str]
    stop_signal: str
    healthcheck: list[str] | None


def image_config(s: Step) -> ImageConfig:
    [inspected] = json.loads(podman("image", "inspect", IMAGE, step=s))
    config = inspected["Config"]
    # podman keeps a docker-format image's HEALTHCHECK beside its Config (an OCI image has none)
    health = inspected.get("Healthcheck") or inspected.get("HealthCheck") or config.get("Healthcheck") or {}
    test = health.get("Test") or []
    healthcheck = None
    if test[:1] == ["CMD"]:
        healthcheck = test[1:]
    elif test[:1] == ["CMD-SHELL"]:
        healthcheck = ["/bin/sh", "-c", test[1]]
    return ImageConfig(
        argv=[*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])],
        env=list(config.get("Env") or []),
        user=config.get("User") or "0",
        workdir=config.get("WorkingDir") or "/",
        volumes=sorted(config.get("Volumes") or {}),
        stop_signal=config.get("StopSignal") or "SIGTERM",
        healthcheck=healthcheck,
    )


def resolve_user(root: Path, user: str) -> tuple[int, int, str]:
    """(uid, gid, home) of USER ``name|uid[:group|gid]`` in the image's /etc/passwd and /etc/group.

    Raises:
        CheckFailed: a name the image does not have.
    """
    passwd = [line.split(":") for line in (root / "etc/passwd").read_text().splitlines() if line.count(":") == 6]
    groups = [line.split(":") for line in (root / "etc/group").read_text().splitlines() if line.count(":") == 3]
    name, _, group = user.partition(":")
    entry = next((p for p in passwd if name in (p[0], p[2])), None)
    if entry is None and not name.isdigit():
        raise CheckFailed(f"run: USER {user}: no such user in the image's /etc/passwd")
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry else 0
    if group:
        found = next((g for g in groups if group in (g[0], g[2])), None)
        if found is None and not group.isdigit():
            raise CheckFailed(f"run: USER {user}: no such group in the image's /etc/group")
        gid = int(found[2]) if found else int(group)
    return uid, gid, entry[5] if entry else "/"


def option(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def init_pid(parent: int, deadline: float) -> int:
    """The host PID of ``unshare --fork``'s child: PID 1 of the new PID namespace."""
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise CheckFailed(f"run: no child of unshare (pid {parent}) within 10 s")


@contextmanager
def container(s: Step) -> Iterator[Path]:
    """A created (never started) container of ``IMAGE``, its root filesystem mounted; removed after."""
    # A run killed with SIGKILL leaves its container: the storage is the check's own, so any is a leftover.
    for stale in podman("ps", "-a", "--format", "{{.Names}}", step=s).split():
        podman_ok("umount", stale)
        podman_ok("rm", "-f", "-v", stale)
    podman("create", "--name", CONTAINER, "--pull", "never", "--network", "none", IMAGE, step=s)
    try:
        yield Path(podman("mount", CONTAINER, step=s))
    finally:
        podman_ok("umount", CONTAINER)
        podman_ok("rm", "-f", "-v", CONTAINER)


class Running:
    """The image's ENTRYPOINT + CMD running from its mounted root ``root`` under ``chroot``, in namespaces of
    its own (mount, UTS, network, PID), as the image's user, with its ENV, its WORKDIR and a fresh directory
    under ``scratch`` for each VOLUME; output to ``log_path``. A context manager: leaving it kills whatever is
    still running (SIGKILL to PID 1 of the namespace)."""

    def __init__(self, root: Path, config: ImageConfig, scratch: Path, log_path: Path) -> None:
        self.config, self.log_path = config, log_path
        self.uid, self.gid, home = resolve_user(root, config.user)
        env = dict(e.split("=", 1) for e in config.env)
        env.setdefault("HOSTNAME", HOSTNAME)
        env.setdefault("HOME", home)
        self.variables = [f"{k}={v}" for k, v in env.items()]
        # what an engine provides at run time (the base has no /etc/hosts); in the container's own layer
        (root / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{HOSTNAME}\n")
        setup = [
            "ip link set lo up",
            f"hostname {HOSTNAME}",
            f"mount --rbind /dev {shlex.quote(str(root / 'dev'))}",
            f"mount --rbind /sys {shlex.quote(str(root / 'sys'))}",
            f"mount -t proc proc {shlex.quote(str(root / 'proc'))}",  # this PID namespace's
        ]
        for i, volume in enumerate(config.volumes):
            source, target = scratch / f"volume-{i}", root / volume.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            source.mkdir()
            os.chown(source, target.stat().st_uid, target.stat().st_gid)  # as a new named volume
            setup.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
        command = ["chroot", f"--userspec={self.uid}:{self.gid}", f"--groups={self.gid}", str(root)]
        command += ["/usr/bin/env", "-i", f"--chdir={config.workdir}", *self.variables, *config.argv]
        self.script = "set -e\n" + "\n".join(setup) + "\nexec " + shlex.join(command) + "\n"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.started = 0.0

    def __enter__(self) -> Running:
        namespaces = ["--mount", "--uts", "--net", "--pid", "--fork", "--kill-child"]
        with self.log_path.open("w") as out:
            self.proc = subprocess.Popen(["unshare", *namespaces, "sh", "-c", self.script], stdout=out,
                                         stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        try:
            self.pid = init_pid(self.proc.pid, self.started + 10)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGKILL to PID 1 of the namespace: the kernel kills every other process in it, and unshare (which
        # --kill-child makes do the same if it dies first) exits; the namespaces' mounts go with their last
        # process, before the container's layers are unmounted and removed.
        for victim in (self.pid, self.proc.pid):
            if victim is not None:
                with suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
        try:
            self.proc.wait(timeout=KILL_S)
        except subprocess.TimeoutExpired:
            log(f"unshare (pid {self.proc.pid}) still there {KILL_S} s after SIGKILL")

    def failed(self, why: str) -> CheckFailed:
        return CheckFailed(f"run: {why}; {self.log_path}:\n{tail(self.log_path)}")

    def inside(self, argv: list[str], timeout: float = PROBE_S) -> subprocess.CompletedProcess[str]:
        """``argv`` in the server's namespaces and root, as its user, with its ENV (as ``docker exec``).

        Raises:
            subprocess.TimeoutExpired: past ``timeout`` seconds (the process is killed).
        """
        enter = ["nsenter", f"--target={self.pid}", "--mount", "--uts", "--net", "--pid", "--root", "--wd"]
        enter += [f"--setuid={self.uid}", f"--setgid={self.gid}", "--", "/usr/bin/env", "-i", *self.variables]
        return subprocess.run([*enter, *argv], capture_output=True, text=True, timeout=timeout)

    def wait_for(self, what: str, done: Callable[[], bool]) -> float:
        """Call ``done`` every 2 s until it says True; return the seconds since the start.

        Raises:
            CheckFailed: the command exited first, or ``READY_S`` seconds passed since its start.
        """
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise self.failed(f"the command exited with {self.proc.returncode} before {what}")
            if time.monotonic() - self.started > READY_S:
                raise self.failed(f"no {what} within {READY_S} s of the start")
            with suppress(subprocess.TimeoutExpired):
                if done():
                    return time.monotonic() - self.started
            time.sleep(2)

    def stop(self) -> float:
        """Send the image's STOPSIGNAL to PID 1; return the seconds until the exit.

        Raises:
            CheckFailed: no exit within ``STOP_S``, or an exit status other than 0.
        """
        assert self.proc is not None and self.pid is not None
        name = self.config.stop_signal
        os.kill(self.pid, int(name) if name.isdigit() else signal.Signals[name])
        stopping = time.monotonic()
        try:
            status = self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            raise self.failed(f"still running {STOP_S} s after {name}") from None
        if status != 0:
            raise self.failed(f"exit status {status} after {name} (0 expected)")
        return time.monotonic() - stopping


def serve_from_image() -> None:
    s = step("run")
    config = image_config(s)
    port = option(config.argv, "--metrics-port")
    if port is None:
        raise CheckFailed(f"run: the image's command has no --metrics-port, so no /readyz: {config.argv}")
    listen = option(config.argv, "--listen") or ""
    kafka_port = listen.split(",")[0].rsplit(":", 1)[-1]
    if not kafka_port.isdigit():
        raise CheckFailed(f"run: no port in the image's --listen {listen!r}")
    (CACHE / "run").mkdir(parents=True, exist_ok=True)
    with container(s) as root, tempfile.TemporaryDirectory(dir=CACHE / "run") as scratch:
        running = Running(root, config, Path(scratch), CACHE / "logs" / "server.log")
        log(f"running {shlex.join(config.argv)} as {running.uid}:{running.gid} in {config.workdir}, chroot {root}")
        with running:
            url = f"http://127.0.0.1:{port}/readyz"
            probe = ["python", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"]
            seconds = running.wait_for(f"200 from {url}", lambda: running.inside(probe).returncode == 0)
            log(f"{url} answered 200 after {seconds:.0f} s")
            if config.healthcheck:
                done = running.inside(config.healthcheck)
                if done.returncode != 0:
                    raise running.failed(f"the image's HEALTHCHECK {config.healthcheck} failed ({done.returncode}):"
                                         f" {done.stderr[-2000:]}")
                log("the image's HEALTHCHECK passes")
            # Serving, not only ready: records produced with the image's own Kafka client reach the table
            # through the image's Spark and JRE (/readyz is 200 while Spark still starts: ack-on wal).
            produced = running.inside(["python", "-c", PRODUCE.format(port=kafka_port, n=RECORDS)], PRODUCE_S)
            if produced.returncode != 0:
                raise running.failed(f"producing {RECORDS} records failed ({produced.returncode}): "
                                     f"{(produced.stdout + produced.stderr)[-2000:]}")
            log(f"{RECORDS} records produced to 127.0.0.1:{kafka_port} and acknowledged")
            metrics = ["python", "-c", FLUSHED.format(url=f"http://127.0.0.1:{port}/metrics")]
            flushed: list[float] = [0]

            def all_flushed() -> bool:
                done = running.inside(metrics)
                flushed[0] = float(done.stdout.strip() or 0) if done.returncode == 0 else flushed[0]
                return flushed[0] >= RECORDS

            seconds = running.wait_for(f"{RECORDS} records in the table", all_flushed)
            if flushed[0] != RECORDS:
                raise running.failed(f"{flushed[0]:.0f} records written to the table, {RECORDS} produced")
            log(f"{RECORDS} records written to the table by Spark after {seconds:.0f} s")
            seconds = running.stop()
            log(f"{config.stop_signal}: exit status 0 after {seconds:.0f} s")


# ------------------------------------------------------------------ main


@contextmanager
def cache_lock() -> Iterator[None]:
    """One check at a time on a cache (its storage and its container name)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "lock").open("w") as lock:
        deadline = time.monotonic() + LOCK_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CheckFailed(f"lock: another image check held {CACHE / 'lock'} for {LOCK_S} s") from None
                time.sleep(5)
        yield


def interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main() -> int:
    if os.geteuid() != 0:
        print("image check: needs root (debootstrap, podman's storage, chroot, namespaces)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    started = time.monotonic()
    try:
        install_tools()
        with cache_lock():
            base = build_base()
            build_image(base)
            serve_from_image()
    except CheckFailed as exc:
        print(f"image check FAILED: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"image check FAILED: interrupted by {exc}", file=sys.stderr)
        return 1
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"image check FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    log(f"passed in {time.monotonic() - started:.0f} s: deploy/Containerfile builds, and its command serves "
        "from the image's filesystem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
