"""End to end: TLS, SASL and ACLs with unmodified clients, on one shared server (issues 9, 21, 22).

One ``pipeline serve`` for the whole module, with four listeners (all on port
0; each port read from the "listening on HOST:PORT (NAME, PROTOCOL)" lines
this start wrote): ``PLAINTEXT``, ``SSL`` with ``ssl.client.auth=required``
(mTLS, set for that listener only with Kafka's ``listener.name.ssl.`` prefix),
``SASL_PLAINTEXT`` and ``SASL_SSL``; ``authorizer.class.name=pipeline`` with
``super.users`` naming every principal of the TLS and SASL tests (their mTLS
subjects, their SASL users and ``User:ANONYMOUS`` of the PLAINTEXT listener)
and the ACL tests' ``admin``; the ACL tests' ``erin`` is the one principal the
ACLs decide for. Certificates are made here by trustme; users with
``pipeline users add --password-stdin`` before the start. Each test has its
own topics and principals:

* TLS (``tls-*``): confluent-kafka and kafka-python, each with its own client
  certificate, produce over SSL and consume the records back; Metadata
  advertises the listener each client came through; a client without a
  certificate and a plaintext client on the TLS port are closed while the
  others carry on.
* SASL (``sasl-*``): confluent-kafka and kafka-python produce with PLAIN,
  SCRAM-SHA-256 and SCRAM-SHA-512; a wrong password, an unknown user and a
  garbage SASL token are failed and closed while an authenticated producer
  carries on; a request before authentication is closed; a user added while
  the server runs and one made through AlterUserScramCredentials log in.
* ACLs (``allowed``, ``denied``, group ``g``): the admin creates the topics and
  ACLs with confluent-kafka's AdminClient; erin produces to the topic she may
  Write (acknowledged) and to one she may not (TOPIC_AUTHORIZATION_FAILED),
  consumes hers in group ``g``; kafka-python's KafkaAdminClient describes them.
* SaslHandshake v0 (``kcat-*``, issue 22): Debian 12's kcat (librdkafka 2.0.2,
  which needs SaslHandshake v0 listed and sends its SCRAM nonce twice) produces
  and consumes over SASL_SSL with SCRAM-SHA-512; kafka-python limited to Kafka
  0.10.1's apis logs in with raw SASL tokens after a SaslHandshake v0.

Then ONE restart on the same data dir (users and ACLs both must survive it:
users log in, deleted ones do not, the ACLs are listed and enforced), and
after the server stops the table holds every acknowledged record exactly
once and nothing of the denied topic.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import trustme
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from pipeline.security.tls import principal_of
from pipeline.security.users import DEFAULT_ITERATIONS
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess, free_port
from tests.e2e.table_reader import read_table
from tests.missing import need_command

pytestmark = pytest.mark.slow

N_TLS, N_SASL, N_ACL, N_KCAT = 200, 50, 20, 30
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORDS = {"alice": "pw-alice", "bob": "pw-bob", "carol": "pw-carol", "dave": "pw-dave",
             "admin": "pw-admin", "erin": "pw-erin", "kc": "pw-kc"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
LISTENER_LINE = re.compile(r"listening on (\S+):(\d+) \((\w+), (\w+)\)")
SASL_AUTHENTICATION_FAILED, SASL_HANDSHAKE, SASL_AUTHENTICATE = 58, 17, 36
TLS_TOPICS = {"confluent": "tls-confluent", "kafka-python": "tls-kafka-python"}
EXPECTED: Counter[str] = Counter()
"""Records acknowledged per topic (every test's), checked against the table at the end."""


def add_user(data_dir: Path, user: str, *mechanisms: str) -> None:
    """``pipeline users add USER --password-stdin`` (both SCRAM mechanisms unless named)."""
    flags = [arg for m in mechanisms for arg in ("--mechanism", m)]
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "users", "add", user, "--password-stdin",
                           "--data-dir", str(data_dir), *flags],
                          input=PASSWORDS[user] + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"added {user}"
    assert PASSWORDS[user] not in done.stdout + done.stderr


class Security:
    """The running server, its listener ports and the certificate files; ``restart`` keeps the data dir."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        ca = trustme.CA()
        self.ca = tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca))
        self.keystore = tmp / "server.pem"
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(self.keystore))
        self.certs: dict[str, tuple[Path, Path]] = {}
        self.tls_principals: list[str] = []
        for user in ("alice", "bob"):
            leaf = ca.issue_cert(f"{user}@example.test", common_name=user, organization_unit_name="eng")
            leaf.cert_chain_pems[0].write_to_path(str(tmp / f"{user}.crt"))
            leaf.private_key_pem.write_to_path(str(tmp / f"{user}.key"))
            self.certs[user] = (tmp / f"{user}.crt", tmp / f"{user}.key")
            self.tls_principals.append(principal_of(ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())))
        super_users = ";".join(["User:ANONYMOUS", *self.tls_principals,
                                *(f"User:{u}" for u in ("alice", "bob", "carol", "dave", "kc", "admin"))])
        self.config = tmp / "security.toml"
        # mTLS on the SSL listener only (Kafka's listener.name prefix, file only): SASL_SSL clients
        # present no certificate.
        self.config.write_text(f'listener.name.ssl.ssl.truststore.location = "{self.ca}"\n'
                               'listener.name.ssl.ssl.client.auth = "required"\n')
        self.args = ["--config", str(self.config), "--listen", LISTENERS,
                     "--ssl-keystore-location", str(self.keystore),
                     "--authorizer-class-name", "pipeline", "--super-users", super_users,
                     "--table-commit-interval-ms", "1000"]
        self.server: ServerProcess | None = None
        self.ports: dict[str, int] = {}
        self.metrics_port = free_port()

    def start(self) -> None:
        server = ServerProcess(self.data_dir, *self.args, "--metrics-port", str(self.metrics_port))
        # The log is appended to across restarts: only what this start wrote names its ports.
        before = server.log_path.stat().st_size if server.log_path.exists() else 0
        self.server = server.start()
        deadline = time.monotonic() + 60
        while True:
            text = server.log_path.read_bytes()[before:].decode(errors="replace")
            ports = {name: int(port) for _host, port, name, _protocol in LISTENER_LINE.findall(text)}
            if {"SSL", "SASL_PLAINTEXT", "SASL_SSL"} <= ports.keys() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ports = {**ports, "PLAINTEXT": server.port}

    def stop(self) -> None:
        assert self.server is not None
        assert self.server.stop() == 0

    def log(self) -> str:
        """The whole server log, both starts (``ServerProcess.log_text`` keeps only its tail, and this
        server's log is long)."""
        assert self.server is not None
        return self.server.log_path.read_text(errors="replace")

    def authentications(self) -> dict[tuple[str, str], float]:
        """(outcome "successful"/"failed", listener) -> Kafka's successful-/failed-authentication-total."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        prefix = "kafka_server_socket_server_metrics_"
        return {(family.name[len(prefix):].split("_")[0], sample.labels["listener"]): sample.value
                for family in text_string_to_metric_families(text)
                if family.name in (prefix + "successful_authentication", prefix + "failed_authentication")
                for sample in family.samples if sample.name.endswith("_total")}

    # -- client configurations ---------------------------------------------------

    def confluent_ssl(self, user: str | None) -> dict:
        config = {"bootstrap.servers": f"127.0.0.1:{self.ports['SSL']}", "security.protocol": "SSL",
                  "ssl.ca.location": str(self.ca)}
        if user is not None:
            config.update({"ssl.certificate.location": str(self.certs[user][0]),
                           "ssl.key.location": str(self.certs[user][1])})
        return config

    def kafka_python_ssl(self) -> dict:
        return {"bootstrap_servers": f"127.0.0.1:{self.ports['SSL']}", "security_protocol": "SSL",
                "ssl_cafile": str(self.ca), "ssl_certfile": str(self.certs["bob"][0]),
                "ssl_keyfile": str(self.certs["bob"][1])}

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


@pytest.fixture(scope="module")
def security(tmp_path_factory):
    """The module's one server (a second start only in ``test_users_and_acls_survive_a_restart``)."""
    security = Security(tmp_path_factory.mktemp("security"))
    add_user(security.data_dir, "alice")
    add_user(security.data_dir, "bob", "SCRAM-SHA-512")
    for user in ("admin", "erin", "kc"):
        add_user(security.data_dir, user)
    security.start()
    try:
        yield security
    finally:
        if security.server is not None and security.server.running:
            security.server.kill()


# -- helpers -----------------------------------------------------------------------


def produce_confluent(config: dict, topic: str, n: int = N_SASL) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer(config)
    errors = []
    for i in range(n):
        producer.produce(topic, key=str(i).encode(), value=f"{topic}-{i}".encode(),
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and not errors
    EXPECTED[topic] += n


def produce_kafka_python(config: dict, topic: str, n: int = N_SASL) -> None:
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


# -- TLS (was tests/e2e/test_tls.py) -----------------------------------------------------


def test_tls_confluent_and_kafka_python_produce_and_consume_over_mtls(security):
    import confluent_kafka
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    producer = confluent_kafka.Producer(security.confluent_ssl("alice"))
    errors = []
    for i in range(N_TLS):
        producer.produce(TLS_TOPICS["confluent"], key=str(i).encode(), value=f"c{i}".encode(),
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and not errors
    EXPECTED[TLS_TOPICS["confluent"]] += N_TLS
    kp_producer = KafkaProducer(**security.kafka_python_ssl())
    futures = [kp_producer.send(TLS_TOPICS["kafka-python"], key=str(i).encode(), value=f"k{i}".encode())
               for i in range(N_TLS)]
    kp_producer.flush(60)
    assert [f.get(timeout=30).offset for f in futures] == list(range(N_TLS))
    kp_producer.close()
    EXPECTED[TLS_TOPICS["kafka-python"]] += N_TLS

    consumer = confluent_kafka.Consumer({**security.confluent_ssl("alice"), "group.id": "tls-c",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(TLS_TOPICS["kafka-python"], 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < N_TLS and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    assert values == [f"k{i}".encode() for i in range(N_TLS)]

    kp = KafkaConsumer(**security.kafka_python_ssl(), auto_offset_reset="earliest", enable_auto_commit=False,
                       consumer_timeout_ms=20_000)
    kp.assign([TopicPartition(TLS_TOPICS["confluent"], 0)])
    kp.seek_to_beginning()
    got = []
    for record in kp:
        got.append(record.value)
        if len(got) == N_TLS:
            break
    kp.close()
    assert got == [f"c{i}".encode() for i in range(N_TLS)]
    log = security.log()
    assert "TLS client User:CN=alice,OU=eng" in log and "TLS client User:CN=bob,OU=eng" in log


def test_tls_metadata_advertises_the_listener_the_client_came_through(security):
    import confluent_kafka.admin

    plain = confluent_kafka.admin.AdminClient({"bootstrap.servers": security.server.bootstrap}).list_topics(timeout=20)
    secure = confluent_kafka.admin.AdminClient(security.confluent_ssl("alice")).list_topics(timeout=20)
    scram = confluent_kafka.admin.AdminClient(security.confluent("SASL_SSL", "SCRAM-SHA-512", "alice")).list_topics(
        timeout=20)
    assert [(b.host, b.port) for b in plain.brokers.values()] == [("127.0.0.1", security.ports["PLAINTEXT"])]
    assert [(b.host, b.port) for b in secure.brokers.values()] == [("127.0.0.1", security.ports["SSL"])]
    assert [(b.host, b.port) for b in scram.brokers.values()] == [("127.0.0.1", security.ports["SASL_SSL"])]


def test_tls_a_client_without_certificate_and_a_plaintext_client_are_closed_others_carry_on(security):
    import confluent_kafka
    import confluent_kafka.admin

    ssl_port = security.ports["SSL"]
    alice = confluent_kafka.Producer(security.confluent_ssl("alice"))
    alice.produce(TLS_TOPICS["confluent"], value=b"before")
    assert alice.flush(30) == 0

    anonymous = confluent_kafka.admin.AdminClient(security.confluent_ssl(None))
    with pytest.raises(confluent_kafka.KafkaException):
        anonymous.list_topics(timeout=5)

    with socket.create_connection(("127.0.0.1", ssl_port), timeout=10) as plain:
        plain.sendall(rc.frame(rc.api_versions(), 1))
        try:
            assert plain.recv(4096) == b""  # closed, no Kafka response
        except ConnectionResetError:
            pass

    alice.produce(TLS_TOPICS["confluent"], value=b"after")
    assert alice.flush(30) == 0
    EXPECTED[TLS_TOPICS["confluent"]] += 2  # "before" and "after"
    log = security.log()
    assert "on listener SSL: TLS handshake failed" in log
    assert "plaintext client on a TLS listener?" in log
    assert "PRIVATE KEY" not in log


# -- SASL (was tests/e2e/test_sasl.py) -------------------------------------------------------


def test_sasl_every_mechanism_produces_with_confluent_and_kafka_python(security):
    for protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        for mechanism in MECHANISMS:
            produce_confluent(security.confluent(protocol, mechanism, "alice"),
                              f"sasl-c-{protocol}-{mechanism}".lower())
            produce_kafka_python(security.kafka_python(protocol, mechanism, "alice"),
                                 f"sasl-k-{protocol}-{mechanism}".lower())
    produce_confluent(security.confluent("SASL_SSL", "SCRAM-SHA-512", "bob"), "sasl-bob")
    log = security.log()
    for mechanism in MECHANISMS:
        assert f"authenticated as User:alice ({mechanism})" in log
    assert "authenticated as User:bob (SCRAM-SHA-512)" in log


def test_sasl_failed_authentications_are_closed_while_another_client_carries_on(security):
    import confluent_kafka

    alice = confluent_kafka.Producer(security.confluent("SASL_SSL", "SCRAM-SHA-256", "alice"))
    alice.produce("sasl-carry-on", value=b"before")
    assert alice.flush(30) == 0

    authentication_fails(security.confluent("SASL_PLAINTEXT", "PLAIN", "alice", "wrong-password"))
    authentication_fails(security.confluent("SASL_SSL", "SCRAM-SHA-256", "alice", "wrong-password"))
    authentication_fails(security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "bob", "wrong-password"))
    authentication_fails({**security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "alice"),
                          "sasl.username": "mallory"})
    # bob has no SCRAM-SHA-256 credential: as unknown as mallory for that mechanism.
    authentication_fails(security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "bob"))
    alice.produce("sasl-carry-on", value=b"between")
    assert alice.flush(30) == 0

    for mechanism, junk in (("PLAIN", b"\x00garbage\xff"), ("SCRAM-SHA-256", b"\xff\xfe not a client-first")):
        raw = rc.RawClient("127.0.0.1", security.ports["SASL_PLAINTEXT"], timeout_s=20)
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
    counts = security.authentications()  # Kafka socket-server-metrics, per listener
    assert counts[("failed", "SASL_PLAINTEXT")] >= 6 and counts[("failed", "SASL_SSL")] >= 1
    assert counts[("successful", "SASL_SSL")] >= 1 and counts[("failed", "PLAINTEXT")] == 0
    log = security.log()
    assert "failed authentication from 127.0.0.1" in log
    assert "principal tried User:mallory" in log
    assert "wrong-password" not in log and "pw-alice" not in log and "pw-bob" not in log


def test_sasl_a_request_before_authentication_is_closed(security):
    raw = rc.RawClient("127.0.0.1", security.ports["SASL_PLAINTEXT"], timeout_s=20)
    try:
        raw.send(rc.frame(rc.metadata("sasl-unauthenticated"), 1))
        assert raw.closed_by_server()
    finally:
        raw.close()
    raw = rc.RawClient("127.0.0.1", security.ports["SASL_SSL"], timeout_s=20)
    try:
        raw.send(rc.frame(rc.metadata("sasl-unauthenticated"), 1))  # no TLS at all
        assert raw.closed_by_server()
    finally:
        raw.close()
    # the PLAINTEXT listener needs no authentication
    produce_confluent({"bootstrap.servers": security.server.bootstrap}, "sasl-plaintext")
    assert "before SASL authentication completed" in security.log()


def test_sasl_a_user_added_while_the_server_runs_logs_in(security):
    authentication_fails(security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "carol"))
    add_user(security.data_dir, "carol")
    for mechanism in MECHANISMS:
        produce_confluent(security.confluent("SASL_SSL", mechanism, "carol"), "sasl-carol")


def test_sasl_admin_client_describes_and_alters_scram_credentials(security):
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion, UserScramCredentialUpsertion)

    admin = AdminClient(security.confluent("SASL_SSL", "SCRAM-SHA-256", "alice"))
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
    produce_confluent(security.confluent("SASL_SSL", "SCRAM-SHA-256", "dave"), "sasl-dave")
    produce_kafka_python(security.kafka_python("SASL_PLAINTEXT", "SCRAM-SHA-512", "dave"), "sasl-dave")
    authentication_fails(security.confluent("SASL_SSL", "SCRAM-SHA-512", "bob"))  # deleted
    assert "AlterUserScramCredentials for" in security.log()
    assert PASSWORDS["dave"] not in security.log()


# -- ACLs (was tests/e2e/test_acls.py) -------------------------------------------------------


def erin_bindings():
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    def binding(rtype, name, operation):
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:erin", "*", operation,
                          AclPermissionType.ALLOW)

    # Write+Describe to produce, Read to consume (Kafka: Fetch and OffsetCommit need TOPIC Read).
    return [binding(ResourceType.TOPIC, "allowed", AclOperation.WRITE),
            binding(ResourceType.TOPIC, "allowed", AclOperation.DESCRIBE),
            binding(ResourceType.TOPIC, "allowed", AclOperation.READ),
            binding(ResourceType.GROUP, "g", AclOperation.READ)]


def expected_bindings() -> set[tuple]:
    return {(b.restype, b.name, b.principal, b.operation) for b in erin_bindings()}


def described(config: dict) -> set[tuple]:
    """Every ACL binding on the server (no filter: nothing but erin's may be there)."""
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    admin = AdminClient(config)  # kept referenced until the answer: a collected client fails its futures
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(timeout=30)
    return {(b.restype, b.name, b.principal, b.operation) for b in found}


def produce_acl(config: dict, topic: str, n: int = N_ACL) -> list:
    """Produce n records; the delivery errors (None for each acknowledged record)."""
    import confluent_kafka

    producer = confluent_kafka.Producer({**config, "message.timeout.ms": 20_000})
    results: list = []
    for i in range(n):
        producer.produce(topic, value=f"{topic}-{i}".encode(), on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(60) == 0
    EXPECTED[topic] += sum(1 for error in results if error is None)  # KafkaError == None raises
    return results


def consume_acl(config: dict, topic: str, n: int) -> list[bytes]:
    import confluent_kafka

    consumer = confluent_kafka.Consumer({**config, "group.id": "g", "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < n and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def test_acls_are_managed_and_enforced(security):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       NewTopic, ResourcePatternType, ResourceType)
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                             ResourcePatternFilter)
    from kafka.admin import ResourceType as KpResourceType

    admin_config = security.confluent("SASL_PLAINTEXT", "PLAIN", "admin")
    admin = AdminClient(admin_config)
    for future in admin.create_topics([NewTopic("allowed", 1), NewTopic("denied", 1)]).values():
        future.result(timeout=30)
    # A binding made and deleted again (delete_acls), then erin's.
    temporary = AclBinding(ResourceType.TOPIC, "denied", ResourcePatternType.LITERAL, "User:erin", "*",
                           AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([temporary, *erin_bindings()]).values():
        assert future.result(timeout=30) is None
    deleted = admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, "denied", ResourcePatternType.LITERAL,
                                                  None, None, AclOperation.ANY, AclPermissionType.ANY)])
    assert [(b.name, b.operation) for f in deleted.values() for b in f.result(timeout=30)] == [
        ("denied", AclOperation.WRITE)]
    assert described(admin_config) == expected_bindings()

    erin = security.confluent("SASL_PLAINTEXT", "PLAIN", "erin")
    assert produce_acl(erin, "allowed") == [None] * N_ACL
    refused = produce_acl(erin, "denied")
    assert len(refused) == N_ACL and {e.code() for e in refused} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert sorted(consume_acl(erin, "allowed", N_ACL)) == sorted(f"allowed-{i}".encode() for i in range(N_ACL))
    # erin may not manage ACLs (CLUSTER Alter): CLUSTER_AUTHORIZATION_FAILED.
    with pytest.raises(Exception, match="(?i)cluster.?authorization"):
        erin_admin = AdminClient(erin)
        [f.result(timeout=30) for f in erin_admin.create_acls([temporary]).values()]

    kp_admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{security.ports['SASL_PLAINTEXT']}",
                                security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                sasl_plain_username="admin", sasl_plain_password=PASSWORDS["admin"])
    try:
        found, error = kp_admin.describe_acls(ACLFilter(
            principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        kp_admin.close()
    assert error.errno == 0
    assert {(a.resource_pattern.resource_type.name, a.resource_pattern.resource_name, a.principal,
             a.operation.name) for a in found} == {
        ("TOPIC", "allowed", "User:erin", "WRITE"), ("TOPIC", "allowed", "User:erin", "DESCRIBE"),
        ("TOPIC", "allowed", "User:erin", "READ"), ("GROUP", "g", "User:erin", "READ")}


# -- SaslHandshake v0 and librdkafka 2.0.2 (issue 22) -------------------------------------------


def kcat(security: Security, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Debian's kcat over SASL_SSL with SCRAM-SHA-512 as user kc (the password in a -F file, not argv)."""
    config = security.tmp / "kcat.conf"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\nsasl.username=kc\n"
                      f"sasl.password={PASSWORDS['kc']}\nssl.ca.location={security.ca}\n")
    return subprocess.run(["kcat", "-F", str(config), "-b", f"127.0.0.1:{security.ports['SASL_SSL']}", *args],
                          input=stdin, capture_output=True, text=True, timeout=120)


def test_kcat_librdkafka_2_0_produces_and_consumes_over_sasl_ssl_with_scram_sha_512(security):
    """Debian 12's kcat (librdkafka 2.0.2) refused to log in ("SASL Handshake not supported by broker")
    while SaslHandshake v0 was not listed, and sends its SCRAM client nonce twice (librdkafka#4895),
    which Kafka 3.x accepts."""
    need_command("kcat", "kcat")
    version = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=30).stdout
    topic = "kcat-scram"
    values = [f"kcat-{i}" for i in range(N_KCAT)]
    produced = kcat(security, "-P", "-t", topic, stdin="\n".join(values) + "\n")
    assert produced.returncode == 0, version + produced.stderr
    assert "ERROR" not in produced.stderr and "authentication" not in produced.stderr.lower(), produced.stderr
    EXPECTED[topic] += N_KCAT
    consumed = kcat(security, "-C", "-t", topic, "-o", "beginning", "-e", "-c", str(N_KCAT), "-f", "%s\n")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == values
    log = security.log()
    assert "authenticated as User:kc (SCRAM-SHA-512" in log
    assert PASSWORDS["kc"] not in log


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_client_of_kafka_0_10_logs_in_with_raw_tokens_after_sasl_handshake_v0(security, mechanism):
    """kafka-python told the broker is Kafka 0.10.1 (``api_version``) uses SaslHandshake v0, then
    sends its SASL tokens as raw frames (KIP-43), as librdkafka does without SaslAuthenticate."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**security.kafka_python("SASL_SSL", mechanism, "kc"), api_version=(0, 10, 1))
    try:
        assert TLS_TOPICS["confluent"] in consumer.topics()  # Metadata, served once authenticated
    finally:
        consumer.close()
    log = security.log()
    assert f"authenticated as User:kc ({mechanism}, raw tokens after SaslHandshake v0)" in log
    assert PASSWORDS["kc"] not in log


# -- one restart: users and ACLs survive it (was one restart each in test_sasl.py and test_acls.py) --


def test_users_and_acls_survive_a_restart(security):
    from confluent_kafka import KafkaError

    security.stop()
    security.start()  # a second start, the module's only one: what is on disk must come back
    # Users (test_sasl.py's restart).
    produce_confluent(security.confluent("SASL_SSL", "PLAIN", "alice"), "sasl-restart")
    produce_kafka_python(security.kafka_python("SASL_SSL", "SCRAM-SHA-512", "carol"), "sasl-restart")
    produce_confluent(security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-256", "dave"), "sasl-restart")
    authentication_fails(security.confluent("SASL_PLAINTEXT", "SCRAM-SHA-512", "bob"))
    # ACLs (test_acls.py's restart): still listed and still enforced.
    assert described(security.confluent("SASL_PLAINTEXT", "PLAIN", "admin")) == expected_bindings()
    erin = security.confluent("SASL_PLAINTEXT", "PLAIN", "erin")
    assert produce_acl(erin, "allowed", 5) == [None] * 5
    assert {e.code() for e in produce_acl(erin, "denied", 5)} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}


def test_every_record_lands_in_the_table_once(security):
    security.stop()
    rows = read_table(security.data_dir, "SELECT topic, count(*) AS n, count(DISTINCT offset) AS d, "
                                         "min(offset) AS lo, max(offset) AS hi FROM records GROUP BY topic")
    by_topic = {r["topic"]: (r["n"], r["d"], r["lo"], r["hi"]) for r in rows}
    # Every test's topics, and no others: nothing of "denied", nothing twice.
    assert by_topic == {topic: (n, n, 0, n - 1) for topic, n in EXPECTED.items() if n}
    assert by_topic[TLS_TOPICS["kafka-python"]] == (N_TLS, N_TLS, 0, N_TLS - 1)
    assert by_topic[TLS_TOPICS["confluent"]] == (N_TLS + 2, N_TLS + 2, 0, N_TLS + 1)  # + "before" and "after"
    assert by_topic["allowed"][:2] == (N_ACL + 5, N_ACL + 5) and "denied" not in by_topic
