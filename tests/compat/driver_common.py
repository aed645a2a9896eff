"""What every Python driver shares (imported by path: the drivers run in the clients' own venvs).

A driver is ``PYTHON driver_FAMILY.py INPUT.json``: the input names the listeners, the SCRAM
user, the topics, the group and ``n``; the driver attempts each capability in turn and prints one
JSON line per capability, ``{"capability", "ok", "detail", "values"}``. ``values`` are what the
client itself read back (none for a capability without a read-back); the test checks them and
the topics with its own reader. A capability the client does not have is reported with
``ok: false`` and ``"limitation: ..."`` as its detail, never skipped.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback

CAPABILITIES = ("produce", "idempotent", "group-consume", "scram-tls", "create-topic", "transactions")


def load() -> dict:
    with open(sys.argv[1]) as f:
        return json.load(f)


def emit(capability: str, ok: bool, detail: str = "", values: list | None = None, **extra) -> None:
    print(json.dumps({"capability": capability, "ok": ok, "detail": detail, "values": values, **extra}),
          flush=True)


def values_for(cfg: dict, capability: str, n: int | None = None) -> list[str]:
    """The values a driver produces for ``capability`` (the test computes the same)."""
    return [f"{cfg['client']}-{capability}-{i}" for i in range(cfg["n"] if n is None else n)]


class Limitation(Exception):
    """The client has no such capability (reported as ``limitation: REASON``)."""


class _LastWarning(logging.Handler):
    """The last warning or error a Python client logged (its account of what the broker said)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.message = record.getMessage()[:200]
        except Exception:  # a client's malformed log call must not end the driver
            pass


LAST_WARNING = _LastWarning()
logging.getLogger().addHandler(LAST_WARNING)
logging.getLogger().setLevel(logging.WARNING)


def attempt(capability: str, fn) -> None:
    """Run ``fn() -> values | None``; emit its outcome, the exception's text if it raised (with the
    last warning the client logged meanwhile)."""
    started = time.monotonic()
    LAST_WARNING.message = ""
    try:
        values = fn()
    except Limitation as exc:
        emit(capability, False, f"limitation: {exc}")
    except BaseException as exc:  # noqa: B036 - the reason is the cell's text; a driver never stops early
        said = str(exc) or ("not done within the driver's timeout" if isinstance(exc, TimeoutError) else "")
        text = said if said.startswith(type(exc).__name__) else f"{type(exc).__name__}: {said}"
        if LAST_WARNING.message and LAST_WARNING.message not in text:
            text += f" (client log: {LAST_WARNING.message})"
        emit(capability, False, text[:300], trace=traceback.format_exc()[-2000:])
    else:
        emit(capability, True, f"{time.monotonic() - started:.1f} s", values)


def run(capabilities: dict, version: str) -> None:
    """Emit the client's own account of its ``version``, then attempt the capabilities the input
    asks for, in ``CAPABILITIES`` order."""
    emit("version", True, version)
    cfg_caps = load()["capabilities"]
    for capability in CAPABILITIES:
        if capability in cfg_caps:
            attempt(capability, capabilities[capability])
