"""``pipeline top``: a live terminal view of a running server, read only from its metrics endpoint.

Every ``--interval`` seconds it scrapes ``/metrics`` (the names of
docs/operations.md, "Metrics") and shows what changed since the previous
scrape: connections, request rate and per-stage latency by api, queue depth
per RequestChannel queue, handler and network-thread idle, WAL and flush
activity, acknowledgement-to-queryable lag, bytes and messages in per topic.
Rates and latency percentiles are over the interval between two scrapes (as
``rate()`` and ``histogram_quantile`` over a range would compute them); the
first screen, with one scrape only, shows latencies since the server started
and no rates.

``render`` is a pure function from parsed scrapes to a rich renderable, so
it is tested on a live scrape without a terminal; ``run`` is the loop.
"""

from __future__ import annotations

import math
import signal
import time
import urllib.request
from dataclasses import dataclass
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipeline.network.request_metrics import STAGES

Labels = tuple[tuple[str, str], ...]
"""A sample's labels, sorted by name."""

_STAGE_TITLES = {
    "RequestQueueTimeMs": "request queue",
    "LocalTimeMs": "local",
    "RemoteTimeMs": "remote (durable)",
    "ResponseQueueTimeMs": "response queue",
    "ResponseSendTimeMs": "send",
    "TotalTimeMs": "total",
}


@dataclass(frozen=True)
class Scrape:
    """One scrape of ``/metrics``.

    Attributes:
        at: ``time.monotonic()`` when it was taken (s).
        samples: sample name (with ``_total``, ``_bucket``... suffixes) ->
            labels -> value.
    """

    at: float
    samples: dict[str, dict[Labels, float]]

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of ``name`` as (labels, value), in label order."""
        return [(dict(labels), value) for labels, value in sorted(self.samples.get(name, {}).items())]

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels``; None if there are none."""
        values = [v for key, v in self.samples.get(name, {}).items() if labels.items() <= dict(key).items()]
        return sum(values) if values else None

    def label_values(self, name: str, label: str) -> list[str]:
        """The distinct values of ``label`` among the samples of ``name``, sorted."""
        return sorted({dict(key)[label] for key in self.samples.get(name, {}) if label in dict(key)})

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """Cumulative ``(le, count)`` pairs of histogram ``name`` (summed over other labels), by ``le``."""
        by_le: dict[float, float] = {}
        for key, value in self.samples.get(f"{name}_bucket", {}).items():
            d = dict(key)
            if labels.items() <= d.items():
                le = float(d["le"])
                by_le[le] = by_le.get(le, 0.0) + value
        return sorted(by_le.items())


def parse_metrics(text: str, at: float) -> Scrape:
    """Parse the Prometheus text format (prometheus-client's parser) into a Scrape taken at ``at``."""
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return Scrape(at, samples)


def scrape(url: str, timeout_s: float = 5.0) -> Scrape:
    """GET ``url`` and parse it.

    Raises:
        OSError: the endpoint did not answer (``urllib.error.URLError`` is one).
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    return parse_metrics(text, time.monotonic())


# ----------------------------------------------------------------- arithmetic


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile (0..1) of cumulative ``(le, count)`` buckets, as Prometheus computes it.

    Linear interpolation inside the bucket that holds the rank; the lowest
    bucket starts at 0; a rank in the +Inf bucket gives the highest finite
    bound. None when the buckets are empty.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def _delta_buckets(current: list[tuple[float, float]],
                   previous: list[tuple[float, float]] | None) -> list[tuple[float, float]]:
    if not previous:
        return current
    before = dict(previous)
    return [(le, count - before.get(le, 0.0)) for le, count in current]


class _Window:
    """Rates and interval histograms between two scrapes (or totals since start without a previous one)."""

    def __init__(self, current: Scrape, previous: Scrape | None) -> None:
        self.current = current
        self.previous = previous
        self.seconds = current.at - previous.at if previous is not None else None

    def rate(self, name: str, **labels: str) -> float | None:
        """Per second over the interval; None without a previous scrape."""
        now = self.current.value(name, **labels)
        if now is None or self.previous is None or not self.seconds or self.seconds <= 0:
            return None
        before = self.previous.value(name, **labels) or 0.0
        return max(0.0, now - before) / self.seconds

    def delta(self, name: str, **labels: str) -> float | None:
        """Increase over the interval (the total without a previous scrape)."""
        now = self.current.value(name, **labels)
        if now is None:
            return None
        if self.previous is None:
            return now
        return max(0.0, now - (self.previous.value(name, **labels) or 0.0))

    def quantiles(self, name: str, *qs: float, **labels: str) -> list[float | None]:
        """Quantiles of histogram ``name`` over the interval; since start if nothing was recorded in it."""
        current = self.current.buckets(name, **labels)
        previous = self.previous.buckets(name, **labels) if self.previous is not None else None
        window = _delta_buckets(current, previous)
        if not window or window[-1][1] <= 0:
            window = current
        return [histogram_quantile(q, window) for q in qs]


# ------------------------------------------------------------------ formatting


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}µs"
    if value < 1000:
        return f"{value:.1f}ms" if value < 100 else f"{value:.0f}ms"
    return f"{value / 1000:.2f}s"


def _pair(values: Iterable[float | None]) -> str:
    return " / ".join(_ms(v) for v in values)


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f}{suffix}{unit}"
    return f"{value:.0f}{unit}" if value == int(value) or abs(value) >= 10 else f"{value:.1f}{unit}"


def _bytes(value: float | None, per_second: bool = False) -> str:
    if value is None:
        return "-"
    suffix = "/s" if per_second else ""
    for factor, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(value) >= factor:
            return f"{value / factor:.1f} {unit}{suffix}"
    return f"{value:.0f} B{suffix}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * min(max(fraction, 0.0), 1.0):.0f}%"


def _key_values(title: str, rows: list[tuple[str, str]]) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(justify="right")
    for key, value in rows:
        table.add_row(key, value)
    return Panel(table, title=title, title_align="left")


# --------------------------------------------------------------------- render


def render(current: Scrape, previous: Scrape | None = None, *, source: str = "") -> RenderableType:
    """The ``pipeline top`` screen for ``current`` (rates since ``previous``, if given).

    Args:
        current: the latest scrape.
        previous: the one before it (None: no rates; latencies since start).
        source: what to name in the header (the metrics URL).
    """
    w = _Window(current, previous)
    c = current
    ready = c.value("pipeline_ready")
    state = "ready" if ready == 1 else ("not ready" if ready is not None else "no pipeline_ready metric")
    interval = f"{w.seconds:.1f} s" if w.seconds is not None else "since start (one scrape)"
    header = Text.assemble(("pipeline top", "bold"), f"  {source}  ", (state, "green" if ready == 1 else "red"),
                           f"  window: {interval}")

    # connections and the network side
    conn_rows = [
        ("open", _num(c.value("kafka_server_socket_server_metrics_connection_count"))),
        ("created/s", _num(w.rate("kafka_server_socket_server_metrics_connection_creation_total"))),
        ("closed/s", _num(w.rate("kafka_server_socket_server_metrics_connection_close_total"))),
        ("rejected", _num(c.value("pipeline_connections_rejected_total"))),
    ]
    for processor in c.label_values("kafka_server_socket_server_metrics_connection_count", "networkProcessor"):
        conn_rows.append((f"  processor {processor}", _num(c.value(
            "kafka_server_socket_server_metrics_connection_count", networkProcessor=processor))))
    for labels, value in c.series("pipeline_muted_channels"):
        conn_rows.append((f"muted: {labels.get('reason', '?')}", _num(value)))
    conn_rows.append(("memory pool free", _bytes(c.value("kafka_network_socketserver_memorypoolavailable"))))
    connections = _key_values("Connections", conn_rows)

    queue_rows = [(f"queue {labels.get('queue', '?')}", _num(value))
                  for labels, value in c.series("kafka_network_requestchannel_requestqueuesize")]
    queue_rows += [
        ("handler idle", _percent(w.rate("kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent_total"))),
        ("network idle", _percent(w.rate("kafka_network_socketserver_networkprocessoravgidlepercent_total"))),
    ]
    queues = _key_values("Queues and idle", queue_rows)

    # requests by api and stage
    requests = Table(title="Requests (latency p50 / p99 per stage)", title_justify="left", expand=False)
    requests.add_column("request", style="bold")
    requests.add_column("req/s", justify="right")
    requests.add_column("errors", justify="right")
    for stage in STAGES:
        requests.add_column(_STAGE_TITLES[stage], justify="right")
    for api in c.label_values("kafka_network_requestmetrics_requests_total", "request"):
        errors = sum((w.delta("kafka_network_requestmetrics_errors_total", request=api, error=e) or 0.0)
                     for e in c.label_values("kafka_network_requestmetrics_errors_total", "error") if e != "NONE")
        rate = w.rate("kafka_network_requestmetrics_requests_total", request=api)
        requests.add_row(api, _num(rate) if rate is not None else _num(
            c.value("kafka_network_requestmetrics_requests_total", request=api)) + " total", _num(errors),
            *(_pair(w.quantiles(f"kafka_network_requestmetrics_{stage.lower()}", 0.5, 0.99, request=api))
              for stage in STAGES))

    # persistence
    wal = "kafka_log_logflushstats_logflushrateandtimems"
    flushes = w.delta("pipeline_flush_time_ms_count")
    flushed = w.delta("pipeline_flush_bytes_total")
    persist_rows = [
        ("WAL fsyncs/s", _num(w.rate(f"{wal}_count"))),
        ("WAL written", _bytes(w.rate("pipeline_wal_bytes_total"), per_second=True)),
        ("WAL fsync p50 / p99", _pair(w.quantiles(wal, 0.5, 0.99))),
        ("WAL on disk", _bytes(c.value("pipeline_wal_size_bytes"))),
        ("flushes/s", _num(w.rate("pipeline_flush_time_ms_count"))),
        ("flush p50 / p99", _pair(w.quantiles("pipeline_flush_time_ms", 0.5, 0.99))),
        ("flush size (avg)", _bytes(flushed / flushes) if flushes and flushed is not None else "-"),
        ("records to table/s", _num(w.rate("pipeline_flush_records_total"))),
        ("flush failures", _num(c.value("pipeline_flush_failures_total"))),
        ("buffered", f"{_num(c.value('pipeline_buffered_records'))} records, "
                     f"{_bytes(c.value('pipeline_buffered_bytes'))}"),
        ("ack -> queryable p50 / p99", _pair(w.quantiles("pipeline_queryable_lag_ms", 0.5, 0.99))),
    ]
    persistence = _key_values("WAL and Spark flushes", persist_rows)

    topics = Table(title="Topics (in)", title_justify="left")
    topics.add_column("topic", style="bold")
    topics.add_column("messages/s", justify="right")
    topics.add_column("bytes/s", justify="right")
    topics.add_column("messages", justify="right")
    topics.add_column("bytes", justify="right")
    for topic in c.label_values("kafka_server_brokertopicmetrics_messagesin_total", "topic"):
        topics.add_row(topic, _num(w.rate("kafka_server_brokertopicmetrics_messagesin_total", topic=topic)),
                       _bytes(w.rate("kafka_server_brokertopicmetrics_bytesin_total", topic=topic), per_second=True),
                       _num(c.value("kafka_server_brokertopicmetrics_messagesin_total", topic=topic)),
                       _bytes(c.value("kafka_server_brokertopicmetrics_bytesin_total", topic=topic)))

    side = Table.grid(padding=(0, 1))
    side.add_row(connections, queues, persistence)
    return Group(header, side, requests, topics)


# ------------------------------------------------------------------------ run


def run(url: str, interval_s: float = 2.0, *, once: bool = False) -> int:
    """Show the view until Ctrl-C (``once``: two scrapes ``interval_s`` apart, printed once).

    Returns the exit status: 0, or 1 if ``once`` and the endpoint did not answer.
    """
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if once:
        try:
            first = scrape(url)
            time.sleep(interval_s)
            console.print(render(scrape(url), first, source=url))
        except OSError as exc:
            console.print(f"pipeline top: cannot scrape {url}: {exc}", style="red")
            return 1
        return 0
    previous: Scrape | None = None
    # Ctrl-C is how the live view ends, also when started where SIGINT is ignored (a background
    # job of a shell without job control inherits SIG_IGN, and Python then keeps it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Live(Text(f"scraping {url} ..."), console=console, auto_refresh=False, screen=False) as live:
            while True:
                try:
                    current = scrape(url)
                except OSError as exc:
                    live.update(Text(f"cannot scrape {url}: {exc} (retrying every {interval_s:g} s)", style="red"),
                                refresh=True)
                else:
                    live.update(render(current, previous, source=url), refresh=True)
                    previous = current
                time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
