"""Prometheus metrics named after Kafka's, and the health endpoints, on one HTTP port.

``--metrics-port`` serves, on 127.0.0.1 only, from prometheus-client's HTTP
threads:

* ``/metrics``: the Prometheus text format. Metrics that Kafka has are named
  as the Prometheus JMX exporter's standard Kafka rules
  (``example_configs/kafka-2_0_0.yml``, ``lowercaseOutputName: true``) name
  Kafka's MBeans, so dashboards built on a Kafka broker translate:
  ``kafka.network:type=RequestMetrics,name=TotalTimeMs,request=Produce`` is
  ``kafka_network_requestmetrics_totaltimems{request="Produce"}``, a meter
  ``...name=RequestsPerSec,request=Produce,version=9`` is the counter
  ``kafka_network_requestmetrics_requests_total{request="Produce",version="9"}``.
  Where the exporter would turn a Kafka histogram into quantile gauges, this
  is a real Prometheus histogram of the same name (``_bucket``, ``_sum``,
  ``_count``; use ``histogram_quantile``). What Kafka does not have (the WAL
  besides its fsync time, Spark flushes, acknowledgement-to-queryable lag,
  mute reasons) is named ``pipeline_*``. The whole table, with units and
  meanings, is in docs/operations.md ("Metrics").
* ``/healthz``: 200 while the process answers.
* ``/readyz``: 200 once recovery is done and the listener accepts (with
  ``--ack-on wal`` that is before Spark is up: the body then says the table
  side is starting; with ``--ack-on spark`` Spark starts first); 503 with the
  phase before that and while shutting down.

The endpoint starts before Spark (``MetricsEndpoint.start``) so that a probe
can see start-up; the server's metrics appear once it is ``attach``ed.

Nothing here runs per request: the collector reads, at scrape time, plain
counters, bucket lists and HdrHistograms that the trio side keeps anyway
(``pipeline.network.request_metrics``, ``HandlerStats``, ``PersisterStats``), copying
each under the GIL so a scrape sees every histogram whole.
"""

from __future__ import annotations

import enum
import logging
import threading
from bisect import bisect_left
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, make_server

import numpy as np
from hdrh.histogram import HdrHistogram
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.utils import floatToGoString

from pipeline import native
from pipeline.network.connection_state import MuteReason
from pipeline.network.request_metrics import BUCKET_BOUNDS_MS, STAGES

if TYPE_CHECKING:
    from pipeline.server import Server

log = logging.getLogger(__name__)

LISTENER = "PLAINTEXT"
"""The ``listener`` label of the connection metrics: Kafka's name of a plaintext listener (the only one here)."""

LATENCY_BUCKETS_MS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0,
                      10000.0, 30000.0, 60000.0, 300000.0)
"""Bucket bounds (ms) for the persister's HdrHistograms (WAL fsync, flush, queryable lag).

They record whole milliseconds, at least 1 (``PersisterStats``), so nothing finer than 1 ms.
"""


# -------------------------------------------------------------------- names


def kafka_api_name(api_key: int) -> str:
    """Kafka's name of an api (``ApiKeys.name``): 0 -> "Produce", 18 -> "ApiVersions"; "Unknown" if none."""
    return "".join(part.capitalize() for part in api_key_map.get(api_key, "unknown").split("_"))


def kafka_error_name(code: int) -> str:
    """Kafka's name of an error code (``Errors.name``): 0 -> "NONE", 3 -> "UNKNOWN_TOPIC_OR_PARTITION"."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_{code}"


# ------------------------------------------------------------- histograms


def _cumulative(per_bucket: Sequence[int], bounds: Sequence[float]) -> list[tuple[str, float]]:
    """Prometheus ``(le, cumulative count)`` pairs from per-bucket counts (last one: +Inf)."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, float("inf")), per_bucket):
        running += count
        out.append((floatToGoString(bound), running))
    return out


def hdr_buckets(histogram: HdrHistogram, bounds: Sequence[float]) -> tuple[list[tuple[str, float]], float]:
    """An HdrHistogram as Prometheus histogram buckets: ``([(le, cumulative count), ..., ("+Inf", n)], sum)``.

    A snapshot of the histogram's counts is taken first (one array copy), so
    the buckets add up to the +Inf count even while the trio side records.
    Each HdrHistogram sub-bucket counts under the first bound at or above its
    highest equivalent value: exact below 2048 (the histograms keep 3
    significant digits, so every whole millisecond up to 2047 has its own
    sub-bucket), and never lower than what was recorded above that, as
    HdrHistogram's own percentiles. The sum is each sub-bucket's count times
    its middle value (exact below 2048).

    Args:
        histogram: any HdrHistogram.
        bounds: ascending bucket upper bounds, in the histogram's unit.
    """
    counts = np.ctypeslib.as_array(histogram.counts).copy()
    per_bucket = [0] * (len(bounds) + 1)
    total = 0.0
    for index in np.flatnonzero(counts).tolist():
        count = int(counts[index])
        lowest = histogram.get_value_from_index(index)
        highest = histogram.get_highest_equivalent_value(lowest)
        per_bucket[bisect_left(bounds, highest)] += count
        total += count * (lowest + highest) / 2
    return _cumulative(per_bucket, bounds), total


# -------------------------------------------------------------- readiness


class Phase(enum.Enum):
    """Where the process is, for ``/readyz``."""

    STARTING_SPARK = "starting Spark"
    RECOVERING = "recovering from the write-ahead log"
    STARTING_LISTENER = "starting the listener"
    SERVING = "serving"
    STOPPING = "stopping"


class Readiness:
    """The process's phase, set by ``pipeline serve`` as start-up goes on; read by ``/readyz``.

    Ready only in ``Phase.SERVING`` and while the attached server is not
    shutting down.
    """

    def __init__(self) -> None:
        self.phase = Phase.STARTING_SPARK
        self.server: Server | None = None
        self.table_ready = True
        """The table side (Spark) is up; False while it starts beside a serving listener (``--ack-on wal``)."""

    def status(self) -> tuple[bool, str]:
        """(ready, what it is doing)."""
        phase = self.phase
        if phase is Phase.SERVING:
            server = self.server
            if server is not None and server.shutting_down:
                return False, "shutting down"
            if not self.table_ready:
                return True, ("ready: produce is acknowledged at the WAL; the table side is starting Spark "
                              "(table writes and reads of offsets only the table holds wait for it)")
            return True, "ready"
        return False, phase.value


# -------------------------------------------------------------- collector


class _Monotonic:
    """Counters read from another thread without a lock may race an update by
    microseconds (handler idle time); Prometheus takes any decrease for a
    restart, so each exported counter is held at its highest value so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._highest: dict[str, float] = {}

    def __call__(self, name: str, value: float) -> float:
        with self._lock:
            value = max(value, self._highest.get(name, value))
            self._highest[name] = value
            return value


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


class ServerCollector:
    """Turns the live state of the attached Server into metric families (see docs/operations.md)."""

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness
        self._monotonic = _Monotonic()

    def collect(self) -> Iterator[Metric]:
        ready, _ = self._readiness.status()
        yield GaugeMetricFamily("pipeline_ready", "1 when /readyz answers 200 (recovery done, listener "
                                "accepting, not shutting down), else 0", value=int(ready))
        yield GaugeMetricFamily("pipeline_table_ready", "1 once the table side (Spark) is up and writing, "
                                "else 0", value=int(self._readiness.table_ready and ready))
        yield self._native_stages()
        server = self._readiness.server
        if server is None:
            return
        yield from self._request_metrics(server)
        yield from self._network(server)
        yield from self._topics(server)
        yield from self._persistence(server)

    def _native_stages(self) -> Metric:
        """``pipeline.native``'s counters: a ``python`` path growing on plain produce traffic (multi-queue)
        says the C fast path is off."""
        items = CounterMetricFamily("pipeline_native_stage_items",
                                    "Items of each stage with a C path, by the path that handled them: native "
                                    "(C) or python (declined by the C, taken by the Python path)",
                                    labels=["stage", "path"])
        for name, (c, py) in native.counts().items():
            stage = name.replace(" ", "_")
            items.add_metric([stage, "native"], self._monotonic(f"native {name}", c))
            items.add_metric([stage, "python"], self._monotonic(f"python {name}", py))
        return items

    # Kafka RequestMetrics, RequestChannel, KafkaRequestHandlerPool
    def _request_metrics(self, s: Server) -> Iterator[Metric]:
        if s.request_channel is None:
            return
        stages = [HistogramMetricFamily(f"kafka_network_requestmetrics_{stage.lower()}",
                                        f"Kafka RequestMetrics {stage}: {_STAGE_HELP[stage]} (ms)",
                                        labels=["request"]) for stage in STAGES]
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                       "Kafka RequestsPerSec: responses written (acks=0: their turn came), "
                                       "by api and api version", labels=["request", "version"])
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                     "Kafka ErrorsPerSec: error codes of complete responses, one per partition "
                                     "(Produce) or topic (Metadata); NONE counts successes", labels=["request", "error"])
        for api_key, m in sorted(list(s.request_channel.metrics.apis.items())):
            if not m.requests and not m.errors:
                # an api not called yet (its services made its error counts up front): its
                # series appear with its first request; six empty histograms per api were most
                # of a scrape (25 ms of the server's CPU each, scraped every 0.2 s by the benches)
                continue
            name = kafka_api_name(api_key)
            for family, buckets, total in zip(stages, [list(b) for b in m.buckets], list(m.sums_ms)):
                family.add_metric([name], _cumulative(buckets, BUCKET_BOUNDS_MS), total)
            for version, count in sorted(dict(m.requests).items()):
                requests.add_metric([name, str(version)], count)
            for code, count in sorted(dict(m.errors).items()):
                errors.add_metric([name, kafka_error_name(code)], count)
        yield from stages
        yield requests
        yield errors
        depth = GaugeMetricFamily("kafka_network_requestchannel_requestqueuesize",
                                  "Kafka RequestQueueSize: requests waiting in each RequestChannel queue "
                                  "(multiqueue: one per handler; baseline: queue 0)", labels=["queue"])
        for i, d in enumerate(s.request_channel.queue_depths()):
            depth.add_metric([str(i)], d)
        yield depth
        handlers = list(s.handlers)
        if handlers:
            idle = sum(h.idle_seconds for h in handlers) / len(handlers)
            name = "kafka_server_kafkarequesthandlerpool_requesthandleravgidlepercent"
            yield _counter(name, "Kafka RequestHandlerAvgIdlePercent (a meter): seconds the RequestHandlers "
                           "waited for work, averaged over handlers; rate() is the idle fraction 0..1",
                           self._monotonic(name, idle))

    # Kafka SocketServer, socket-server-metrics; mute states; connection quotas
    def _network(self, s: Server) -> Iterator[Metric]:
        name = "kafka_network_socketserver_networkprocessoravgidlepercent"
        yield _counter(name, "Kafka NetworkProcessorAvgIdlePercent: seconds the network threads (all Processors "
                       "share the trio event loop) waited for I/O; rate() is the idle fraction 0..1",
                       self._monotonic(name, s.io_wait.wait_seconds))
        labels = ["listener", "networkProcessor"]
        count = GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count",
                                  "Kafka socket-server-metrics connection-count: open connections per Processor",
                                  labels=labels)
        created = CounterMetricFamily("kafka_server_socket_server_metrics_connection_creation",
                                      "Kafka connection-creation-total: connections a Processor took up",
                                      labels=labels)
        closed = CounterMetricFamily("kafka_server_socket_server_metrics_connection_close",
                                     "Kafka connection-close-total: connections a Processor closed", labels=labels)
        auth_labels = ["listener"]
        succeeded = CounterMetricFamily("kafka_server_socket_server_metrics_successful_authentication",
                                        "Kafka successful-authentication-total: SASL exchanges completed (SASL_*) "
                                        "and TLS handshakes completed (SSL), per listener", labels=auth_labels)
        failed = CounterMetricFamily("kafka_server_socket_server_metrics_failed_authentication",
                                     "Kafka failed-authentication-total: SASL exchanges failed and TLS handshakes "
                                     "failed or timed out, per listener", labels=auth_labels)
        listeners = [name for name, _protocol, _host, _port in getattr(s, "listener_addresses", ())] or [LISTENER]
        good: Counter[str] = Counter()
        bad: Counter[str] = Counter()
        muted: Counter[str] = Counter()  # MuteReason value -> connections
        for p in list(s.processors):
            channels = list(p.channels)
            open_by_listener = Counter(ch.listener for ch in channels)
            for listener in sorted(set(listeners) | set(p.connections_created)):
                ids = [listener, str(p.processor_id)]
                count.add_metric(ids, open_by_listener[listener])
                created.add_metric(ids, p.connections_created[listener])
                closed.add_metric(ids, p.connections_closed[listener])
            good.update(p.successful_authentications)
            bad.update(p.failed_authentications)
            for ch in channels:
                reason = ch.state.mute_reason
                if reason is not None:
                    muted[reason.value] += 1
        sasl = getattr(s, "sasl_apis", None)
        if sasl is not None:
            good.update(sasl.successful_by_listener)
            bad.update(sasl.failed_by_listener)
        for listener in sorted(set(listeners) | set(good) | set(bad)):
            succeeded.add_metric([listener], good[listener])
            failed.add_metric([listener], bad[listener])
        yield count
        yield created
        yield closed
        yield succeeded
        yield failed
        mute = GaugeMetricFamily("pipeline_muted_channels", "Connections not being read now, by mute reason "
                                 "(Kafka KafkaChannel mute states, by cause)", labels=["reason"])
        for reason in MuteReason:
            mute.add_metric([reason.value], muted[reason.value])
        yield mute
        pool = s.memory_pool
        available = pool.available
        yield GaugeMetricFamily("kafka_network_socketserver_memorypoolavailable",
                                "Kafka MemoryPoolAvailable: MemoryPool bytes free for received requests "
                                "(queued.max.request.bytes)", value=available)
        yield GaugeMetricFamily("kafka_network_socketserver_memorypoolused",
                                "Kafka MemoryPoolUsed: MemoryPool bytes held by requests being received, "
                                "queued or handled", value=pool.capacity - available)
        q = s.quotas
        rejected = CounterMetricFamily("pipeline_connections_rejected",
                                       "Connections closed at accept, by the limit they were over",
                                       labels=["limit"])
        for limit in ("max.connections", "max.connections.per.ip"):
            rejected.add_metric([limit], q.rejected[limit])
        yield rejected

    # Kafka BrokerTopicMetrics
    def _topics(self, s: Server) -> Iterator[Metric]:
        if s.apis is None:
            return
        st = s.apis.stats
        bytes_in = CounterMetricFamily("kafka_server_brokertopicmetrics_bytesin",
                                       "Kafka BytesInPerSec: RecordBatch bytes appended (as sent), per topic",
                                       labels=["topic"])
        messages_in = CounterMetricFamily("kafka_server_brokertopicmetrics_messagesin",
                                          "Kafka MessagesInPerSec: records appended, per topic", labels=["topic"])
        for topic, value in sorted(dict(st.bytes_in).items()):
            bytes_in.add_metric([topic], value)
        for topic, value in sorted(dict(st.messages_in).items()):
            messages_in.add_metric([topic], value)
        yield bytes_in
        yield messages_in
        logs = s.logs
        bytes_out = CounterMetricFamily("kafka_server_brokertopicmetrics_bytesout",
                                        "Kafka BytesOutPerSec: RecordBatch bytes served to consumers, per topic",
                                        labels=["topic"])
        for topic, value in sorted(dict(logs.stats.bytes_out).items()):
            bytes_out.add_metric([topic], value)
        yield bytes_out
        reads = CounterMetricFamily("pipeline_fetch_reads", "Partition reads of Fetch requests that returned "
                                    "records, by where they came from (wal: retained WAL segments; table: "
                                    "the Spark tables, for offsets retention removed from the WAL)",
                                    labels=["source"])
        read_bytes = CounterMetricFamily("pipeline_fetch_read_bytes", "Bytes of those reads, by source",
                                         labels=["source"])
        st_reads = logs.stats
        reads.add_metric(["wal"], st_reads.wal_reads)
        reads.add_metric(["table"], st_reads.table_reads)
        read_bytes.add_metric(["wal"], st_reads.wal_bytes)
        read_bytes.add_metric(["table"], st_reads.table_bytes)
        yield reads
        yield read_bytes
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Kafka PurgatorySize: fetches waiting for appends (fetch.max.wait.ms)",
                                      labels=["delayedOperation"])
        purgatory.add_metric(["Fetch"], logs.waiting_fetches)
        yield purgatory

    # Kafka LogFlushStats; the WAL and the Spark stage
    def _persistence(self, s: Server) -> Iterator[Metric]:
        yield GaugeMetricFamily("pipeline_wal_size_bytes", "Bytes of write-ahead log segment files on disk "
                                "(deleted once the table covers them and log.retention.ms/bytes allow)", value=s.wal.size_bytes)
        persister = s.persister
        if persister is None:
            return
        ps = persister.stats
        yield _histogram("kafka_log_logflushstats_logflushrateandtimems",
                         "Kafka LogFlushRateAndTimeMs: one write-ahead log group commit, append + fsync (ms); "
                         "_count is the number of fsyncs", ps.wal_write_ms)
        yield _counter("pipeline_wal_bytes", "Bytes appended to the write-ahead log", ps.wal_bytes)
        yield _histogram("pipeline_flush_time_ms", "One Spark flush: its append from first try to commit, "
                         "retries included (ms); _count is the number of flushes", ps.flush_ms)
        yield _counter("pipeline_flush_bytes", "Bytes of record batches flushed to the table (decompressed "
                       "size); divided by the flushes, the flush size", ps.flush_bytes)
        yield _counter("pipeline_flush_records", "Records written to the Spark table", ps.records)
        yield _counter("pipeline_flush_failures", "Failed Spark write attempts (each retried)", ps.failed_flushes)
        yield _counter("pipeline_table_lock_wait_seconds", "Time table commits waited for the tables' lock shared "
                       "with the other brokers of a cluster (s)", ps.table_lock_wait_seconds)
        yield _counter("pipeline_table_commit_seconds", "Time table commits held the tables' lock, fencing check "
                       "and recorded ends included (s); summed over a cluster's brokers, above the "
                       "elapsed time only if their commits overlapped", ps.table_commit_seconds)
        yield GaugeMetricFamily("pipeline_buffered_records", "Records in the persister: waiting for or in a "
                                "WAL write, or waiting for or in a Spark flush", value=persister.buffered_records)
        yield GaugeMetricFamily("pipeline_buffered_bytes", "Bytes in the persister (buffer.memory counts "
                                "them)", value=persister.buffered_bytes)
        yield _histogram("pipeline_queryable_lag_ms", "Per produce request, from its acknowledgement (ack-on "
                         "wal; its WAL write with ack-on spark) to the Spark commit that made its records "
                         "queryable (ms)", ps.queryable_lag_ms)
        yield _histogram("pipeline_live_visible_lag_ms", "Per group of non-transactional records, from its "
                         "acknowledgement to its visibility through the live view pipeline.records_live "
                         "(ms; 1: at once, the view being published)", ps.live_lag_ms)


_STAGE_HELP = {
    "RequestQueueTimeMs": "from read whole by a Processor to taken by a RequestHandler",
    "LocalTimeMs": "handled by the RequestHandler (validated, sequenced, handed to the persister)",
    "RemoteTimeMs": "waiting for durability (WAL fsync, or the Spark commit with --ack-on spark)",
    "ResponseQueueTimeMs": "from response complete to taken by the connection's writer (in request order)",
    "ResponseSendTimeMs": "writing the response to the socket",
    "TotalTimeMs": "from read to response written",
}


def _histogram(name: str, documentation: str, histogram: HdrHistogram) -> HistogramMetricFamily:
    buckets, total = hdr_buckets(histogram, LATENCY_BUCKETS_MS)
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


# ---------------------------------------------------------------- endpoint


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape every few seconds is not news


class MetricsEndpoint:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, in daemon threads.

    Usage (``pipeline serve``)::

        endpoint = MetricsEndpoint()
        port = endpoint.start(9464)        # before Spark: /readyz says 503 "starting Spark"
        endpoint.set_phase(Phase.RECOVERING)
        endpoint.attach(server)            # the server's metrics from now on
        ...
        endpoint.close()

    Args:
        host: the address to listen on (127.0.0.1: never exposed beyond the machine).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.readiness = Readiness()
        self.port: int | None = None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ServerCollector(self.readiness))
        self._metrics_app = make_wsgi_app(registry)
        self._httpd: ThreadingWSGIServer | None = None

    def attach(self, server: Server) -> None:
        """Export ``server``'s metrics and let ``/readyz`` watch its shutdown."""
        self.readiness.server = server

    def set_phase(self, phase: Phase) -> None:
        """Where start-up or shutdown is now (``/readyz`` is ready only in ``Phase.SERVING``)."""
        self.readiness.phase = phase

    def set_table_ready(self, ready: bool) -> None:
        """Whether the table side (Spark) is up (``/readyz`` says what waits for it while it is not)."""
        self.readiness.table_ready = ready

    def start(self, port: int) -> int:
        """Listen on ``host:port`` (0: a free port) and serve in a daemon thread; returns the port.

        Raises:
            OSError: the port cannot be bound.
        """
        self._httpd = make_server(self.host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True).start()
        return self.port

    def close(self) -> None:
        """Stop serving (waits for the serving thread's loop to end). Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            ready, detail = self.readiness.status()
            return _text(start_response, "200 OK" if ready else "503 Service Unavailable", detail + "\n")
        return self._metrics_app(environ, start_response)


def _text(start_response: Callable, status: str, body: str) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]

