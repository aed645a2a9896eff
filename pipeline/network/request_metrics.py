"""Per-request stage times, request and error counts, by api: Kafka's RequestMetrics, without I/O.

A request passes six stages on its way through the server, and Kafka
(``RequestChannel.Request.updateRequestMetrics``) times each of them per api:

=====================  =====================================================  ==========================
stage                  from -> to                                             here
=====================  =====================================================  ==========================
RequestQueueTimeMs     received -> a handler takes it                          Processor read -> RequestHandler
LocalTimeMs            taken -> the handler is done with it                    validate, sequence, hand to the persister
RemoteTimeMs           handler done -> response complete                       waiting for durability (WAL fsync or Spark commit)
ResponseQueueTimeMs    response complete -> taken by the network thread        ResponseSequencer (earlier responses first) -> writer
ResponseSendTimeMs     taken -> written to the socket                          the writer's ``send_all``
TotalTimeMs            received -> written                                     the sum of the above
=====================  =====================================================  ==========================

A response completed while its handler still holds the request (ApiVersions,
Metadata, InitProducerId, acks=0, errors) has no remote time: the local stage
ends when the response is complete, as in Kafka's ``Response`` constructor
(``apiLocalCompleteTimeNanos`` set to the response time when still unset).

``RequestMetrics.record`` is called once per response written (Kafka:
``updateRequestMetrics`` in the Processor after the send; RequestsPerSec is
marked there too, by api version). Errors are counted when a response is
complete, from what it answers for each partition or topic (Kafka:
``RequestChannel.updateErrorMetrics`` with ``AbstractResponse.errorCounts``).

Everything is plain integers and floats in preallocated lists: recording
is one C call (``pipeline._stages.record``: a bisect and two list updates per
stage), keeps no other state, and reads no clock (the times are arguments, seconds on any
monotonic clock). The metrics endpoint reads the lists at scrape time from
its own thread; each read is a copy taken under the GIL, so a scrape sees
every histogram whole (its buckets add up to its count).
"""

from __future__ import annotations

from typing import Final

from pipeline.native import record_stages

STAGES: Final = ("RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs",
                 "ResponseQueueTimeMs", "ResponseSendTimeMs", "TotalTimeMs")
"""Kafka's names of the stage histograms, in the order ``record`` fills them."""

BUCKET_BOUNDS_MS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                           1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0)
"""Upper bounds (ms, inclusive) of the stage histograms' buckets; one more bucket holds the rest (+Inf).

Sub-millisecond at the low end because queue and send times of a pipelined
front end are mostly microseconds; 60 s at the top is past any produce timeout.
"""


class ApiRequestMetrics:
    """What is counted for one api (Kafka: the ``RequestMetrics`` of one ``request`` name).

    Attributes:
        api_key: the api key.
        requests: api version -> responses written (Kafka RequestsPerSec, per version).
        errors: error code -> count, over the partitions/topics of complete
            responses (Kafka ErrorsPerSec; code 0 is NONE).
        buckets: per stage (``STAGES`` order), count per bucket of
            ``BUCKET_BOUNDS_MS`` plus a last one for larger times; not cumulative.
        sums_ms: per stage, the sum of all recorded times (ms).
    """

    __slots__ = ("api_key", "requests", "errors", "buckets", "sums_ms")

    def __init__(self, api_key: int) -> None:
        self.api_key = api_key
        self.requests: dict[int, int] = {}
        self.errors: dict[int, int] = {}
        self.buckets: list[list[int]] = [[0] * (len(BUCKET_BOUNDS_MS) + 1) for _ in STAGES]
        self.sums_ms: list[float] = [0.0] * len(STAGES)


class RequestMetrics:
    """Stage histograms, request counts and error counts of every api seen (one per server).

    Kafka ``RequestChannel.Metrics``: one ``ApiRequestMetrics`` per api key,
    created the first time the api is recorded.
    """

    __slots__ = ("apis",)

    def __init__(self) -> None:
        self.apis: dict[int, ApiRequestMetrics] = {}

    def api(self, api_key: int) -> ApiRequestMetrics:
        """The metrics of ``api_key`` (created on first use)."""
        metrics = self.apis.get(api_key)
        if metrics is None:
            metrics = self.apis[api_key] = ApiRequestMetrics(api_key)
        return metrics

    def errors(self, api_key: int) -> dict[int, int]:
        """The error counts of ``api_key``, to add a complete response's error codes to."""
        return self.api(api_key).errors

    def record(self, api_key: int, api_version: int, received: float, dequeued: float, local_done: float,
               response_complete: float, response_dequeued: float, sent: float, count: int = 1) -> None:
        """One response written: count it and put its stage times in the histograms (``count``
        responses with the same times: each counted, each time in the histograms).

        Args:
            api_key, api_version: from the request header.
            received: the request's frame was read whole (s).
            dequeued: a handler took it (s); negative if unknown, then ``received``.
            local_done: the handler was done with it (s); negative if unknown,
                then the response time is used.
            response_complete: its response was complete (s); negative if
                unknown, then ``response_dequeued``.
            response_dequeued: the writer took the response (s).
            sent: the response was written to the socket (s); equal to
                ``response_dequeued`` when there is nothing to write (acks=0).

        A negative stage time (clock readings out of order) counts as 0.
        """
        metrics = self.apis.get(api_key)
        if metrics is None:
            metrics = self.api(api_key)
        requests = metrics.requests
        requests[api_version] = requests.get(api_version, 0) + count
        # The stage rules above, in C (pipeline/_stages.c): ~0.3 us where this loop was ~1.4 us.
        record_stages(metrics.buckets, metrics.sums_ms, BUCKET_BOUNDS_MS, received, dequeued, local_done,
                      response_complete, response_dequeued, sent, count)


def add_error(errors: dict[int, int], error_code: int, count: int = 1) -> None:
    """Count ``count`` partitions/topics answered with ``error_code`` in an api's ``errors``."""
    errors[error_code] = errors.get(error_code, 0) + count
