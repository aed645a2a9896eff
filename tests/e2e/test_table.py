"""The table as Spark users meet it, against a real server, real clients, real Spark and the metastore.

* A trickle producer (20 records/s for 60 s, confluent-kafka) while a reader
  in another Spark session (Spark Connect, by name) counts rows in a loop
  through commits and background compactions: the count never goes down,
  never exceeds what was acknowledged, and ends equal to it; afterwards each
  time partition holds a handful of files.
* The table queried by name over JDBC (beeline through the Spark Thrift
  Server the server runs), then after ``kill -9`` and a restart from a
  classic Spark session in another process: no row lost, none twice.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.server_process import ServerProcess, free_port
from tests.e2e.shared_server import LogCursor
from tests.e2e.table_reader import read_table, read_tables

pytestmark = pytest.mark.slow

RATE = 20          # records per second
SECONDS = 60


def produce_trickle(bootstrap: str, topic: str, acked: list[int], stop: threading.Event) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})

    def delivered(err, msg) -> None:
        if err is None:
            acked.append(msg.offset())

    started = time.monotonic()
    for i in range(RATE * SECONDS):
        if stop.is_set():
            break
        producer.produce(topic, value=b"trickle-%d" % i, on_delivery=delivered)
        producer.poll(0)
        # keep to the rate: the i-th record leaves at i / RATE seconds
        delay = started + (i + 1) / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    producer.flush(30)


def test_trickle_is_compacted_and_a_concurrent_reader_never_sees_a_wrong_count(tmp_path):
    from pipeline.persist.spark_sink import build_spark_session

    # A server of its own: background compaction is a server-level setting, too costly to leave
    # running on a server shared for the whole session (tests/e2e/shared_server.py says why).
    server = ServerProcess(tmp_path / "data", "--table-commit-interval-ms", "2000", "--table-compaction-interval-ms",
                           "6000", "--table-compaction-min-files", "3", "--file-delete-delay-ms", "10000").start()
    topic = "trickle"
    compacted = f"compacted `topic`='{topic}'"
    log = LogCursor(server)
    acked: list[int] = []
    observed: list[tuple[int, int]] = []   # (rows counted, acknowledged when the count returned)
    stop = threading.Event()
    errors: list[BaseException] = []
    reader_session = build_spark_session(remote=f"sc://127.0.0.1:{server.connect_port}")

    def reader() -> None:
        while not stop.is_set():
            try:
                n = reader_session.sql(f"SELECT count(*) FROM pipeline.records WHERE topic = '{topic}'").collect()[0][0]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return
            observed.append((n, len(acked)))

    try:
        producer = threading.Thread(target=produce_trickle, args=(server.bootstrap, topic, acked, stop))
        read = threading.Thread(target=reader)
        producer.start()
        read.start()
        producer.join(SECONDS + 60)
        assert not producer.is_alive()
        total = len(acked)
        assert total == RATE * SECONDS
        # the last commit lands within table.commit.interval.ms; the reader keeps counting meanwhile
        deadline = time.monotonic() + 60
        while (not observed or observed[-1][0] < total) and time.monotonic() < deadline and not errors:
            time.sleep(0.2)
        # and the background compaction gets a last turn
        log_deadline = time.monotonic() + 30
        while log.text().count(compacted) < 2 and time.monotonic() < log_deadline:
            time.sleep(0.5)
        stop.set()
        read.join(60)
        counts = [n for n, _ in observed]
        assert not errors, errors
        assert counts == sorted(counts), "the row count went down"
        assert all(n <= a for n, a in observed), "more rows than acknowledged records"
        assert counts[-1] == total
        assert len(counts) > 20  # the reader ran through many commits and compactions
        assert compacted in log.text(), log.text()[-3000:]
        # a handful of files per partition and hour, not one per commit
        files_per_partition = {
            partition: len(list_files(Path(partition))) for partition in partition_dirs(reader_session, topic)}
        assert files_per_partition and all(n <= 4 for n in files_per_partition.values()), files_per_partition
        # every acknowledged record once, read through the running server (no JVM of a reader's own)
        rows = reader_session.sql(f"SELECT `offset` FROM pipeline.records WHERE topic = '{topic}'").collect()
        offsets = sorted(r[0] for r in rows)
        assert offsets == sorted(acked) == list(range(RATE * SECONDS))
    finally:
        stop.set()
        reader_session.stop()
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()


def partition_dirs(session, topic: str) -> list[str]:
    """The locations the catalog gives the topic's partitions right now."""
    out = []
    for row in session.sql("SHOW PARTITIONS pipeline.records").collect():
        if row[0].startswith(f"topic={topic}/"):
            spec = ", ".join(
                f"`{k}`={v}" if k == "hour" else f"`{k}`='{v}'"
                for k, v in (part.split("=", 1) for part in row[0].split("/")))
            described = session.sql(f"DESCRIBE FORMATTED pipeline.records PARTITION ({spec})").collect()
            out.append(next(r[1] for r in described if r[0] == "Location").removeprefix("file:"))
    return out


def list_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.is_file() and not p.name.startswith(("_", "."))]


def beeline(port: int, query: str) -> str:
    import pyspark

    beeline = Path(pyspark.__file__).parent / "bin" / "beeline"
    proc = subprocess.run([str(beeline), "-u", f"jdbc:hive2://127.0.0.1:{port}/pipeline", "--silent=true",
                           "--outputformat=csv2", "-e", query],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # csv2 rows; beeline echoes its prompt before the header line
    lines = [line.rsplit("> ", 1)[-1] for line in proc.stdout.splitlines() if line.strip()]
    return "\n".join(lines)


def test_queried_by_name_over_jdbc_and_from_another_session_across_kill_9(tmp_path):
    from kafka import KafkaProducer

    data_dir = tmp_path / "data"
    thrift = free_port()
    port = free_port()
    args = ("--thrift-port", str(thrift), "--table-commit-interval-ms", "500")
    server = ServerProcess(data_dir, *args, port=port).start()
    try:
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
        for i in range(300):
            producer.send("jdbc", key=b"k%d" % (i % 7), value=b"row-%d" % i)
        producer.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = beeline(thrift, "SELECT count(*) AS n, count(DISTINCT `offset`) AS d FROM records WHERE topic = 'jdbc'")
            if out.splitlines()[-1] == "300,300":
                break
            time.sleep(0.5)
        assert out.splitlines()[-2:] == ["n,d", "300,300"], out
        assert "records" in beeline(thrift, "SHOW TABLES")

        server.kill()  # kill -9: the next start recovers from the WAL
        server = ServerProcess(data_dir, *args, port=port, log_path=tmp_path / "restarted.log").start()
        for i in range(300, 400):
            producer.send("jdbc", value=b"row-%d" % i)
        producer.flush()
        producer.close()
    finally:
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()
    # a classic Spark session in another process, on the same metastore, by name
    rows = read_table(data_dir, "SELECT `offset`, value FROM pipeline.records WHERE topic = 'jdbc' ORDER BY `offset`")
    assert [r["offset"] for r in rows] == list(range(400))
    assert [r["value"] for r in rows] == [b"row-%d" % i for i in range(400)]


PAYMENTS_DDL = "id BIGINT, amount DECIMAL(12,2), at TIMESTAMP, tags ARRAY<STRING>"
SENSOR_SCHEMA = {"type": "record", "name": "Reading", "fields": [
    {"name": "sensor", "type": "string"}, {"name": "celsius", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}


def avro_value(reading: dict, schema_id: int = 7) -> bytes:
    """Confluent wire format: magic 0, schema id, Avro binary."""
    import io
    import struct

    import fastavro

    out = io.BytesIO()
    out.write(b"\0" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(SENSOR_SCHEMA), reading)
    return out.getvalue()


def test_typed_topics_get_columns_and_bad_values_go_to_the_dead_letters_across_kill_9(tmp_path):
    import json
    from datetime import datetime, timezone
    from decimal import Decimal

    from kafka import KafkaProducer

    config = tmp_path / "pipeline.toml"
    config.write_text(
        '[topic."payments"]\nvalue.format = "json"\n'
        f'value.schema = "{PAYMENTS_DDL}"\n'
        '[topic."sensors"]\nvalue.format = "avro"\nvalue.wire.format = "confluent"\n'
        f"value.schema = '{json.dumps(SENSOR_SCHEMA)}'\n")
    data_dir = tmp_path / "data"
    port = free_port()
    server = ServerProcess(data_dir, "--config", str(config), port=port).start()

    def payment(i: int) -> bytes:
        return json.dumps({"id": i, "amount": f"{i}.25", "at": "2026-11-23T10:00:00Z", "tags": ["a", str(i)],
                           "ignored": True}).encode()

    bad = {3: b"{not json", 5: b'{"id": "five"}', 8: b"[1, 2]"}  # malformed, wrong type, not an object
    at = datetime(2026, 11, 23, 10, tzinfo=timezone.utc)
    try:
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all", linger_ms=100)
        for i in range(10):  # one batch: good and bad values together
            producer.send("payments", value=bad.get(i, payment(i)))
            producer.send("sensors", value=avro_value({"sensor": f"s{i}", "celsius": i / 2, "at": at})
                          if i != 4 else b"\0\0\0\0\7garbage")
        producer.flush()
        server.kill()  # acknowledged (WAL), not yet committed to the table: replayed at the next start
        server = ServerProcess(data_dir, "--config", str(config), port=port,
                               log_path=tmp_path / "restarted.log").start()
        producer.send("payments", value=payment(10))
        producer.flush()
        producer.close()
    finally:
        code = server.stop() if server.running else None
    assert code == 0, server.log_text()

    payments, dead, sensors, records = read_tables(data_dir, [
        "SELECT `offset`, id, amount, at, tags, value FROM payments ORDER BY `offset`",
        "SELECT topic, `partition`, `offset`, value, error FROM dead_letters ORDER BY topic, `offset`",
        "SELECT `offset`, sensor, celsius, at FROM sensors ORDER BY `offset`",
        "SELECT count(*) AS n FROM records"])
    good = [i for i in range(11) if i not in bad]
    assert [r["offset"] for r in payments] == good
    assert [r["id"] for r in payments] == good
    assert [r["amount"] for r in payments] == [Decimal(f"{i}.25") for i in good]
    assert {r["at"] for r in payments} == {at}
    assert [r["tags"] for r in payments] == [["a", str(i)] for i in good]
    assert [r["value"] for r in payments] == [payment(i) for i in good]  # the raw bytes stay beside

    assert [(r["topic"], r["offset"]) for r in dead] == [("payments", 3), ("payments", 5), ("payments", 8),
                                                         ("sensors", 4)]
    assert [r["value"] for r in dead[:3]] == [bad[3], bad[5], bad[8]]
    assert "JSON" in dead[0]["error"] and "id" in dead[1]["error"]
    assert all(r["error"] for r in dead)

    assert [(r["offset"], r["sensor"], r["celsius"], r["at"]) for r in sensors] == [
        (i, f"s{i}", i / 2, at) for i in range(10) if i != 4]
    # nothing of a typed topic in the records table
    assert records == [{"n": 0}]

    # a changed schema for a topic whose table exists is refused at start, naming the topic (exit 2)
    config.write_text(config.read_text().replace(PAYMENTS_DDL, "id STRING"))
    refused = ServerProcess(data_dir, "--config", str(config), log_path=tmp_path / "refused.log")
    with pytest.raises(RuntimeError, match="exited with 2"):
        refused.start()
    assert "topic 'payments': table pipeline.payments has columns" in refused.log_text()


def test_an_external_metastore_is_shared_with_a_classic_session_while_the_server_runs(tmp_path):
    from kafka import KafkaProducer

    from pipeline.persist.spark_cluster import MetastoreServer

    data_dir = tmp_path / "data"
    # A server of its own: hive.metastore.uris is a server-level setting (the shared servers use
    # the embedded metastore in their data directory).
    with MetastoreServer(tmp_path / "metastore") as metastore:
        server = ServerProcess(data_dir, "--metastore-uris", metastore.uris, "--table-commit-interval-ms", "500",
                               "--spark-connect-port", "0").start()
        try:
            producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
            for i in range(50):
                producer.send("shared", value=b"v%d" % i)
            producer.flush()
            producer.close()
            # a classic Spark application of its own (another process, another JVM), by name, server running
            deadline = time.monotonic() + 90
            while True:
                rows = read_table(data_dir, "SELECT count(*) AS n FROM pipeline.records WHERE topic = 'shared'",
                                  metastore_uris=metastore.uris)
                if rows == [{"n": 50}] or time.monotonic() > deadline:
                    break
            assert rows == [{"n": 50}]
            assert server.running
            # nothing went to an embedded metastore in the data directory
            assert not (data_dir / "_pipeline" / "metastore_db").exists()
        finally:
            code = server.stop() if server.running else None
        assert code == 0, server.log_text()
