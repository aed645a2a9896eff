"""End to end: SASL listeners with unmodified clients (issue 9).

One server with three listeners, ``PLAINTEXT``, ``SASL_PLAINTEXT`` and
``SASL_SSL`` (all on port 0; each port read from its "listening on HOST:PORT
(NAME, PROTOCOL)" log line), certificates made here by trustme, users made
with ``pipeline users add --password-stdin`` before the start. confluent-kafka
and kafka-python produce with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; a wrong
password, an unknown user and a garbage SASL token are failed and closed while
an authenticated producer carries on; a Metadata request before authentication
is closed; a user added while the server runs and one made through
AlterUserScramCredentials log in; after one restart on the same data dir the
users still log in; after the server stops, the table holds every record once.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import trustme
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from pipeline.security.users import DEFAULT_ITERATIONS
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess, free_port
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

N = 50
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORDS = {"alice": "pw-alice", "bob": "pw-bob", "carol": "pw-carol", "dave": "pw-dave"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
LISTENER_LINE = re.compile(r"listening on (\S+):(\d+) \((\w+), (\w+)\)")
SASL_AUTHENTICATION_FAILED, SASL_HANDSHAKE, SASL_AUTHENTICATE = 58, 17, 36
EXPECTED: Counter[str] = Counter()
"""Records acknowledged per topic, checked against the table at the end."""


class Sasl:
    """The running server, its SASL ports and the CA file; ``restart`` keeps the data dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        ca = trustme.CA()
        self.ca = tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        self.keystore = tmp / "server.pem"
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(self.keystore))
        self.server: ServerProcess | None = None
        self.ports: dict[str, int] = {}
        self.metrics_port = free_port()

    def authentications(self) -> dict[tuple[str, str], float]:
        """(outcome "successful"/"failed", listener) -> Kafka's successful-/failed-authentication-total."""
        from prometheus_client.parser import text_string_to_metric_families
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        prefix = "kafka_server_socket_server_metrics_"
        return {(family.name[len(prefix):].split("_")[0], sample.labels["listener"]): sample.value
                for family in text_string_to_metric_families(text)
                if family.name in (prefix + "successful_authentication", prefix + "failed_authentication")
                for sample in family.samples if sample.name.endswith("_total")}

    def start(self) -> None:
        self.server = ServerProcess(self.data_dir, "--listen", LISTENERS,
                                    "--ssl-keystore-location", str(self.keystore),
                                    "--table-commit-interval-ms", "1000",
                                    "--metrics-port", str(self.metrics_port)).start()
        self.ports = listener_ports(self.server)

    def stop(self) -> None:
        assert self.server is not None
        assert self.server.stop() == 0

    def confluent(self, protocol: str, mechanism: str, user: str, password: str | None = None) -> dict:
        config = {"bootstrap.servers": f"127.0.0.1:{self.ports[protocol]}", "security.protocol": protocol,
                  "sasl.mechanisms": mechanism, "sasl.username": user,
                  "sasl.password": PASSWORDS[user] if password is None else password}
        if protocol == "SASL_SSL":
            config["ssl.ca.location"] = str(self.ca)
        return config

    def kafka_python(self, protocol: str, mechanism: str, user: str) -> dict:
        config = {"bootstrap_servers": f"127.0.0.1:{self.ports[protocol]}", "security_protocol": protocol,
                  "sasl_mechanism": mechanism, "sasl_plain_username": user,
                  "sasl_plain_password": PASSWORDS[user]}
        if protocol == "SASL_SSL":
            config["ssl_cafile"] = str(self.ca)
        return config


def listener_ports(server: ServerProcess, timeout_s: float = 30.0) -> dict[str, int]:
    """Port of every listener by name (the first one from ``start``, the others from the log;
    the last run's lines win, the log is appended to across restarts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ports = {name: int(port) for _host, port, name, _protocol in LISTENER_LINE.findall(server.log_text())}
        if {"SASL_PLAINTEXT", "SASL_SSL"} <= ports.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {**ports, "PLAINTEXT": server.port}


def add_user(data_dir: Path, user: str, *mechanisms: str) -> None:
    """``pipeline users add USER --password-stdin`` (both SCRAM mechanisms unless named)."""
    flags = [arg for m in mechanisms for arg in ("--mechanism", m)]
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "users", "add", user, "--password-stdin",
                           "--data-dir", str(data_dir), *flags],
                          input=PASSWORDS[user] + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"added {user}"
    assert PASSWORDS[user] not in done.stdout + done.stderr


@pytest.fixture(scope="module")
def sasl(tmp_path_factory):
    sasl = Sasl(tmp_path_factory.mktemp("sasl"))
    add_user(sasl.data_dir, "alice")
    add_user(sasl.data_dir, "bob", "SCRAM-SHA-512")
    sasl.start()
    try:
        yield sasl
    finally:
        if sasl.server is not None and sasl.server.running:
            sasl.server.kill()


def produce_confluent(config: dict, topic: str, n: int = N) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer(config)
    errors = []
    for i in range(n):
        producer.produce(topic, key=str(i).encode(), value=f"{topic}-{i}".encode(),
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and not errors
    EXPECTED[topic] += n


def produce_kafka_python(config: dict, topic: str, n: int = N) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**config)
    try:
        futures = [producer.send(topic, key=str(i).encode(), value=f"{topic}-{i}".encode()) for i in range(n)]
        producer.flush(60)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close()
    assert offsets == list(range(EXPECTED[topic], EXPECTED[topic] + n))
    EXPECTED[topic] += n


def authentication_fails(config: dict) -> list:
    """Connect with ``config``; the client errors (librdkafka's), asserted to hold an authentication one."""
    import confluent_kafka
    import confluent_kafka.admin

    errors = []
    admin = confluent_kafka.admin.AdminClient({**config, "error_cb": errors.append})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors
    return errors


def raw_call(client: rc.RawClient, api_key: int, version: int, correlation_id: int, **fields):
    """Send one request built from kio's schema; its decoded response (header v0 for SaslHandshake v1,
    v1 for the flexible SaslAuthenticate v2)."""
    client.send(rc.frame(load_request_schema(api_key, version)(**fields), correlation_id))
    got, body = client.read_response()
    assert got == correlation_id
    return entity_reader(load_response_schema(api_key, version))(body, 1 if api_key == SASL_AUTHENTICATE else 0)[0]


def test_every_mechanism_produces_with_confluent_and_kafka_python(sasl):
    for protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        for mechanism in MECHANISMS:
            produce_confluent(sasl.confluent(protocol, mechanism, "alice"), f"sasl-c-{protocol}-{mechanism}".lower())
            produce_kafka_python(sasl.kafka_python(protocol, mechanism, "alice"),
                                 f"sasl-k-{protocol}-{mechanism}".lower())
    produce_confluent(sasl.confluent("SASL_SSL", "SCRAM-SHA-512", "bob"), "sasl-bob")
    log = sasl.server.log_text()
    for mechanism in MECHANISMS:
        assert f"authenticated as User:alice ({mechanism})" in log
    assert "authenticated as User:bob (SCRAM-SHA-512)" in log


def test_failed_authentications_are_closed_while_another_client_carries_on(sasl):
    import confluent_kafka

    alice = confluent_kafka.Producer(sasl.confluent("SASL_SSL", "SCRAM-SHA-256", "alice"))
    alice.produce("sasl-carry-on", value=b"before")
    assert alice.flush(30) == 0

    authentication_fails(sasl.confluent("SASL_PLAINTEXT", "PLAIN", "alice", "wrong-password"))
    authentication_fails(sasl.confluent("SASL_SSL", "SCRAM-SHA-256", "alice", "wrong-password"))
    authentication_fails(sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "bob", "wrong-password"))
    authentication_fails({**sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice"), "sasl.username": "mallory"})
    # bob has no SCRAM-SHA-256 credential: as unknown as mallory for that mechanism.
    authentication_fails(sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "bob"))
    alice.produce("sasl-carry-on", value=b"between")
    assert alice.flush(30) == 0

    for mechanism, junk in (("PLAIN", b"\x00garbage\xff"), ("SCRAM-SHA-256", b"\xff\xfe not a client-first")):
        raw = rc.RawClient("127.0.0.1", sasl.ports["SASL_PLAINTEXT"], timeout_s=20)
        try:
            handshake = raw_call(raw, SASL_HANDSHAKE, 1, 1, mechanism=mechanism)
            assert handshake.error_code == 0 and mechanism in handshake.mechanisms
            failed = raw_call(raw, SASL_AUTHENTICATE, 2, 2, auth_bytes=junk)
            assert failed.error_code == SASL_AUTHENTICATION_FAILED
            assert raw.closed_by_server()
        finally:
            raw.close()

    alice.produce("sasl-carry-on", value=b"after")
    assert alice.flush(30) == 0
    EXPECTED["sasl-carry-on"] += 3
    counts = sasl.authentications()  # Kafka socket-server-metrics, per listener
    assert counts[("failed", "SASL_PLAINTEXT")] >= 6 and counts[("failed", "SASL_SSL")] >= 1
    assert counts[("successful", "SASL_SSL")] >= 1 and counts[("failed", "PLAINTEXT")] == 0
    log = sasl.server.log_text()
    assert "failed authentication from 127.0.0.1" in log
    assert "principal tried User:mallory" in log
    assert "wrong-password" not in log and "pw-alice" not in log and "pw-bob" not in log


def test_a_request_before_authentication_is_closed(sasl):
    raw = rc.RawClient("127.0.0.1", sasl.ports["SASL_PLAINTEXT"], timeout_s=20)
    try:
        raw.send(rc.frame(rc.metadata("sasl-unauthenticated"), 1))
        assert raw.closed_by_server()
    finally:
        raw.close()
    raw = rc.RawClient("127.0.0.1", sasl.ports["SASL_SSL"], timeout_s=20)
    try:
        raw.send(rc.frame(rc.metadata("sasl-unauthenticated"), 1))  # no TLS at all
        assert raw.closed_by_server()
    finally:
        raw.close()
    # the PLAINTEXT listener needs no authentication
    produce_confluent({"bootstrap.servers": sasl.server.bootstrap}, "sasl-plaintext")
    assert "before SASL authentication completed" in sasl.server.log_text()


def test_a_user_added_while_the_server_runs_logs_in(sasl):
    authentication_fails(sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "carol"))
    add_user(sasl.data_dir, "carol")
    for mechanism in MECHANISMS:
        produce_confluent(sasl.confluent("SASL_SSL", mechanism, "carol"), "sasl-carol")


def test_admin_client_describes_and_alters_scram_credentials(sasl):
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion, UserScramCredentialUpsertion)

    admin = AdminClient(sasl.confluent("SASL_SSL", "SCRAM-SHA-256", "alice"))
    described = {user: future.result(30) for user, future in
                 admin.describe_user_scram_credentials(["alice", "bob"]).items()}
    assert {(i.mechanism, i.iterations) for i in described["alice"].scram_credential_infos} == {
        (ScramMechanism.SCRAM_SHA_256, DEFAULT_ITERATIONS), (ScramMechanism.SCRAM_SHA_512, DEFAULT_ITERATIONS)}
    assert [i.mechanism for i in described["bob"].scram_credential_infos] == [ScramMechanism.SCRAM_SHA_512]

    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                                     PASSWORDS["dave"].encode()),
        UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                     PASSWORDS["dave"].encode()),
        UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_512)])
    for future in futures.values():
        assert future.result(30) is None
    dave = admin.describe_user_scram_credentials(["dave"])["dave"].result(30)
    assert {(i.mechanism, i.iterations) for i in dave.scram_credential_infos} == {
        (ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 4096)}
    produce_confluent(sasl.confluent("SASL_SSL", "SCRAM-SHA-256", "dave"), "sasl-dave")
    produce_kafka_python(sasl.kafka_python("SASL_PLAINTEXT", "SCRAM-SHA-512", "dave"), "sasl-dave")
    authentication_fails(sasl.confluent("SASL_SSL", "SCRAM-SHA-512", "bob"))  # deleted
    assert "AlterUserScramCredentials for" in sasl.server.log_text()
    assert PASSWORDS["dave"] not in sasl.server.log_text()


def test_users_survive_a_restart(sasl):
    sasl.stop()
    sasl.start()
    produce_confluent(sasl.confluent("SASL_SSL", "PLAIN", "alice"), "sasl-restart")
    produce_kafka_python(sasl.kafka_python("SASL_SSL", "SCRAM-SHA-512", "carol"), "sasl-restart")
    produce_confluent(sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "dave"), "sasl-restart")
    authentication_fails(sasl.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "bob"))


def test_every_record_lands_in_the_table_once(sasl):
    sasl.stop()
    rows = read_table(sasl.data_dir, "SELECT topic, count(*) AS n, count(DISTINCT offset) AS d, "
                                     "min(offset) AS lo, max(offset) AS hi FROM records GROUP BY topic")
    by_topic = {r["topic"]: (r["n"], r["d"], r["lo"], r["hi"]) for r in rows}
    assert by_topic == {topic: (n, n, 0, n - 1) for topic, n in EXPECTED.items()}
