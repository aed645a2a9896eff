"""End to end: ACL authorization with unmodified clients (issue 9).

One server with ``PLAINTEXT`` and ``SASL_PLAINTEXT`` listeners (both on port
0; the SASL port read from its "listening on HOST:PORT (NAME, PROTOCOL)" log
line), ``authorizer.class.name=pipeline`` and ``super.users=User:admin``;
users made with ``pipeline users add --password-stdin`` before the start. The
admin (SASL PLAIN) creates the topics and ACLs with confluent-kafka's
AdminClient; alice produces to the topic she may Write (acknowledged) and to
one she may not (TOPIC_AUTHORIZATION_FAILED), consumes hers in group "g";
kafka-python's KafkaAdminClient describes the ACLs. After a restart on the
same data dir the ACLs are still there and still enforced; after the server
stops, the table holds alice's allowed records and nothing of the denied topic.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.server_process import ServerProcess
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

N = 20
PASSWORDS = {"admin": "pw-admin", "alice": "pw-alice"}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
LISTENER_LINE = re.compile(r"listening on (\S+):(\d+) \((\w+)")
TOPIC_AUTHORIZATION_FAILED = 29


def add_user(data_dir: Path, user: str) -> None:
    """``pipeline users add USER --password-stdin``."""
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "users", "add", user, "--password-stdin",
                           "--data-dir", str(data_dir)],
                          input=PASSWORDS[user] + "\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class Acls:
    """The running server and its SASL port; ``restart`` keeps the data dir."""

    def __init__(self, tmp: Path) -> None:
        self.data_dir = tmp / "data"
        self.server: ServerProcess | None = None
        self.sasl_port = 0

    def start(self) -> None:
        server = ServerProcess(self.data_dir, "--listen", LISTENERS, "--authorizer-class-name", "pipeline",
                               "--super-users", "User:admin", "--table-commit-interval-ms", "1000")
        # The log is appended to across restarts: only what this start wrote names its ports (the
        # last start's lines name ports nobody listens on any more).
        before = server.log_path.stat().st_size if server.log_path.exists() else 0
        self.server = server.start()
        deadline = time.monotonic() + 30
        while True:
            text = server.log_path.read_bytes()[before:].decode(errors="replace")
            ports = {name: int(port) for _h, port, name in LISTENER_LINE.findall(text)}
            if "SASL_PLAINTEXT" in ports or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.sasl_port = ports["SASL_PLAINTEXT"]

    def stop(self) -> None:
        assert self.server is not None
        assert self.server.stop() == 0

    def confluent(self, user: str) -> dict:
        return {"bootstrap.servers": f"127.0.0.1:{self.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN", "sasl.username": user, "sasl.password": PASSWORDS[user]}


@pytest.fixture(scope="module")
def acls(tmp_path_factory):
    acls = Acls(tmp_path_factory.mktemp("acls"))
    add_user(acls.data_dir, "admin")
    add_user(acls.data_dir, "alice")
    acls.start()
    try:
        yield acls
    finally:
        if acls.server is not None and acls.server.running:
            acls.server.kill()


def alice_bindings():
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    def binding(rtype, name, operation):
        return AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:alice", "*", operation,
                          AclPermissionType.ALLOW)

    # Write+Describe to produce, Read to consume (Kafka: Fetch and OffsetCommit need TOPIC Read).
    return [binding(ResourceType.TOPIC, "allowed", AclOperation.WRITE),
            binding(ResourceType.TOPIC, "allowed", AclOperation.DESCRIBE),
            binding(ResourceType.TOPIC, "allowed", AclOperation.READ),
            binding(ResourceType.GROUP, "g", AclOperation.READ)]


def described(config: dict) -> set[tuple]:
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    admin = AdminClient(config)  # kept referenced until the answer: a collected client fails its futures
    found = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
        AclPermissionType.ANY)).result(timeout=30)
    return {(b.restype, b.name, b.principal, b.operation) for b in found}


def produce(config: dict, topic: str, n: int = N) -> list:
    """Produce n records; the delivery errors (None for each acknowledged record)."""
    import confluent_kafka

    producer = confluent_kafka.Producer({**config, "message.timeout.ms": 20_000})
    results: list = []
    for i in range(n):
        producer.produce(topic, value=f"{topic}-{i}".encode(), on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(60) == 0
    return results


def consume(config: dict, topic: str, n: int) -> list[bytes]:
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


def test_acls_are_managed_enforced_and_survive_a_restart(acls):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       NewTopic, ResourcePatternType, ResourceType)
    from kafka.admin import (ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                             ResourcePatternFilter)
    from kafka.admin import ResourceType as KpResourceType

    admin_config = acls.confluent("admin")
    admin = AdminClient(admin_config)
    for future in admin.create_topics([NewTopic("allowed", 1), NewTopic("denied", 1)]).values():
        future.result(timeout=30)
    # A binding made and deleted again (delete_acls), then alice's.
    temporary = AclBinding(ResourceType.TOPIC, "denied", ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.WRITE, AclPermissionType.ALLOW)
    for future in admin.create_acls([temporary, *alice_bindings()]).values():
        assert future.result(timeout=30) is None
    deleted = admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, "denied", ResourcePatternType.LITERAL,
                                                  None, None, AclOperation.ANY, AclPermissionType.ANY)])
    assert [(b.name, b.operation) for f in deleted.values() for b in f.result(timeout=30)] == [
        ("denied", AclOperation.WRITE)]
    expected = {(b.restype, b.name, b.principal, b.operation) for b in alice_bindings()}
    assert described(admin_config) == expected

    alice = acls.confluent("alice")
    assert produce(alice, "allowed") == [None] * N
    refused = produce(alice, "denied")
    assert len(refused) == N and {e.code() for e in refused} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    assert sorted(consume(alice, "allowed", N)) == sorted(f"allowed-{i}".encode() for i in range(N))
    # alice may not manage ACLs (CLUSTER Alter): CLUSTER_AUTHORIZATION_FAILED.
    with pytest.raises(Exception, match="(?i)cluster.?authorization"):
        alice_admin = AdminClient(alice)
        [f.result(timeout=30) for f in alice_admin.create_acls([temporary]).values()]

    kp_admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{acls.sasl_port}", security_protocol="SASL_PLAINTEXT",
                                sasl_mechanism="PLAIN", sasl_plain_username="admin",
                                sasl_plain_password=PASSWORDS["admin"])
    try:
        found, error = kp_admin.describe_acls(ACLFilter(
            principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY)))
    finally:
        kp_admin.close()
    assert error.errno == 0
    assert {(a.resource_pattern.resource_type.name, a.resource_pattern.resource_name, a.principal,
             a.operation.name) for a in found} == {
        ("TOPIC", "allowed", "User:alice", "WRITE"), ("TOPIC", "allowed", "User:alice", "DESCRIBE"),
        ("TOPIC", "allowed", "User:alice", "READ"), ("GROUP", "g", "User:alice", "READ")}

    acls.stop()
    acls.start()
    assert described(acls.confluent("admin")) == expected
    alice = acls.confluent("alice")
    assert produce(alice, "allowed", 5) == [None] * 5
    assert {e.code() for e in produce(alice, "denied", 5)} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    acls.stop()

    rows = read_table(acls.data_dir, "SELECT topic, count(*) AS n, count(DISTINCT offset) AS d FROM records "
                                     "GROUP BY topic")
    assert {r["topic"]: (r["n"], r["d"]) for r in rows} == {"allowed": (N + 5, N + 5)}
