"""The matrix's kcat driver: runs ``kcat`` (Debian's, librdkafka 2.0.2) for each capability.

kcat has no admin requests (no CreateTopics): its create-topic cell is that limitation. Its
transactional producer (``-X transactional.id=``) commits everything it read at exit and cannot
abort, so its transaction cell is a commit with a ``read_committed`` read-back only.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from driver_common import Limitation, load, run, values_for

cfg = load()
T = cfg["timeout_s"]


def kcat(*args: str, stdin: str | None = None, scram: bool = False, timeout: float = T) -> str:
    """``kcat ARGS`` against the PLAINTEXT listener, or SASL_SSL with SCRAM (password in a -F file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
        if scram:
            conf.write(f"security.protocol=SASL_SSL\nsasl.mechanisms={cfg['mechanism']}\n"
                       f"sasl.username={cfg['user']}\nsasl.password={cfg['password']}\n"
                       f"ssl.ca.location={cfg['ca']}\n")
        conf.flush()
        os.chmod(conf.name, 0o600)
        bootstrap = cfg["sasl_ssl"] if scram else cfg["plaintext"]
        try:
            done = subprocess.run(["kcat", "-F", conf.name, "-b", bootstrap, *args], input=stdin,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            said = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            raise TimeoutError(f"kcat not done within {timeout} s: {' | '.join(said.splitlines()[-3:])}"[:300]) \
                from None
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "fail" in line.lower()]
    if done.returncode != 0 or errors:
        raise RuntimeError(f"kcat exited with {done.returncode}: {' | '.join(errors or done.stderr.splitlines())}"[:300])
    return done.stdout


def produce(topic: str, values: list[str], *extra: str, scram: bool = False, timeout: float = T) -> None:
    kcat("-P", "-t", topic, "-p", "0", "-X", "acks=all", *extra, stdin="\n".join(values) + "\n", scram=scram,
         timeout=timeout)


def read_back(topic: str, n: int, *extra: str, scram: bool = False) -> list[str]:
    """Partition 0 from the beginning to its end (``-e``)."""
    return kcat("-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%s\n", *extra,
                scram=scram).splitlines()


def do_produce():
    produce(cfg["topics"]["produce"], values_for(cfg, "produce"), "-X", "enable.idempotence=false")


def do_idempotent():
    produce(cfg["topics"]["idempotent"], values_for(cfg, "idempotent"), "-X", "enable.idempotence=true")


def do_group_consume():
    # a balanced consumer (-G) that exits after n records; offsets are committed as it closes
    out = kcat("-G", cfg["group"], cfg["topics"]["group-consume"], "-c", str(cfg["n"]), "-f", "%s\n",
               "-X", "auto.offset.reset=earliest")
    return out.splitlines()


def do_scram_tls():
    topic = cfg["topics"]["scram-tls"]
    produce(topic, values_for(cfg, "scram-tls"), scram=True)
    return read_back(topic, cfg["n"], scram=True)


def do_create_topic():
    raise Limitation("kcat sends no admin requests (no CreateTopics)")


def do_transactions():
    topic = cfg["topics"]["transactions"]
    produce(topic, values_for(cfg, "transactions-commit", 3), "-X", f"transactional.id={cfg['transactional_id']}",
            "-X", "transaction.timeout.ms=10000", timeout=cfg["txn_timeout_s"])
    return read_back(topic, 3, "-X", "isolation.level=read_committed")


# "Version 1.7.1 (JSON, Transactions, IncrementalAssign, librdkafka 2.0.2 builtin.features=...)"
said = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=30).stdout
found = re.search(r"Version (\S+) .*librdkafka (\S+)", said)
VERSION = f"{found.group(1)} (librdkafka {found.group(2)})" if found else said.strip()[:100]
run({"produce": do_produce, "idempotent": do_idempotent, "group-consume": do_group_consume,
     "scram-tls": do_scram_tls, "create-topic": do_create_topic, "transactions": do_transactions}, VERSION)
