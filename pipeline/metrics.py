"""Prometheus metrics of a running server, read at scrape time.

``--metrics-port`` serves them at ``http://127.0.0.1:PORT/metrics`` (prometheus
text format) from prometheus-client's HTTP thread. The collector only reads
counters and queue statistics the trio side keeps anyway, so the request path
pays nothing per request for metrics.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline.network.connection_state import MuteReason

if TYPE_CHECKING:
    from pipeline.server import Server


class ServerCollector:
    """Turns a Server's live state into metric families."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        s = self._server
        if s.request_channel is not None:
            depth = GaugeMetricFamily("pipeline_request_queue_depth",
                                      "Requests waiting in each RequestChannel queue", labels=["queue"])
            for i, d in enumerate(s.request_channel.queue_depths()):
                depth.add_metric([str(i)], d)
            yield depth
        if s.apis is not None:
            st = s.apis.stats
            yield CounterMetricFamily("pipeline_requests", "Requests handled", value=st.requests)
            yield CounterMetricFamily("pipeline_produce_requests", "Produce requests handled",
                                      value=st.produce_requests)
            yield CounterMetricFamily("pipeline_records_appended", "Records sequenced and handed to the persister",
                                      value=st.records)
            yield CounterMetricFamily("pipeline_partition_errors", "Produce partitions answered with an error",
                                      value=st.partition_errors)
        if s.persister is not None:
            ps = s.persister.stats
            yield CounterMetricFamily("pipeline_wal_writes", "WAL group commits (one fsync each)",
                                      value=ps.wal_writes)
            yield CounterMetricFamily("pipeline_wal_bytes", "Bytes appended to the WAL", value=ps.wal_bytes)
            yield CounterMetricFamily("pipeline_wal_write_seconds", "Seconds spent in WAL append + fsync",
                                      value=ps.wal_seconds)
            yield CounterMetricFamily("pipeline_records_persisted", "Records written to the Spark table",
                                      value=ps.records)
            yield CounterMetricFamily("pipeline_flushes", "Successful flushes (one Spark write each)",
                                      value=ps.flushes)
            yield CounterMetricFamily("pipeline_flush_failures", "Failed Spark write attempts (retried)",
                                      value=ps.failed_flushes)
            yield CounterMetricFamily("pipeline_flush_write_seconds", "Seconds spent in flush writes",
                                      value=ps.write_seconds)
            yield GaugeMetricFamily("pipeline_buffered_bytes", "Bytes waiting for or in a flush",
                                    value=s.persister.buffered_bytes)
        yield GaugeMetricFamily("pipeline_connections", "Open client connections",
                                value=sum(len(p.channels) for p in s.processors))
        muted = GaugeMetricFamily("pipeline_muted_channels", "Connections not being read, by mute reason",
                                  labels=["reason"])
        reasons = Counter(ch.state.mute_reason.value for p in s.processors for ch in p.channels
                          if ch.state.mute_reason is not None)
        for reason in MuteReason:
            muted.add_metric([reason.value], reasons[reason.value])
        yield muted
        yield GaugeMetricFamily("pipeline_memory_pool_available_bytes",
                                "MemoryPool bytes free for received requests (queued.max.request.bytes)",
                                value=s.memory_pool.available)
        q = s.quotas
        yield CounterMetricFamily("pipeline_connections_created", "Connections admitted", value=q.created)
        yield CounterMetricFamily("pipeline_connections_closed", "Connections closed", value=q.closed)
        rejected = CounterMetricFamily("pipeline_connections_rejected",
                                       "Connections closed at accept, by the limit they were over",
                                       labels=["limit"])
        for limit in ("max.connections", "max.connections.per.ip"):
            rejected.add_metric([limit], q.rejected[limit])
        yield rejected


def serve_metrics(server: Server, port: int, host: str = "127.0.0.1") -> int:
    """Start the metrics HTTP endpoint in a daemon thread; returns the bound port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(server))
    httpd, _thread = start_http_server(port, addr=host, registry=registry)
    return httpd.server_address[1]
