"""Watching a running broker: its log lines, its metrics, and ``pipeline top``.

* ``structured_logs``: one log line per event, plain or JSON, with the request's ids.
* ``metrics``: the Prometheus endpoint (Kafka's metric names) and readiness.
* ``top``: ``pipeline top``, a terminal view of the metrics endpoint.
"""
