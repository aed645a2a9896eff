"""pipeline top's arithmetic and rendering on scrapes written by hand (the live ones are in tests/e2e/test_metrics.py)."""

from __future__ import annotations

import math

import pytest
from rich.console import Console

from pipeline.observe.top import histogram_quantile, parse_metrics, render

INF = math.inf


@pytest.mark.parametrize("q, expected", [(0.5, 2.0), (0.75, 3.0), (0.25, 1.5), (1.0, 4.0)])
def test_histogram_quantile_interpolates_as_prometheus(q, expected):
    buckets = [(1.0, 0.0), (2.0, 10.0), (4.0, 20.0), (INF, 20.0)]
    assert histogram_quantile(q, buckets) == pytest.approx(expected)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]) is None
    # a rank in the +Inf bucket: the highest finite bound, as histogram_quantile() answers
    assert histogram_quantile(0.99, [(1.0, 1.0), (10.0, 2.0), (INF, 100.0)]) == 10.0
    # the lowest bucket starts at 0
    assert histogram_quantile(0.5, [(10.0, 4.0), (INF, 4.0)]) == pytest.approx(5.0)


def exposition(requests: int, errors: int, idle: float, messages: int, total_le_10: int) -> str:
    """A /metrics text with the families top reads (as the server writes them)."""
    return f"""
# TYPE pipeline_ready gauge
pipeline_ready 1.0
# TYPE kafka_network_requestmetrics_requests counter
kafka_network_requestmetrics_requests_total{{request="Produce",version="9"}} {requests}
# TYPE kafka_network_requestmetrics_errors counter
kafka_network_requestmetrics_errors_total{{request="Produce",error="NONE"}} {requests - errors}
kafka_network_requestmetrics_errors_total{{request="Produce",error="UNKNOWN_TOPIC_OR_PARTITION"}} {errors}
# TYPE kafka_network_requestmetrics_totaltimems histogram
kafka_network_requestmetrics_totaltimems_bucket{{request="Produce",le="1.0"}} 0
kafka_network_requestmetrics_totaltimems_bucket{{request="Produce",le="10.0"}} {total_le_10}
kafka_network_requestmetrics_totaltimems_bucket{{request="Produce",le="100.0"}} {requests}
kafka_network_requestmetrics_totaltimems_bucket{{request="Produce",le="+Inf"}} {requests}
kafka_network_requestmetrics_totaltimems_count{{request="Produce"}} {requests}
kafka_network_requestmetrics_totaltimems_sum{{request="Produce"}} 1.0
# TYPE kafka_network_requestchannel_requestqueuesize gauge
kafka_network_requestchannel_requestqueuesize{{queue="0"}} 3.0
kafka_network_requestchannel_requestqueuesize{{queue="1"}} 7.0
# TYPE kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent counter
kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent_total {idle}
# TYPE kafka_server_socket_server_metrics_connection_count gauge
kafka_server_socket_server_metrics_connection_count{{listener="PLAINTEXT",networkProcessor="0"}} 2.0
kafka_server_socket_server_metrics_connection_count{{listener="PLAINTEXT",networkProcessor="1"}} 1.0
# TYPE kafka_server_brokertopicmetrics_messagesin counter
kafka_server_brokertopicmetrics_messagesin_total{{topic="orders"}} {messages}
# TYPE kafka_server_brokertopicmetrics_bytesin counter
kafka_server_brokertopicmetrics_bytesin_total{{topic="orders"}} {messages * 100}
"""


def text_of(renderable) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_render_shows_rates_over_the_interval_and_percentiles_of_the_interval():
    before = parse_metrics(exposition(requests=100, errors=0, idle=1.0, messages=1000, total_le_10=100), at=50.0)
    after = parse_metrics(exposition(requests=300, errors=4, idle=2.8, messages=5000, total_le_10=100), at=52.0)
    text = text_of(render(after, before, source="http://127.0.0.1:1/metrics"))
    assert "http://127.0.0.1:1/metrics" in text and "ready" in text and "window: 2.0 s" in text
    produce = next(line for line in text.splitlines() if "Produce" in line)
    cells = [c.strip() for c in produce.split("│") if c.strip()]
    assert cells[:3] == ["Produce", "100", "4"]  # 200 requests in 2 s; 4 errors in the interval
    # the interval's 200 requests all took 10..100 ms: p50 55 ms, p99 99.1 ms (not the 100 before, all under 10 ms)
    assert cells[-1] == "55.0ms / 99.1ms"
    assert "handler idle" in text and "90%" in text  # 1.8 s idle in 2 s
    assert "queue 0" in text and "queue 1" in text
    orders = next(line for line in text.splitlines() if "orders" in line)
    assert "2.0k" in orders and "195.3 KiB/s" in orders  # 4000 messages, 400000 bytes in 2 s
    assert "processor 0" in text and "processor 1" in text


def test_render_of_a_single_scrape_has_no_rates_but_latencies_since_start():
    only = parse_metrics(exposition(requests=100, errors=0, idle=1.0, messages=1000, total_le_10=100), at=1.0)
    text = text_of(render(only))
    assert "since start (one scrape)" in text
    produce = next(line for line in text.splitlines() if "Produce" in line)
    assert "100 total" in produce
    assert "5.5ms / 9.9ms" in produce  # all 100 under 10 ms


def test_render_of_an_empty_scrape_does_not_fail():
    text = text_of(render(parse_metrics("", at=0.0)))
    assert "pipeline top" in text and "no pipeline_ready metric" in text


def test_top_once_against_nothing_listening_exits_1(capsys):
    import socket

    from pipeline.observe.top import run

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert run(f"http://127.0.0.1:{port}/metrics", 0.0, once=True) == 1
    assert "cannot scrape" in capsys.readouterr().out
