"""End to end: TLS listeners with unmodified clients (issue 9).

One server with two listeners, ``PLAINTEXT://127.0.0.1:0`` and
``SSL://127.0.0.1:P`` with ``ssl.client.auth=required``; certificates are
made here by trustme. confluent-kafka and kafka-python, each with its own
client certificate, produce over SSL and consume the records back; Metadata
advertises the listener each client came through; a client without a
certificate and a plaintext client on the TLS port are closed while the
others carry on; after the server stops, the table holds every record once.
"""

from __future__ import annotations

import socket
import time

import pytest
import trustme

from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess, free_port
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

N = 200
TOPICS = {"confluent": "tls-confluent", "kafka-python": "tls-kafka-python"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    """The server and the certificate files: (server, ssl_port, files dict)."""
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    files = {"ca": tmp / "ca.pem", "keystore": tmp / "server.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(files["keystore"]))
    for user in ("alice", "bob"):
        leaf = ca.issue_cert(f"{user}@example.test", common_name=user, organization_unit_name="eng")
        leaf.cert_chain_pems[0].write_to_path(str(tmp / f"{user}.crt"))
        leaf.private_key_pem.write_to_path(str(tmp / f"{user}.key"))
        files[user] = (tmp / f"{user}.crt", tmp / f"{user}.key")
    ssl_port = free_port()
    server = ServerProcess(tmp / "data", "--listen", f"PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:{ssl_port}",
                           "--ssl-keystore-location", str(files["keystore"]),
                           "--ssl-truststore-location", str(files["ca"]), "--ssl-client-auth", "required",
                           "--table-commit-interval-ms", "1000").start()
    try:
        yield server, ssl_port, files
    finally:
        if server.running:
            server.kill()


def confluent_ssl(port: int, files: dict, user: str | None) -> dict:
    config = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SSL",
              "ssl.ca.location": str(files["ca"])}
    if user is not None:
        config.update({"ssl.certificate.location": str(files[user][0]), "ssl.key.location": str(files[user][1])})
    return config


def kafka_python_ssl(port: int, files: dict) -> dict:
    return {"bootstrap_servers": f"127.0.0.1:{port}", "security_protocol": "SSL", "ssl_cafile": str(files["ca"]),
            "ssl_certfile": str(files["bob"][0]), "ssl_keyfile": str(files["bob"][1])}


def produce_confluent(port: int, files: dict) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer(confluent_ssl(port, files, "alice"))
    errors = []
    for i in range(N):
        producer.produce(TOPICS["confluent"], key=str(i).encode(), value=f"c{i}".encode(),
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(60) == 0 and not errors


def produce_kafka_python(port: int, files: dict) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka_python_ssl(port, files))
    futures = [producer.send(TOPICS["kafka-python"], key=str(i).encode(), value=f"k{i}".encode()) for i in range(N)]
    producer.flush(60)
    assert [f.get(timeout=30).offset for f in futures] == list(range(N))
    producer.close()


def test_confluent_and_kafka_python_produce_and_consume_over_mtls(tls):
    server, ssl_port, files = tls
    produce_confluent(ssl_port, files)
    produce_kafka_python(ssl_port, files)

    import confluent_kafka
    from kafka import KafkaConsumer, TopicPartition

    consumer = confluent_kafka.Consumer({**confluent_ssl(ssl_port, files, "alice"), "group.id": "tls-c",
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(TOPICS["kafka-python"], 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < N and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    assert values == [f"k{i}".encode() for i in range(N)]

    kp = KafkaConsumer(**kafka_python_ssl(ssl_port, files), auto_offset_reset="earliest", enable_auto_commit=False,
                       consumer_timeout_ms=20_000)
    kp.assign([TopicPartition(TOPICS["confluent"], 0)])
    kp.seek_to_beginning()
    got = []
    for record in kp:
        got.append(record.value)
        if len(got) == N:
            break
    kp.close()
    assert got == [f"c{i}".encode() for i in range(N)]
    log = server.log_text()
    assert "TLS client User:CN=alice,OU=eng" in log and "TLS client User:CN=bob,OU=eng" in log


def test_metadata_advertises_the_listener_the_client_came_through(tls):
    import confluent_kafka.admin

    server, ssl_port, files = tls
    plain = confluent_kafka.admin.AdminClient({"bootstrap.servers": server.bootstrap}).list_topics(timeout=20)
    secure = confluent_kafka.admin.AdminClient(confluent_ssl(ssl_port, files, "alice")).list_topics(timeout=20)
    assert [(b.host, b.port) for b in plain.brokers.values()] == [("127.0.0.1", server.port)]
    assert [(b.host, b.port) for b in secure.brokers.values()] == [("127.0.0.1", ssl_port)]


def test_a_client_without_certificate_and_a_plaintext_client_are_closed_others_carry_on(tls):
    import confluent_kafka
    import confluent_kafka.admin

    server, ssl_port, files = tls
    alice = confluent_kafka.Producer(confluent_ssl(ssl_port, files, "alice"))
    alice.produce(TOPICS["confluent"], value=b"before")
    assert alice.flush(30) == 0

    anonymous = confluent_kafka.admin.AdminClient(confluent_ssl(ssl_port, files, None))
    with pytest.raises(confluent_kafka.KafkaException):
        anonymous.list_topics(timeout=5)

    with socket.create_connection(("127.0.0.1", ssl_port), timeout=10) as plain:
        plain.sendall(rc.frame(rc.api_versions(), 1))
        try:
            assert plain.recv(4096) == b""  # closed, no Kafka response
        except ConnectionResetError:
            pass

    alice.produce(TOPICS["confluent"], value=b"after")
    assert alice.flush(30) == 0
    log = server.log_text()
    assert "on listener SSL: TLS handshake failed" in log
    assert "plaintext client on a TLS listener?" in log
    assert "PRIVATE KEY" not in log


def test_every_record_lands_in_the_table_once(tls):
    server, _, _ = tls
    assert server.stop() == 0
    rows = read_table(server.data_dir, "SELECT topic, count(*) AS n, count(DISTINCT offset) AS d, "
                                       "min(offset) AS lo, max(offset) AS hi FROM records GROUP BY topic")
    by_topic = {r["topic"]: (r["n"], r["d"], r["lo"], r["hi"]) for r in rows}
    assert by_topic[TOPICS["kafka-python"]] == (N, N, 0, N - 1)
    assert by_topic[TOPICS["confluent"]] == (N + 2, N + 2, 0, N + 1)  # + "before" and "after"
