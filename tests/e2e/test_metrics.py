"""End to end: /metrics, /healthz, /readyz and ``pipeline top`` of a real server, scraped during produce runs.

One server (Spark local, ``--ack-on spark`` so that every acknowledged
record is in the table and the flush metrics move with the test) serves the
whole module, in file order:

1. start-up: /readyz is polled from the moment the metrics port answers;
   it says 503 while Spark starts and recovery runs, 200 only afterwards;
2. a raw-protocol run whose every byte the test knows: request counts per
   api, error counts, bytes and messages in, the stage histograms (which must
   tile each request's life), WAL and flush counters, connections, all as
   deltas between two scrapes;
3. confluent-kafka and kafka-python producers: records per topic;
4. every listed family is exported; idle counters move at most as fast as time;
5. ``pipeline top`` renders the live server (its render function on a live
   scrape, and ``pipeline top --once`` as a subprocess);
6. a failing Spark write acknowledges nothing, and the server recovers when
   Spark does (here because it needs the same ``--ack-on spark``, so no server
   of its own);
7. shutdown: /readyz says 503 from SIGTERM on.

A server of its own, not the shared one: ``--ack-on spark`` is a server-level
setting, and the first test must watch the server start.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.network.request_metrics import STAGES
from pipeline.observe.top import Scrape, render, scrape
from tests.e2e import raw_client as rc
from tests.e2e.server_process import ServerProcess
from tests.e2e.shared_server import LogCursor, wait_committed
from tests.e2e.table_reader import read_table

pytestmark = pytest.mark.slow

METRICS_LINE = re.compile(rb"metrics on http://127\.0\.0\.1:(\d+)/metrics")
LISTENING = re.compile(rb"listening on (\S+):(\d+)")
START_TIMEOUT_S = 180.0
MiB = 1 << 20

RAW_TOPIC = "metrics-raw"
RAW_REQUESTS = 30          # acks=-1 produce requests, 1-3 records each
RAW_ACKS0_REQUESTS = 5     # acks=0 produce requests, 2 records each
CONFLUENT_TOPIC, KAFKA_PYTHON_TOPIC = "metrics-confluent", "metrics-kafka-python"
CLIENT_RECORDS = 500
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pipeline-dashboard.json"


@dataclass
class Poll:
    """One GET /readyz during start-up."""

    at: float
    status: int
    body: str
    recovered_before: bool
    """The server's log said ``recovered:`` before this request was sent."""
    recovered_after: bool
    """The server's log said ``recovered:`` when this answer had come back."""


@dataclass
class Started:
    server: ServerProcess
    base: str
    """http://127.0.0.1:PORT"""
    polls: list[Poll] = field(default_factory=list)

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"

    def scrape(self) -> Scrape:
        return scrape(self.metrics_url)


def get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Started:
    """The module's server, started with /readyz polled every 20 ms from the first moment it answers."""
    data_dir = tmp_path_factory.mktemp("metrics") / "data"
    server = ServerProcess(data_dir, "--metrics-port", "0", "--ack-on", "spark", "--linger-ms", "20",
                           "--num-partitions", "2")
    server.launch()
    try:
        assert server.proc is not None and server.proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(server.proc.stdout, selectors.EVENT_READ)
        out = b""
        started: Started | None = None
        listening = False
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (listening and started is not None and started.polls and started.polls[-1].status == 200):
            assert time.monotonic() < deadline, f"not ready within {START_TIMEOUT_S} s:\n{server.log_text()}"
            assert server.running, f"server exited:\n{server.log_text()}"
            if selector.select(timeout=0.02):
                out += os.read(server.proc.stdout.fileno(), 4096)
            if started is None and (m := METRICS_LINE.search(out)):
                started = Started(server, f"http://127.0.0.1:{int(m.group(1))}")
            if (m := LISTENING.search(out)) and not listening:
                server.port, listening = int(m.group(2)), True
            if started is not None:
                recovered_before = "recovered:" in server.log_text()
                status, body = get(f"{started.base}/readyz")
                started.polls.append(Poll(time.monotonic(), status, body.strip(), recovered_before,
                                          "recovered:" in server.log_text()))
        yield started
    finally:
        if server.running:
            server.kill()


def test_readyz_says_503_until_spark_and_recovery_are_done_then_200(started):
    polls = started.polls
    assert polls[0].status == 503 and polls[0].body == "starting Spark", polls[0]
    first_ready = next(i for i, p in enumerate(polls) if p.status == 200)
    assert all(p.status == 503 for p in polls[:first_ready])
    # Spark took seconds to start: many answers came before the first 200, every
    # one of them naming a start-up phase, and 200 came only after recovery
    assert polls[first_ready].at - polls[0].at > 1.0
    assert {p.body for p in polls[:first_ready]} <= {"starting Spark", "recovering from the write-ahead log",
                                                       "starting the listener"}
    assert polls[first_ready].recovered_after
    assert not any(p.recovered_before for p in polls if p.body in ("starting Spark",
                                                                  "recovering from the write-ahead log"))
    assert polls[first_ready].body == "ready"
    assert get(f"{started.base}/healthz") == (200, "ok\n")


def scrape_until(started: Started, condition, what: str, timeout_s: float = 30.0) -> Scrape:
    """Scrape until ``condition(scrape)`` holds (a response reaches the client just before
    the server records it); return that scrape."""
    deadline = time.monotonic() + timeout_s
    while not condition(current := started.scrape()):
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        time.sleep(0.1)
    return current


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return (after.value(name, **labels) or 0.0) - (before.value(name, **labels) or 0.0)


def raw_values(i: int) -> list[bytes]:
    return [f"raw-{i}-{j}".encode() * (1 + i % 4) for j in range(1 + i % 3)]


def test_metrics_agree_with_a_raw_produce_run(started):
    """Every request and byte of this run is known: the deltas must be exactly them."""
    before = started.scrape()
    client = rc.RawClient("127.0.0.1", started.server.port)
    client.send(rc.frame(rc.api_versions(), 1) + rc.frame(rc.metadata(RAW_TOPIC), 2))
    assert [client.read_response()[0] for _ in range(2)] == [1, 2]
    frames, sent_bytes, sent_records = [], 0, 0
    for i in range(RAW_ACKS0_REQUESTS):  # acks=0 first: the last answered produce covers them
        values = [b"acks0-%d-a" % i, b"acks0-%d-b" % i]
        frames.append(rc.frame(rc.produce(RAW_TOPIC, values, acks=0, partition=1), 100 + i))
        sent_bytes += len(rc.record_batch(values))
        sent_records += len(values)
    frames.append(rc.frame(rc.produce(RAW_TOPIC, [b"nowhere"], partition=7), 199))  # the topic has 2 partitions
    for i in range(RAW_REQUESTS):
        values = raw_values(i)
        frames.append(rc.frame(rc.produce(RAW_TOPIC, values, partition=i % 2), 200 + i))
        sent_bytes += len(rc.record_batch(values))
        sent_records += len(values)
    client.send(b"".join(frames))
    answered = [client.read_response() for _ in range(RAW_REQUESTS + 1)]
    assert [cid for cid, _ in answered] == [199] + [200 + i for i in range(RAW_REQUESTS)]
    produce_count = RAW_ACKS0_REQUESTS + 1 + RAW_REQUESTS

    after = scrape_until(started, lambda s: delta(
        s, before, "kafka_network_requestmetrics_totaltimems_count", request="Produce") >= produce_count,
        "all produce requests recorded")
    requests = "kafka_network_requestmetrics_requests_total"
    assert delta(after, before, requests, request="Produce", version="9") == produce_count
    assert delta(after, before, requests, request="ApiVersions", version="3") == 1
    assert delta(after, before, requests, request="Metadata", version="9") == 1
    errors = "kafka_network_requestmetrics_errors_total"
    assert delta(after, before, errors, request="Produce", error="NONE") == RAW_REQUESTS  # acks=0: no response
    assert delta(after, before, errors, request="Produce", error="UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert delta(after, before, errors, request="Produce") == RAW_REQUESTS + 1
    assert delta(after, before, errors, request="ApiVersions", error="NONE") == 1
    assert delta(after, before, errors, request="Metadata", error="NONE") == 1
    assert delta(after, before, "kafka_server_brokertopicmetrics_bytesin_total", topic=RAW_TOPIC) == sent_bytes
    assert delta(after, before, "kafka_server_brokertopicmetrics_messagesin_total", topic=RAW_TOPIC) == sent_records

    # one sample per request in every stage, and the five stages add up to the total
    sums = {}
    for stage in STAGES:
        name = f"kafka_network_requestmetrics_{stage.lower()}"
        assert delta(after, before, f"{name}_count", request="Produce") == produce_count, stage
        assert delta(after, before, f"{name}_bucket", request="Produce", le="+Inf") == produce_count, stage
        sums[stage] = delta(after, before, f"{name}_sum", request="Produce")
    assert sums["TotalTimeMs"] == pytest.approx(sum(v for k, v in sums.items() if k != "TotalTimeMs"), rel=1e-6)
    # --ack-on spark: each acks=-1 produce waited for a Spark commit (>= tens of ms)
    assert sums["RemoteTimeMs"] / RAW_REQUESTS >= 10.0
    assert delta(after, before, "kafka_network_requestmetrics_remotetimems_sum", request="Metadata") == 0

    # the WAL and the Spark stage saw all of it
    assert delta(after, before, "kafka_log_logflushstats_logflushrateandtimems_count") >= 1
    assert delta(after, before, "pipeline_wal_bytes_total") >= sent_bytes
    flushed = scrape_until(started, lambda s: delta(s, before, "pipeline_flush_records_total") >= sent_records,
                           "records flushed")
    assert delta(flushed, before, "pipeline_flush_records_total") == sent_records
    assert delta(flushed, before, "pipeline_flush_time_ms_count") >= 1
    assert delta(flushed, before, "pipeline_flush_bytes_total") >= sent_bytes
    assert delta(flushed, before, "pipeline_queryable_lag_ms_count") >= 1
    assert delta(flushed, before, "pipeline_live_visible_lag_ms_count") >= 1  # the live view, published
    assert flushed.value("pipeline_buffered_records") == 0
    assert flushed.value("pipeline_buffered_bytes") == 0

    # our connection: created, open, then closed. Count what opened since `before`, not 1: another
    # process's client can reach this port too (one retrying a stopped server's port that the kernel's
    # port-0 pick gave this server: CI once saw a connection more).
    creations, closes = ("kafka_server_socket_server_metrics_connection_creation_total",
                         "kafka_server_socket_server_metrics_connection_close_total")
    count = "kafka_server_socket_server_metrics_connection_count"
    assert delta(after, before, creations) >= 1
    assert after.value(count) == (before.value(count) or 0) + delta(after, before, creations) - delta(after, before, closes)
    client.close()
    closed = scrape_until(started, lambda s: delta(s, before, closes) >= 1 and delta(s, before, closes) == delta(
        s, before, creations), "every connection since `before` closed")
    assert closed.value(count) == (before.value(count) or 0)
    assert closed.value("kafka_network_socketserver_memorypoolavailable") == 100 * MiB  # all memory back
    assert closed.value("kafka_network_socketserver_memorypoolused") == 0


def run_confluent(bootstrap: str, errors: list) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(CLIENT_RECORDS):
        producer.produce(CONFLUENT_TOPIC, value=b"c%d" % i,
                         on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
        producer.poll(0)
    if producer.flush(120):
        errors.append("confluent: records not delivered")


def run_kafka_python(bootstrap: str, errors: list) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)  # idempotent by default: InitProducerId
    futures = [producer.send(KAFKA_PYTHON_TOPIC, value=b"k%d" % i) for i in range(CLIENT_RECORDS)]
    producer.flush(120)
    for future in futures:
        try:
            future.get(timeout=60)
        except Exception as exc:  # noqa: BLE001 - collected and asserted
            errors.append(repr(exc))
    producer.close(30)


def test_metrics_agree_with_real_producers(started):
    before = started.scrape()
    errors: list = []
    threads = [threading.Thread(target=run_confluent, args=(started.server.bootstrap, errors)),
               threading.Thread(target=run_kafka_python, args=(started.server.bootstrap, errors))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads) and errors == [], errors[:5]
    after = started.scrape()
    for topic in (CONFLUENT_TOPIC, KAFKA_PYTHON_TOPIC):
        assert delta(after, before, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == CLIENT_RECORDS
        assert delta(after, before, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) > 0
    requests = "kafka_network_requestmetrics_requests_total"
    produce_requests = delta(after, before, requests, request="Produce")
    assert 2 <= produce_requests <= 2 * CLIENT_RECORDS  # the clients batch as they please
    assert delta(after, before, requests, request="InitProducerId") >= 1   # kafka-python is idempotent
    assert delta(after, before, requests, request="ApiVersions") >= 2
    assert delta(after, before, "kafka_network_requestmetrics_errors_total", request="InitProducerId",
                 error="NONE") == delta(after, before, requests, request="InitProducerId")
    errors_total = delta(after, before, "kafka_network_requestmetrics_errors_total", request="Produce")
    assert delta(after, before, "kafka_network_requestmetrics_errors_total", request="Produce",
                 error="NONE") == errors_total >= produce_requests  # one count per partition, all NONE
    assert delta(after, before, "kafka_server_socket_server_metrics_connection_creation_total") >= 2


EVERY_FAMILY = (
    *(f"kafka_network_requestmetrics_{stage.lower()}_bucket" for stage in STAGES),
    "kafka_network_requestmetrics_requests_total",
    "kafka_network_requestmetrics_errors_total",
    "kafka_network_requestchannel_requestqueuesize",
    "kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent_total",
    "kafka_network_socketserver_networkprocessoravgidlepercent_total",
    "kafka_server_socket_server_metrics_connection_count",
    "kafka_server_socket_server_metrics_connection_creation_total",
    "kafka_server_socket_server_metrics_connection_close_total",
    "kafka_server_brokertopicmetrics_bytesin_total",
    "kafka_server_brokertopicmetrics_messagesin_total",
    "pipeline_muted_channels",
    "kafka_network_socketserver_memorypoolavailable",
    "kafka_network_socketserver_memorypoolused",
    "pipeline_wal_size_bytes",
    "kafka_log_logflushstats_logflushrateandtimems_bucket",
    "pipeline_wal_bytes_total",
    "pipeline_flush_time_ms_bucket",
    "pipeline_flush_bytes_total",
    "pipeline_flush_records_total",
    "pipeline_flush_failures_total",
    "pipeline_table_commit_seconds_total",
    "pipeline_table_lock_wait_seconds_total",
    "pipeline_buffered_records",
    "pipeline_buffered_bytes",
    "pipeline_queryable_lag_ms_bucket",
    "pipeline_live_visible_lag_ms_bucket",
    "pipeline_connections_rejected_total",
    "pipeline_native_stage_items_total",
    "pipeline_ready",
)


def test_every_family_is_exported_and_idle_moves_with_time(started):
    sent_first = time.monotonic()
    first = started.scrape()
    missing = [name for name in EVERY_FAMILY if not first.samples.get(name)]
    assert missing == []
    assert first.label_values("kafka_network_requestchannel_requestqueuesize", "queue") == ["0", "1", "2", "3"]
    assert first.label_values("kafka_server_socket_server_metrics_connection_count", "networkProcessor") == \
        ["0", "1", "2"]
    assert first.label_values("pipeline_muted_channels", "reason") == ["in-flight", "memory", "response-backlog", "sasl"]
    assert first.value("pipeline_ready") == 1
    assert first.value("pipeline_wal_size_bytes") >= 0
    # the Grafana dashboard queries only what the server exports
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {name for panel in dashboard["panels"] for target in panel.get("targets", [])
               for name in re.findall(r"\b(?:kafka|pipeline)_[a-z_]+", target["expr"])}
    assert len(queried) > 25
    assert sorted(name for name in queried if not first.samples.get(name)) == []
    # with nobody producing, handlers and the network thread are idle most of the time, never more than always
    time.sleep(1.0)
    sent_second = time.monotonic()
    second = started.scrape()
    # The server reads its counters while it answers each scrape, somewhere between the request's
    # send and the answer's arrival: the time between its two reads lies within these bounds (a
    # loaded machine answered one scrape 70 ms slower than the other: CI).
    longest, shortest = second.at - sent_first, sent_second - first.at
    for name in ("kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent_total",
                 "kafka_network_socketserver_networkprocessoravgidlepercent_total"):
        idle = delta(second, first, name)
        assert 0.5 * shortest <= idle <= 1.01 * longest, (name, idle, shortest, longest)


def test_top_renders_the_live_server(started):
    previous = started.scrape()
    time.sleep(0.5)
    current = started.scrape()
    console = Console(record=True, width=220, color_system=None)
    console.print(render(current, previous, source=started.metrics_url))
    text = console.export_text()
    for expected in (started.metrics_url, "ready", "Produce", "Metadata", "ApiVersions", RAW_TOPIC,
                     CONFLUENT_TOPIC, KAFKA_PYTHON_TOPIC, "queue 3", "handler idle", "network idle",
                     "WAL fsync p50 / p99", "flush p50 / p99", "ack -> queryable p50 / p99", "processor 2"):
        assert expected in text, expected
    produce = next(line for line in text.splitlines() if "│ Produce" in line)
    assert re.search(r"\d+(\.\d+)?(µs|ms|s) / \d+(\.\d+)?(µs|ms|s)", produce), produce  # percentiles, not "-"

    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "top", "--metrics-url", started.metrics_url,
                           "--once", "--interval", "0.5"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "220"})
    assert done.returncode == 0, done.stderr
    for expected in ("Produce", RAW_TOPIC, CONFLUENT_TOPIC, "queue 0"):
        assert expected in done.stdout, (expected, done.stdout)
    assert re.search(r"window: \d+\.\d s", done.stdout), done.stdout  # two scrapes: rates over their interval


REQUEST_TIMED_OUT = 7
FAIL_TOPIC = "spark-failure"


def partition_response(body: bytes):
    return rc.decode_produce_response(body).responses[0].partition_responses[0]


def test_no_success_ack_while_spark_fails_then_recovery(started):
    """A failing Spark write acknowledges nothing, and the server recovers when Spark does.

    With ``--ack-on spark`` a produce is answered only after the Spark write that
    holds its records commits. The table path is made unwritable by putting a
    plain file where the table directory must be (root ignores permission bits,
    so chmod would not do): every write fails. During that time no produce may be
    answered with success; a produce whose timeout passes gets REQUEST_TIMED_OUT.
    Once the table path is restored, the retried write lands every record, once.
    """
    server = started.server
    data_dir = server.data_dir
    log = LogCursor(server)
    client = rc.RawClient(server.host, server.port, timeout_s=60)
    client.send(rc.frame(rc.metadata(FAIL_TOPIC), 1))
    client.read_response()
    client.send(rc.frame(rc.produce(FAIL_TOPIC, [b"before"]), 2))
    cid, body = client.read_response()
    assert cid == 2 and partition_response(body).error_code == 0

    records = data_dir / "tables" / "records"
    moved = data_dir / "tables" / "records-away"
    os.rename(records, moved)
    records.write_bytes(b"not a directory")  # every Spark write now fails
    try:
        client.send(rc.frame(rc.produce(FAIL_TOPIC, [b"during-1", b"during-2"]), 3))
        client.send(rc.frame(rc.produce(FAIL_TOPIC, [b"during-3"], timeout_ms=2_000), 4))
        client.sock.settimeout(6)
        with pytest.raises(socket.timeout):
            client.read_response()  # nothing may be acknowledged while Spark fails
    finally:
        records.unlink()
        os.rename(moved, records)
    client.sock.settimeout(90)
    answers = dict(client.read_response() for _ in range(2))
    # responses keep request order: 3 (waited for the retry) comes before 4
    first = partition_response(answers[3])
    assert first.error_code == 0, "acknowledged after the retried write committed"
    # request 4 asked for a 2 s timeout: it was answered REQUEST_TIMED_OUT, never success
    assert partition_response(answers[4]).error_code == REQUEST_TIMED_OUT
    client.close()
    # the failure was logged and retried: at the write, or before it where the table's files are staged
    text = log.text()
    assert "Spark flush of" in text or "preparing the flush of" in text, text[-2000:]

    # the timed-out request's record is durable in the WAL and lands too (it was
    # never acknowledged, so a client retry could add it again; this one did not retry)
    wait_committed(server, {(FAIL_TOPIC, 0): 4})
    rows = read_table(data_dir, f"SELECT value, offset FROM records WHERE topic = '{FAIL_TOPIC}'")
    values = sorted(bytes(r["value"]) for r in rows)
    assert values == [b"before", b"during-1", b"during-2", b"during-3"]
    offsets = sorted(r["offset"] for r in rows)
    assert offsets == [0, 1, 2, 3]
    assert first.base_offset == 1
    assert server.running


def test_readyz_says_503_from_sigterm_on(started):
    """Last in the module: stops the server.

    The signal is taken by the server's event loop a moment after it is sent,
    so the first answers may still be 200; from the first 503 on, never 200 again.
    """
    server = started.server
    assert get(f"{started.base}/readyz")[0] == 200
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    answers = []
    while server.running:
        try:
            answers.append(get(f"{started.base}/readyz", timeout_s=2.0))
        except (OSError, http.client.HTTPException):  # the endpoint is closing: the process is ending
            break
        time.sleep(0.02)
    code = server.proc.wait(120)
    server.kill()  # reaps what is left of its process group (a second SIGTERM would stop it at once)
    assert code == 0, server.log_text()
    first_503 = next((i for i, (status, _) in enumerate(answers) if status == 503), None)
    assert first_503 is not None and first_503 <= 50, answers  # taken within a second or so
    stopping = answers[first_503:]
    assert all(status == 503 for status, _ in stopping), answers
    assert {body.strip() for _, body in stopping} <= {"shutting down", "stopping"}
