"""Process lifecycle: children that die with the server, signals before the event loop.

No process may outlive ``pipeline serve``, however it ends:

* SIGTERM/SIGINT while serving: the ordered shutdown (``Server.shutdown``),
  then Spark and the decode worker are stopped;
* SIGTERM/SIGINT during start-up (Spark starting, recovery), before trio's
  signal handling exists: :class:`StartupSignals` turns the signal into
  :class:`StartupInterrupted` in the main thread, so start-up unwinds at
  once (blocking calls are interrupted, PEP 475) and stops what was started;
  a JVM caught half-way through its launch (it only watches its stdin once
  its gateway is up, and pyspark deletes the directory it reports to) is
  terminated by :func:`stop_children`, the last step of every exit;
* SIGKILL or a crash: nothing of ours runs, so each child must notice by
  itself. The decode worker sets ``PR_SET_PDEATHSIG`` (Linux prctl(2)) in
  :func:`die_with_parent`; the multiprocessing resource tracker exits on EOF
  of its pipe, which happens once the server and the worker are gone; Spark's
  JVM (pyspark's ``PythonGatewayServer``) exits on EOF of its stdin, a pipe
  from the server, and takes its Python workers with it. It reads that pipe
  only once its gateway is up, so while it launches (seconds; over 15 s on a
  loaded 2-core machine) :func:`launch_reaper` watches in its place: a small
  process that kills the server's children if the server dies meanwhile.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import select
import signal
import subprocess
import sys
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import psutil

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent thread dies (linux/prctl.h)."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def set_parent_death_signal(signum: int = signal.SIGKILL) -> int:
    """Have Linux send ``signum`` to the calling process when the thread that started it ends.

    ``PR_SET_PDEATHSIG`` (prctl(2)), the one place it is set: in
    :func:`die_with_parent` and, as a ``preexec_fn`` (between fork and exec: the
    setting is kept across exec, cleared by fork), for the brokers a supervisor
    starts and for Spark's JVMs. prctl(2) ties the signal to the *thread* that
    forked the child, not to its process. Linux only: a caller that may run
    elsewhere checks the platform first.

    Args:
        signum: the signal to receive (default SIGKILL).

    Returns:
        0, or the errno prctl failed with.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return ctypes.get_errno()
    return 0


UNUSED_IMPORTS = ("hypothesis",)
"""Packages that a library imports whenever they are installed but that no process of the server
uses: kio (``kio.static._phantom``) imports hypothesis for its type strategies, 0.3-0.7 s of each
start where it is installed (a development environment; ~0.8 s on a loaded 2-core machine)."""


def skip_unused_imports() -> None:
    """Make ``import`` of each of ``UNUSED_IMPORTS`` raise ImportError in this process (the library
    then goes without it, as where it is not installed), unless it is imported already. Call it
    first in a process of the server (``pipeline.cli.main``, ``worker_init``), before anything
    imports kio; never in one that may use them (the test suite: there they are imported already)."""
    for name in UNUSED_IMPORTS:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # Python's "import blocked" marker


def worker_init(parent_pid: int, niceness: int) -> None:
    """A worker process's start (``ProcessPoolExecutor(initializer=...)``, the decode worker):
    ``skip_unused_imports``, die with the server (``die_with_parent``), then lower its priority
    by ``niceness`` (``os.nice``; 0: unchanged). It lives here, apart from the worker's jobs, so
    that unpickling it imports nothing heavy before ``skip_unused_imports`` runs."""
    skip_unused_imports()
    die_with_parent(parent_pid)
    if niceness:
        os.nice(niceness)


def die_with_parent(parent_pid: int) -> None:
    """Make the calling (child) process get SIGKILL when its parent dies.

    For ``ProcessPoolExecutor(initializer=die_with_parent,
    initargs=(os.getpid(),))``. On Linux it sets ``PR_SET_PDEATHSIG``, then
    exits at once if the parent is already gone (it died before the prctl:
    the child was reparented and ``getppid()`` no longer matches). Elsewhere
    only that check is made.

    prctl(2) ties the signal to the *thread* that forked the child: start
    the pool's workers from the main thread (``SparkGroupSink.start`` does,
    with its first submit), never from a short-lived worker thread.

    Args:
        parent_pid: the pid of the process that started this one.
    """
    if sys.platform.startswith("linux"):
        errno = set_parent_death_signal(signal.SIGKILL)
        if errno:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: %s", os.strerror(errno))
    if os.getppid() != parent_pid:
        os._exit(1)


STOP_CHILDREN_TIMEOUT_S = 10.0
"""How long children get between SIGTERM and SIGKILL in :func:`stop_children` (s)."""


def stop_children(timeout_s: float = STOP_CHILDREN_TIMEOUT_S) -> list[str]:
    """Terminate every process this one started that is still running.

    SIGTERM to all descendants, then SIGKILL to those alive after
    ``timeout_s``. After an ordered stop only Spark's gateway JVM is left
    (``SparkSession.stop`` stops the SparkContext, not the JVM, which pyspark
    leaves to the EOF of its stdin when this process exits); otherwise this
    is the net under interrupted start-ups and stops that ran out of time.

    The multiprocessing resource tracker is left alone: it ignores SIGTERM
    and SIGINT by design (``multiprocessing/resource_tracker.py``), so
    terminating it would cost the whole ``timeout_s`` and then a SIGKILL
    that skips its clean-up; it exits by itself on EOF of its pipe once this
    process and the decode worker are gone (measured: a SIGTERM shutdown
    took 10 s longer with it included).

    Returns:
        A description (pid and command) of each process that had to be stopped.
    """
    import psutil

    try:
        children = [child for child in psutil.Process().children(recursive=True)
                    if not _is_resource_tracker(child)]
    except psutil.Error:
        return []
    stopped = []
    for child in children:
        try:
            stopped.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
            child.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(children, timeout=timeout_s)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout_s)
    return stopped


def _is_resource_tracker(process: psutil.Process) -> bool:
    """Whether ``process`` (psutil) is a multiprocessing resource tracker
    (``python -c 'from multiprocessing.resource_tracker import main;main(FD)'``)."""
    import psutil

    try:
        return any("multiprocessing.resource_tracker" in arg for arg in process.cmdline())
    except psutil.Error:
        return False


REAPER_POLL_S = 0.2
"""How often the launch reaper lists the server's children (s): a child started less than this
before the server died may be missed."""
_RELEASE = b"release\n"


@contextmanager
def launch_reaper() -> Iterator[None]:
    """While the block runs, a reaper process kills this process's children if this process dies.

    For the launch of Spark's JVM: until its gateway is up the JVM reads nothing of ours, so a
    ``kill -9`` of the server then would leave it running until the end of its launch (see the
    module docstring). The reaper (``python -m pipeline.process.lifecycle PID``) lists this process's
    descendants every ``REAPER_POLL_S``; when its stdin, a pipe from this process, ends without
    a release (this process died, however), it SIGKILLs those it saw last, each checked by its
    start time so that a reused pid is left alone. Leaving the block releases it: it exits and
    kills nothing. It ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the
    server stops its children itself) and exits on SIGTERM (``stop_children``) without killing.

    Raises:
        OSError: the reaper could not be started.
    """
    reaper = subprocess.Popen([sys.executable, "-m", "pipeline.process.lifecycle", str(os.getpid())],
                              stdin=subprocess.PIPE, close_fds=True)
    try:
        yield
    finally:
        try:
            assert reaper.stdin is not None
            reaper.stdin.write(_RELEASE)
            reaper.stdin.close()
        except OSError:
            pass
        try:
            reaper.wait(5)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()


def _reap(server_pid: int) -> int:
    """The launch reaper's loop (see ``launch_reaper``); returns its exit status (0)."""
    import psutil

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = os.getpid()
    try:
        server = psutil.Process(server_pid)
    except psutil.Error:
        return 0
    known: dict[int, float] = {}
    received = b""
    while True:
        readable, _, _ = select.select([0], [], [], REAPER_POLL_S)
        if readable:
            data = os.read(0, 64)
            if not data:
                break  # EOF without a release: the server is gone
            received += data
            if _RELEASE in received:
                return 0
        try:
            children = server.children(recursive=True)
        except psutil.Error:
            break  # the server is gone
        listed: dict[int, float] = {}
        for child in children:
            try:
                if child.pid != me:
                    listed[child.pid] = child.create_time()
            except psutil.Error:
                pass  # a short-lived child (the launcher's `java -version`) ended meanwhile: not a reason to reap
        if os.getppid() != server_pid:
            break  # the server died while we listed: its children had moved already; keep the last list
        known = listed
    for pid, created in known.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created:
                process.kill()
        except psutil.Error:
            pass
    return 0


class StartupInterrupted(BaseException):
    """SIGINT/SIGTERM arrived during start-up; ``signum`` says which.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    in the libraries being started swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name} during start-up")
        self.signum = signum


_SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
"""What ``signal.signal`` takes and returns."""


class StartupSignals:
    """Signal handling of the main thread before trio's exists.

    ``install()``: a stop signal raises :class:`StartupInterrupted` where the
    main thread is (starting Spark, recovering). ``defer()``: just before the
    event loop starts, a stop signal is only remembered in ``pending``, so
    it cannot land inside trio's set-up; the loop looks at ``pending`` once
    its own signal receiver is open and shuts down if one came.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self._previous: dict[int, _SignalHandler] = {}

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._raise)

    def defer(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._remember)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _raise(self, signum: int, _frame: FrameType | None) -> None:
        # Only the first signal interrupts; a second during the unwinding
        # (stopping Spark) must not interrupt that too.
        self.defer()
        self.pending = signum
        raise StartupInterrupted(signum)

    def _remember(self, signum: int, _frame: FrameType | None) -> None:
        self.pending = signum


SERVING_GC_THRESHOLD = 10_000
"""Allocations (net of frees) between two young-generation collections while serving;
CPython's default is 700."""


def tune_gc_for_serving() -> None:
    """Once started: move what start-up allocated out of the collector's reach, collect less often.

    A serving process holds ~10^6 long-lived objects (Spark's gateway,
    pyarrow, kio's schema classes) that every full collection traverses
    (~90 ms each on the development VM), and the request path allocates a few
    dozen objects per request, so with CPython's defaults a produce load at
    acks=0 spent ~6 % of the event loop's CPU in the cyclic collector (issue 13,
    gc callbacks). ``gc.freeze()`` after a collection puts the start-up heap
    in the permanent generation (the technique CPython documents for
    pre-fork servers); a higher young-generation threshold makes the
    collections rarer. Requests' objects are freed by reference counting:
    the collector only finds cycles, so this changes when cyclic garbage is
    reclaimed, not whether.
    """
    gc.collect()
    gc.freeze()
    threshold0, threshold1, threshold2 = gc.get_threshold()
    gc.set_threshold(max(threshold0, SERVING_GC_THRESHOLD), threshold1, threshold2)


if __name__ == "__main__":  # the launch reaper: python -m pipeline.process.lifecycle SERVER_PID
    sys.exit(_reap(int(sys.argv[1])))
