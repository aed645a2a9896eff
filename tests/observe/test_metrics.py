"""pipeline.observe.metrics without Spark: HdrHistogram -> Prometheus buckets, Kafka names, and the
/metrics, /healthz, /readyz endpoint on a real 127.0.0.1 socket through start-up phases."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from hdrh.histogram import HdrHistogram
from prometheus_client.parser import text_string_to_metric_families

from pipeline.observe.metrics import (
    LATENCY_BUCKETS_MS,
    MetricsEndpoint,
    Phase,
    _Monotonic,
    hdr_buckets,
    kafka_api_name,
    kafka_error_name,
)
from pipeline.persist.persister import latency_histogram
from pipeline.config import ServerConfig
from pipeline.server import Server


def as_dict(buckets: list[tuple[str, float]]) -> dict[str, float]:
    return dict(buckets)


def test_hdr_buckets_are_exact_below_2048():
    h = latency_histogram()
    for value in (1, 2, 2, 5, 6, 100, 2047):
        h.record_value(value)
    buckets, total = hdr_buckets(h, LATENCY_BUCKETS_MS)
    b = as_dict(buckets)
    assert b["1.0"] == 1 and b["2.0"] == 3 and b["5.0"] == 4 and b["10.0"] == 5
    assert b["100.0"] == 6 and b["1000.0"] == 6 and b["2500.0"] == 7
    assert buckets[-1] == ("+Inf", 7)
    assert total == 1 + 2 + 2 + 5 + 6 + 100 + 2047
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)  # cumulative


def test_hdr_buckets_above_2048_never_report_less_than_was_recorded():
    """Above 2047 ms a sub-bucket holds several values (3 significant digits):
    it counts under the first bound at or above the highest of them."""
    h = latency_histogram()
    h.record_value(4999)   # sub-bucket 4996..4999: under 5000
    h.record_value(5000)   # sub-bucket 5000..5003: above 5000, under 10000
    h.record_value(400_000)  # past the last bound
    buckets, total = hdr_buckets(h, LATENCY_BUCKETS_MS)
    b = as_dict(buckets)
    assert b["2500.0"] == 0 and b["5000.0"] == 1 and b["10000.0"] == 2 and b["300000.0"] == 2
    assert b["+Inf"] == 3
    assert total == pytest.approx(4999 + 5000 + 400_000, rel=1e-3)


def test_hdr_buckets_of_an_empty_histogram():
    buckets, total = hdr_buckets(HdrHistogram(1, 3_600_000, 3), (1.0, 10.0))
    assert buckets == [("1.0", 0), ("10.0", 0), ("+Inf", 0)] and total == 0


@pytest.mark.parametrize("api_key, name", [(0, "Produce"), (3, "Metadata"), (18, "ApiVersions"),
                                           (22, "InitProducerId"), (10, "FindCoordinator"), (9999, "Unknown")])
def test_api_names_are_kafkas(api_key, name):
    assert kafka_api_name(api_key) == name


@pytest.mark.parametrize("code, name", [(0, "NONE"), (3, "UNKNOWN_TOPIC_OR_PARTITION"), (7, "REQUEST_TIMED_OUT"),
                                        (87, "INVALID_RECORD"), (-1, "UNKNOWN_SERVER_ERROR"), (31999, "UNKNOWN_31999")])
def test_error_names_are_kafkas(code, name):
    assert kafka_error_name(code) == name


def test_exported_counters_never_go_down():
    monotonic = _Monotonic()
    assert monotonic("idle", 1.0) == 1.0
    assert monotonic("idle", 0.999999) == 1.0  # a racing read came out a hair low
    assert monotonic("idle", 2.5) == 2.5
    assert monotonic("other", 0.1) == 0.1


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str) -> dict[str, float]:
    _, text = get(url)
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_endpoint_answers_health_and_readiness_through_the_phases(tmp_path):
    endpoint = MetricsEndpoint()
    port = endpoint.start(0)
    base = f"http://127.0.0.1:{port}"
    try:
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert get(f"{base}/readyz") == (503, "starting Spark\n")
        assert scrape(f"{base}/metrics") == {"pipeline_ready": 0.0, "pipeline_table_ready": 0.0}  # no server yet

        server = Server(ServerConfig(data_dir=tmp_path, queued_max_request_bytes=1 << 20), sink=None)  # type: ignore[arg-type]
        endpoint.attach(server)
        endpoint.set_phase(Phase.RECOVERING)
        assert get(f"{base}/readyz") == (503, "recovering from the write-ahead log\n")
        metrics = scrape(f"{base}/metrics")
        assert metrics["kafka_network_socketserver_memorypoolavailable"] == 1 << 20
        assert metrics["kafka_network_socketserver_memorypoolused"] == 0
        assert metrics["pipeline_wal_size_bytes"] == 0

        endpoint.set_phase(Phase.STARTING_LISTENER)
        assert get(f"{base}/readyz")[0] == 503
        endpoint.set_phase(Phase.SERVING)
        endpoint.set_table_ready(False)  # --ack-on wal: listening while Spark starts
        status, body = get(f"{base}/readyz")
        assert status == 200 and body.startswith("ready: produce is acknowledged at the WAL; the table side is "
                                                 "starting Spark"), body
        assert scrape(f"{base}/metrics")["pipeline_table_ready"] == 0.0
        endpoint.set_table_ready(True)
        assert get(f"{base}/readyz") == (200, "ready\n")
        assert scrape(f"{base}/metrics")["pipeline_ready"] == 1.0
        assert scrape(f"{base}/metrics")["pipeline_table_ready"] == 1.0
        assert get(f"{base}/healthz") == (200, "ok\n")

        server.shutdown()
        assert get(f"{base}/readyz") == (503, "shutting down\n")
        assert scrape(f"{base}/metrics")["pipeline_ready"] == 0.0
        endpoint.set_phase(Phase.STOPPING)
        assert get(f"{base}/readyz") == (503, "stopping\n")
        assert get(f"{base}/healthz") == (200, "ok\n")
    finally:
        endpoint.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/healthz", timeout=2)


def test_endpoint_listens_on_loopback_only():
    endpoint = MetricsEndpoint()
    try:
        endpoint.start(0)
        assert endpoint._httpd is not None and endpoint._httpd.server_address[0] == "127.0.0.1"
    finally:
        endpoint.close()


def test_the_native_stages_counters_are_exported():
    """``pipeline_native_stage_items_total{stage, path}`` for every stage of ``pipeline.native``: the C
    path's count and the Python path's, as the seam counted them."""
    from prometheus_client import generate_latest

    from pipeline import native
    from pipeline.observe.metrics import Readiness, ServerCollector

    registry = CollectorRegistry()
    registry.register(ServerCollector(Readiness()))
    native.FRAME_CUT.native += 3
    native.FRAME_CUT.python += 1
    samples = {(s.labels["stage"], s.labels["path"]): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples if s.name == "pipeline_native_stage_items_total"}
    assert {stage for stage, _ in samples} == {s.name.replace(" ", "_") for s in native.STAGES}
    assert samples["frame_cut", "native"] >= 3 and samples["frame_cut", "python"] >= 1
