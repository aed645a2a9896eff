"""Api dispatch: which Kafka apis and versions we serve, request decoding and
response encoding for them (sans-I/O).

The producer's apis (ApiVersions 18, Metadata 3, Produce 0, InitProducerId
22), the read side (Fetch, ListOffsets), the group coordinator's and the
admin apis; ApiVersions lists exactly ``SUPPORTED_VERSIONS``. Message schemas are
kio's generated classes; this module only picks the class for an
(api key, version), fills in the fields that version has, and turns bytes
into entities and back. What to answer (topics, offsets, producer ids) is
decided by the caller (``pipeline/requests``) and passed in.

Every response builder returns the full response frame from
:func:`pipeline.protocol.header.encode_response`: response header + body,
without the 4-byte size prefix.
"""

from __future__ import annotations

import datetime
import functools
import io
import re
import uuid

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any
from typing import TYPE_CHECKING, Protocol

from kio.index import load_payload_module
from kio.index import load_request_schema
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
from kio.serial import entity_writer
from kio.serial.readers import tz_aware_from_i64
from kio.static.constants import EntityType
from kio.static.primitive import i32Timedelta
from kio.static.primitive import i64

from .. import native
from .errors import InvalidRequestError
from .errors import UnsupportedVersionError
from .guard import check_body
from .guard import compile_plan
from .guard import is_rust_panic
from .header import API_VERSIONS_KEY
from .header import RequestHeader
from .header import is_flexible
from .header import encode_response
from .records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from .header import readonly_buffer
from .metadata_encoding import PartitionTuple, TopicTuple, encode_metadata_response
from ..fastinit import fast_frozen_init

__all__ = (
    "ADVERTISED_VERSIONS",
    "API_VERSIONS",
    "INIT_PRODUCER_ID",
    "METADATA",
    "PRODUCE",
    "SUPPORTED_VERSIONS",
    "BrokerInfo",
    "PartitionResult",
    "ProducePartition",
    "ProduceRequestView",
    "TopicResolver",
    "api_versions_response",
    "decode_request",
    "encode",
    "error_code",
    "make",
    "response_module",
    "init_producer_id_response",
    "metadata_response",
    "produce_response",
    "produce_view",
    "topic_id_for",
    "validate_topic_name",
)

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
API_VERSIONS = API_VERSIONS_KEY
CREATE_TOPICS = 19
DELETE_TOPICS = 20
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
DESCRIBE_CONFIGS = 32
CREATE_PARTITIONS = 37
DELETE_GROUPS = 42
INCREMENTAL_ALTER_CONFIGS = 44
OFFSET_DELETE = 47
DESCRIBE_CLUSTER = 60

SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    # v3 is the first version that carries RecordBatch v2 (magic 2), the
    # only record format we accept. v10 adds tagged leader hints that only
    # accompany NOT_LEADER_OR_FOLLOWER (KIP-951); a broker of a cluster answers
    # that error without them (they are optional: the client refreshes its
    # Metadata instead, as before v10); v11 only lets the broker return TRANSACTION_ABORTABLE (KIP-890). v12
    # means the broker adds partitions to transactions implicitly (KIP-890
    # part 2) and v13 addresses topics by id: neither is implemented.
    PRODUCE: (3, 11),
    # v12 is the last version without the KIP-1102 top-level error code;
    # the v13 change buys nothing for one broker. Topic ids (v10+) are a
    # uuid5 of the name, so v12 lookups by id work for existing topics.
    METADATA: (0, 12),
    # v0-v4 exist in kio. v3+ carry client_software_name/version (KIP-511),
    # v4 only relaxes SupportedFeatures' min version.
    API_VERSIONS: (0, 4),
    # v3 adds producer_id/epoch to the request (KIP-360): for a null
    # transactional id Kafka ignores them and allocates a new id (the
    # handler should do the same). v4/v5 only add error codes the client must understand
    # (PRODUCER_FENCED, TRANSACTION_ABORTABLE). v6 adds two-phase commit
    # (KIP-939), not implemented.
    INIT_PRODUCER_ID: (0, 5),
}

# The read side and the admin side (issue 10). Each range is what the
# module serving the api implements and tests; ApiVersions lists exactly
# SUPPORTED_VERSIONS. librdkafka enables features from the advertised list
# (rdkafka_feature.c): RecordBatch v2 needs Fetch v4+, zstd Fetch v10+ (and
# Produce v7+), lz4 FindCoordinator v0+.
SUPPORTED_VERSIONS.update({
    FETCH: (4, 12),                 # pipeline/log/fetch.py
    LIST_OFFSETS: (1, 7),           # pipeline/log/fetch.py
    # KIP-320's position validation (librdkafka needs v2, the first with current_leader_epoch; kio
    # has v2-v4). Clients validate once a partition's leader epoch goes up: kafka-python 3.x does
    # even without the api listed, and stops fetching the partition until it succeeds.
    OFFSET_FOR_LEADER_EPOCH: (2, 4),  # pipeline/log/fetch.py
    OFFSET_COMMIT: (2, 8),          # pipeline/coordinator
    OFFSET_FETCH: (1, 8),
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    LIST_GROUPS: (0, 4),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    CREATE_TOPICS: (2, 7),          # pipeline/admin
    DELETE_TOPICS: (1, 6),
    DESCRIBE_CONFIGS: (1, 4),
    CREATE_PARTITIONS: (0, 3),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_CLUSTER: (0, 1),
    # pipeline/requests/sasl_apis.py. After SaslHandshake v0 the SASL tokens come as
    # raw size-prefixed frames (KIP-43; pipeline/network/connection_state.py reads
    # them), after v1 in SaslAuthenticate (KIP-152). Kafka 3.x lists 0-1, and
    # librdkafka before 2.10 counts SaslHandshake as supported only when v0 is listed.
    17: (0, 1),                     # SaslHandshake
    36: (0, 2),                     # SaslAuthenticate (v1: session lifetime, KIP-368; v2: flexible)
    50: (0, 0),                     # DescribeUserScramCredentials (KIP-554)
    51: (0, 0),                     # AlterUserScramCredentials (KIP-554)
    29: (1, 3),                     # DescribeAcls: pipeline/requests/acl_apis.py (kio has v1-v3)
    30: (1, 3),                     # CreateAcls
    31: (1, 3),                     # DeleteAcls
    # Transactions (KIP-98/360/447/664): pipeline/requests/txn_apis.py, with InitProducerId
    # above. Not listed by a server that does not run the transaction coordinator (a
    # cluster of brokers, pipeline.cluster.membership): KafkaApis.withheld.
    24: (0, 3),                     # AddPartitionsToTxn (v4: broker-to-broker verification, KIP-890)
    25: (0, 3),                     # AddOffsetsToTxn
    26: (0, 3),                     # EndTxn (v4: TRANSACTION_ABORTABLE, v5: KIP-890 epoch bumps)
    28: (0, 3),                     # TxnOffsetCommit
    65: (0, 0),                     # DescribeTransactions
    66: (0, 1),                     # ListTransactions (v1: duration filter, KIP-994)
    61: (0, 0),                     # DescribeProducers (KIP-664)
    27: (1, 1),                     # WriteTxnMarkers: the admin abort of a hanging transaction (KIP-664)
})
# What ApiVersions lists: exactly what is served.
ADVERTISED_VERSIONS: dict[int, tuple[int, int]] = dict(SUPPORTED_VERSIONS)

_ZERO_MS = i32Timedelta.parse(datetime.timedelta(0))
_ONE_MS = datetime.timedelta(milliseconds=1)
_ZERO_UUID = uuid.UUID(int=0)
# Namespace for deterministic topic ids: uuid5(_TOPIC_ID_NAMESPACE, name).
_TOPIC_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:pipeline:kafka-topic-id")
TOPIC_ID_CACHE_SIZE = 65536
"""Topic names whose ids ``topic_id_for`` keeps in memory (a name and a UUID each, ~200 bytes)."""


class _Lazy(dict):
    """A dict that computes a missing value with ``factory(key)`` and keeps it.

    Building a reader, a bounds plan and a writer for every served (api key,
    version) at import would cost about a second per process; each is built
    on first use instead (a dict hit afterwards).
    """

    def __init__(self, factory: Any) -> None:
        super().__init__()
        self._factory = factory

    def __missing__(self, key: Any) -> Any:
        value = self[key] = self._factory(key)
        return value


# (api_key, version) -> kio reader for the request body.
_REQUEST_READERS = _Lazy(lambda key: entity_reader(load_request_schema(*key)))
# (api_key, version) -> bounds pre-check plan, run before the native reader
# (a huge array length would abort the process inside kio, see guard.py).
_REQUEST_PLANS = _Lazy(lambda key: compile_plan(load_request_schema(*key)))
# (api_key, version) -> kio response module, for its nested entity classes.
_RESPONSE_MODULES = _Lazy(lambda key: load_payload_module(key[0], key[1], EntityType.response))
_RESPONSE_CLASSES = _Lazy(lambda key: load_response_schema(*key))
# response entity class -> kio writer.
_WRITERS = _Lazy(entity_writer)


def warm_up() -> None:
    """Build now what the lazy tables above would build on first use, for every served (api key, version).

    ~1-2 s of imports (kio's schema modules) and code generation; ``pipeline
    serve`` runs it in a thread while Spark starts. Otherwise the first
    request of each api key and version pays it on the event loop: a profile
    of a fresh server under librdkafka load spent ~20 % of its first seconds
    in these imports (issue 13). Idempotent; unknown combinations are skipped
    as they would be refused on first use anyway.
    """
    for api_key, (low, high) in SUPPORTED_VERSIONS.items():
        for version in range(low, high + 1):
            key = (api_key, version)
            is_flexible(api_key, version)
            _REQUEST_READERS[key]
            _REQUEST_PLANS[key]
            _RESPONSE_MODULES[key]
            _WRITERS[_RESPONSE_CLASSES[key]]


def api_name(api_key: int) -> str:
    """kio's snake_case name of ``api_key`` (e.g. 1 -> "fetch"), "unknown" if none."""
    return api_key_map.get(api_key, "unknown")


def _make(cls: type[DataclassInstance], **values: Any) -> Any:
    """Instantiate kio entity ``cls`` with those ``values`` it has fields for.

    kio generates one class per version; fields a version lacks are
    dropped, so one call site serves all versions.
    """
    names = cls.__dataclass_fields__
    return cls(**{k: v for k, v in values.items() if k in names})


def _encode(entity: Any) -> bytes:
    buffer = io.BytesIO()
    _WRITERS[type(entity)](buffer, entity)
    return buffer.getvalue()


def response_module(api_key: int, version: int) -> Any:
    """kio's response module for (api key, version): its entity classes
    (e.g. ``response_module(FETCH, 12).FetchResponse``).

    :raises KeyError: the pair is not in ``SUPPORTED_VERSIONS``.
    """
    return _RESPONSE_MODULES[(api_key, version)]


def make(cls: type, **values: Any) -> Any:
    """Instantiate kio entity ``cls`` from ``values``, dropping the fields
    this version of the class does not have (one call site for all versions)."""
    return _make(cls, **values)


def encode(header: RequestHeader, body: Any) -> bytes:
    """The response frame (response header + ``body``, no size prefix) for
    the request ``header`` belongs to; ``body`` is a kio response entity of
    the request's api key and version."""
    return encode_response(header, _encode(body))


def error_code(code: int) -> ErrorCode:
    """kio's ErrorCode for the int ``code``. :raises ValueError: not a Kafka error code."""
    return _error_code(code)


ZERO_MS = _ZERO_MS
"""throttle_time_ms 0 as kio's i32Timedelta."""


def timedelta_ms(ms: int) -> i32Timedelta:
    """A duration in ms as kio's i32Timedelta (e.g. a transaction timeout)."""
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def datetime_ms(ms: int) -> Any:
    """Wall-clock ms since the epoch as kio's datetime_i64 value; -1 (none) as kio reads it (None)."""
    return tz_aware_from_i64(i64(ms))


DECODE_CACHE_SIZE = 256
"""Metadata request bodies whose decoded entity ``decode_request`` keeps (least recently used go)."""
DECODE_CACHE_MAX_BODY_BYTES = 4096
"""Larger Metadata request bodies (bytes) are decoded each time, not kept."""


@functools.lru_cache(maxsize=DECODE_CACHE_SIZE)
def _decode_metadata_body(version: int, body: bytes) -> Any:
    """A Metadata request body's kio entity. Clients send the same body again and again (a
    producer's periodic refresh, the bench's fences), and the entity is immutable (a frozen
    dataclass of tuples), so the decode is kept: kio's decode and the guard's walk took ~3 %
    of the event loop at acks=0, for one request in seventeen. Raises as ``decode_request``
    (nothing is kept then)."""
    check_body(_REQUEST_PLANS[(METADATA, version)], body, 0)
    return _REQUEST_READERS[(METADATA, version)](body, 0)[0]


def decode_request(header: RequestHeader, frame: bytes | bytearray | memoryview) -> Any:
    """Decode the request body of ``frame`` into the kio request entity for
    ``header.api_key`` at ``header.api_version``.

    ``frame`` is the whole request frame (size prefix stripped) that
    ``header`` was parsed from; the body starts at ``header.body_offset``.
    Bytes after the body are ignored, as Kafka ignores them (its generated
    ``*RequestData.read`` stops after the last field and
    ``RequestContext.parseRequest`` does not look at what is left):
    librdkafka 2.16's AdminClient sends its all-topics Metadata v12 with 3
    bytes after the body, and Kafka answers it.

    :raises UnsupportedVersionError: the api key is not served or the
        version is outside ``SUPPORTED_VERSIONS`` (ApiVersions callers should
        use :func:`api_versions_response`, which answers instead, KIP-511).
    :raises InvalidRequestError: kio cannot parse the body (truncated,
        negative lengths, bad UTF-8, unknown tagged field, ...).
    """
    api_key, version = header.api_key, header.api_version
    versions = SUPPORTED_VERSIONS.get(api_key)
    if versions is None:
        raise UnsupportedVersionError(
            f"api key {api_key} ({api_name(api_key)}) is not served "
            f"(correlation_id={header.correlation_id})"
        )
    low, high = versions
    if not low <= version <= high:
        raise UnsupportedVersionError(
            f"{api_name(api_key)} v{version} is not supported, only v{low}-v{high} "
            f"(correlation_id={header.correlation_id})"
        )
    try:
        if api_key == METADATA and len(frame) - header.body_offset <= DECODE_CACHE_MAX_BODY_BYTES:
            return _decode_metadata_body(version, bytes(frame[header.body_offset:]))
        frame = readonly_buffer(frame)
        check_body(_REQUEST_PLANS[(api_key, version)], frame, header.body_offset)
        entity, size = _REQUEST_READERS[(api_key, version)](frame, header.body_offset)
    except BaseException as exc:
        # kio's native reader raises SerialError subclasses, but also
        # ValueError (over-long varint), KeyError (unknown tag), OverflowError,
        # and a Rust panic surfaces as pyo3's PanicException (a BaseException);
        # all mean "these bytes are not this request", never a bug of ours.
        if not isinstance(exc, Exception) and not is_rust_panic(exc):
            raise  # KeyboardInterrupt, SystemExit, trio.Cancelled
        detail = str(exc) if isinstance(exc, InvalidRequestError) else f"{type(exc).__name__}: {exc}"
        raise InvalidRequestError(
            f"cannot parse {api_name(api_key)} v{version} request body "
            f"(correlation_id={header.correlation_id}): {detail}"
        ) from exc
    return entity


# --------------------------------------------------------------------- ApiVersions

# Kafka ApiVersionsRequest.isValid (KIP-511): software name and version.
_SOFTWARE_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def _api_keys(module: Any, withheld: frozenset[int] = frozenset()) -> tuple[Any, ...]:
    return tuple(
        module.ApiVersion(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ADVERTISED_VERSIONS.items()) if key not in withheld
    )


def api_versions_response(
    header: RequestHeader, frame: bytes | bytearray | memoryview,
    error_counts: dict[int, int] | None = None,
    withheld: frozenset[int] = frozenset(),
) -> tuple[bytes, tuple[str, str] | None]:
    """Answer an ApiVersions request, listing ``ADVERTISED_VERSIONS`` minus the api keys in
    ``withheld`` (apis this server does not run).

    Returns the response frame and ``(client_software_name,
    client_software_version)`` when a v3+ request carried valid ones, else
    None. The response's error code is counted in ``error_counts`` if given
    (Kafka ``ApiVersionsResponse.errorCounts``).

    KIP-511: a version outside ``SUPPORTED_VERSIONS`` is not an error; the
    answer is an ApiVersions *v0* body with ``UNSUPPORTED_VERSION`` (35) and
    our api list, so the client retries with a version we support. Its
    response header is v0 like every ApiVersions response. A v3+ request
    whose software name/version fails Kafka's pattern gets
    ``INVALID_REQUEST`` (42) and an empty list, as Kafka answers.

    :raises InvalidRequestError: a supported version whose body cannot be
        parsed.
    """
    low, high = SUPPORTED_VERSIONS[API_VERSIONS]
    version = header.api_version
    if not low <= version <= high:
        v0 = _RESPONSE_MODULES[(API_VERSIONS, 0)]
        body = v0.ApiVersionsResponse(
            error_code=ErrorCode.unsupported_version, api_keys=_api_keys(v0, withheld)
        )
        _count_error(error_counts, ErrorCode.unsupported_version.value)
        return encode_response(header, _encode(body)), None
    request = decode_request(header, frame)
    module = _RESPONSE_MODULES[(API_VERSIONS, version)]
    error = ErrorCode.none
    software = None
    if version >= 3:
        name, ver = request.client_software_name, request.client_software_version
        if _SOFTWARE_RE.fullmatch(name) and _SOFTWARE_RE.fullmatch(ver):
            software = (name, ver)
        else:
            error = ErrorCode.invalid_request
    body = _make(
        module.ApiVersionsResponse,
        error_code=error,
        api_keys=_api_keys(module, withheld) if error is ErrorCode.none else (),
        throttle_time=_ZERO_MS,
    )
    _count_error(error_counts, error.value)
    return encode_response(header, _encode(body)), software


def _count_error(error_counts: dict[int, int] | None, code: int) -> None:
    if error_counts is not None:
        error_counts[code] = error_counts.get(code, 0) + 1


# ------------------------------------------------------------------------ Metadata

_TOPIC_NAME_RE = re.compile(r"[a-zA-Z0-9._-]+")
_MAX_TOPIC_NAME_LENGTH = 249


def validate_topic_name(name: str) -> None:
    """Check a topic name against Kafka's rule (``Topic.validate``):
    1..249 characters of ``[a-zA-Z0-9._-]``, and not "." or "..".

    :raises ValueError: with the reason, if the name is not legal.
    """
    if not name:
        raise ValueError("topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise ValueError(f"topic name cannot be {name!r}")
    if len(name) > _MAX_TOPIC_NAME_LENGTH:
        raise ValueError(
            f"topic name is illegal, it can't be longer than {_MAX_TOPIC_NAME_LENGTH} characters"
        )
    if not _TOPIC_NAME_RE.fullmatch(name):
        raise ValueError(
            f"topic name {name!r} is illegal, it contains a character other than "
            "ASCII alphanumerics, '.', '_' and '-'"
        )


@functools.lru_cache(maxsize=TOPIC_ID_CACHE_SIZE)
def topic_id_for(name: str) -> uuid.UUID:
    """Deterministic topic id (Metadata v10+, KIP-516): uuid5 of the name.

    Memoized (at most ``TOPIC_ID_CACHE_SIZE`` names): every Metadata response names its
    topics' ids, and uuid5 (a SHA-1 and a UUID built in Python, ~3 us) was 4.5 % of the
    front end's CPU at acks=0, where the load generator's fences are Metadata requests.
    """
    return uuid.uuid5(_TOPIC_ID_NAMESPACE, name)


class TopicResolver(Protocol):
    """What :func:`metadata_response` needs to know about topics."""

    def describe(self, name: str, auto_create: bool) -> tuple[int, int]:
        """``(error_code, num_partitions)`` for a valid topic name, creating
        it first if ``auto_create`` and the broker allows it. Partitions
        are listed only when error_code is 0."""
        ...

    def all_topics(self) -> dict[str, int]:
        """Every existing topic: name -> number of partitions."""
        ...


class BrokerAddress(Protocol):
    """A member of a cluster as Metadata names it (``pipeline.cluster.membership.ClusterBroker``)."""

    @property
    def node_id(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


class ClusterView(Protocol):
    """What the request handlers ask of the cluster a broker is a member of: who leads a partition and
    at which leader epoch (KIP-320), who coordinates a group, who the controller and the brokers are
    (``pipeline.cluster.membership.Cluster``, static; ``DynamicCluster``, leadership through the
    database). A Protocol, so the layers below ``cluster`` name it without importing it."""

    @property
    def brokers(self) -> Sequence[BrokerAddress]: ...
    @property
    def size(self) -> int: ...
    @property
    def controller_id(self) -> int: ...
    def leader(self, topic: str, partition: int) -> int: ...
    def leads(self, topic: str, partition: int) -> bool: ...
    def leader_epoch(self, topic: str, partition: int) -> int: ...
    def taking_over(self, topic: str, partition: int) -> bool: ...
    def coordinator(self, group_id: str) -> int: ...
    def coordinates(self, group_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """This broker as advertised in Metadata; alone (``cluster`` None) it is the only broker,
    leader of every partition and controller; in a cluster (``pipeline.cluster.membership``) the
    leaders and the controller are the cluster's."""

    node_id: int
    host: str
    port: int
    cluster_id: str
    endpoints: tuple[tuple[str, str, int], ...] = ()
    """(listener name, advertised host, advertised port) of every listener (KIP-103);
    ``host``/``port`` are the first listener's."""
    cluster: ClusterView | None = None
    """The cluster this broker is a member of (``pipeline.cluster.membership``); None: alone."""

    def leader(self, topic: str, partition: int) -> int:
        """Node id of the leader of ``topic``-``partition``."""
        return self.node_id if self.cluster is None else self.cluster.leader(topic, partition)

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this broker leads ``topic``-``partition`` (Produce, Fetch, ListOffsets are served
        by the leader only; others answer NOT_LEADER_OR_FOLLOWER)."""
        return self.cluster is None or self.cluster.leads(topic, partition)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch of ``topic``-``partition`` (KIP-320): 0 alone or with static leaders, the
        leadership row's with leadership through the database (``pipeline.cluster.membership``)."""
        return 0 if self.cluster is None else self.cluster.leader_epoch(topic, partition)

    def taking_over(self, topic: str, partition: int) -> bool:
        """Whether this broker was made leader of ``topic``-``partition`` and is taking it over, not
        serving it yet (``pipeline.cluster.membership.DynamicCluster.taking_over``); never alone."""
        return self.cluster is not None and self.cluster.taking_over(topic, partition)

    @property
    def controller_id(self) -> int:
        return self.node_id if self.cluster is None else self.cluster.controller_id

    def all_brokers(self) -> tuple[tuple[int, str, int], ...]:
        """(node id, host, port) of every broker, by id: this one as advertised on its listener,
        the others at their ``pipeline.cluster.brokers`` address."""
        if self.cluster is None:
            return ((self.node_id, self.host, self.port),)
        return tuple((b.node_id, self.host, self.port) if b.node_id == self.node_id else (b.node_id, b.host, b.port)
                     for b in self.cluster.brokers)

    def address_of(self, node_id: int) -> tuple[str, int]:
        """(host, port) clients reach broker ``node_id`` at."""
        for n, host, port in self.all_brokers():
            if n == node_id:
                return host, port
        raise KeyError(node_id)

    def for_listener(self, listener: str) -> BrokerInfo:
        """This broker as a client that came in through ``listener`` must see it: with that
        listener's advertised host and port (Kafka answers Metadata, FindCoordinator and
        DescribeCluster with the endpoint of the request's listener). An unknown name: self."""
        for name, host, port in self.endpoints:
            if name == listener:
                return self if (host, port) == (self.host, self.port) else replace(self, host=host, port=port)
        return self


def metadata_response(
    header: RequestHeader, request: Any, broker: BrokerInfo, topics: TopicResolver,
    error_counts: dict[int, int] | None = None,
) -> bytes:
    """Answer a Metadata request (kio entity from :func:`decode_request`).

    Each topic's error code is counted in ``error_counts`` if given (Kafka
    ``MetadataResponse.errorCounts``).

    Topic selection (Kafka ``MetadataRequest``): v0 with an empty list and
    v1+ with a null list mean all topics; v1+ with an empty list means
    none. Auto-creation follows ``allow_auto_topic_creation`` (v4+; always
    allowed before). Invalid names get ``INVALID_TOPIC_EXCEPTION`` (17)
    without consulting ``topics``; v12 lookups by topic id of unknown ids
    get ``UNKNOWN_TOPIC_ID`` (100). Each partition: leader and sole
    replica/ISR member ``broker.leader(topic, partition)`` (this broker when
    alone), leader epoch ``broker.leader_epoch(topic, partition)`` (v7+, KIP-320:
    0 unless leadership is through the database).

    :raises InvalidRequestError: a v10/v11 request with a null topic name
        (Kafka rejects it the same way: ids are usable from v12).
    """
    version = header.api_version
    auto_create = getattr(request, "allow_auto_topic_creation", True)

    listed = tuple(broker.all_brokers())
    listed_ids = {node_id for node_id, _, _ in listed}
    leader_of, epoch_of = broker.leader, broker.leader_epoch
    none, not_available = int(ErrorCode.none), int(ErrorCode.leader_not_available)

    def topic_entry(name: str | None, error: int, partitions: int, topic_id: uuid.UUID = _ZERO_UUID) -> TopicTuple:
        """A leader that is not a listed (live) broker is not available (-1), as Kafka answers for
        an offline leader; a client would otherwise look up a broker id it was not given
        (kafka-python's poll raises UnknownBrokerIdError), e.g. between a broker's lease ending
        and the controller moving its partitions."""
        entries: list[PartitionTuple] = []
        if error == 0:
            key = name or ""
            for index in range(partitions):
                leader = leader_of(key, index)
                entries.append((none, index, leader, epoch_of(key, index)) if leader in listed_ids
                               else (not_available, index, -1, epoch_of(key, index)))
        return (int(error), name, topic_id, entries)

    def named(name: str) -> TopicTuple:
        try:
            validate_topic_name(name)
        except ValueError:
            return topic_entry(name, ErrorCode.invalid_topic_exception, 0)
        error, partitions = topics.describe(name, auto_create)
        return topic_entry(name, error, partitions, topic_id_for(name) if error == 0 else _ZERO_UUID)

    requested = request.topics
    entries: list[TopicTuple]
    if requested is None or (version == 0 and not requested):
        entries = [
            topic_entry(name, 0, count, topic_id_for(name))
            for name, count in topics.all_topics().items()
        ]
    else:
        entries = []
        seen_names: set[str] = set()
        seen_ids: set[uuid.UUID] = set()
        by_id: dict[uuid.UUID, str] | None = None
        for topic in requested:
            name = topic.name
            if name is None:
                if version < 12:
                    raise InvalidRequestError(
                        f"Metadata v{version} topic name is null; topic ids are only usable from v12"
                    )
                topic_id = topic.topic_id or _ZERO_UUID
                if topic_id in seen_ids:
                    continue
                seen_ids.add(topic_id)
                if by_id is None:
                    by_id = {topic_id_for(known): known for known in topics.all_topics()}
                known = by_id.get(topic_id)
                if known is None:
                    entries.append(topic_entry(None, ErrorCode.unknown_topic_id, 0, topic_id))
                    continue
                name = known
            if name in seen_names:
                continue
            seen_names.add(name)
            entries.append(named(name))

    if error_counts is not None:
        for entry in entries:
            _count_error(error_counts, entry[0])
    return encode_response(header, encode_metadata_response(version, listed, broker.cluster_id,
                                                            broker.controller_id, entries))


# ------------------------------------------------------------------ InitProducerId


def init_producer_id_response(
    header: RequestHeader,
    request: Any,
    producer_id: int,
    producer_epoch: int,
    error_code: int = 0,
) -> bytes:
    """Answer an InitProducerId request with the id and epoch the caller
    allocated (Kafka sends producer_id -1, epoch -1 with an error).

    ``request`` is the decoded kio entity; it is accepted for symmetry with
    the other builders (the version comes from ``header``).
    """
    module = _RESPONSE_MODULES[(INIT_PRODUCER_ID, header.api_version)]
    body = _make(
        module.InitProducerIdResponse,
        throttle_time=_ZERO_MS,
        error_code=_error_code(error_code),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
    return encode_response(header, _encode(body))


# ------------------------------------------------------------------------- Produce


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class ProducePartition:
    """One partition's data in a ProduceRequest. ``records`` is the raw
    record batch bytes as kio decoded them (None if the client sent null)."""

    topic: str
    partition: int
    records: bytes | None


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class ProduceRequestView:
    """A ProduceRequest flattened to what the handler needs.

    ``acks``: 0, 1 or -1 (all). ``timeout_ms``: how long the client waits
    for acks. ``partitions`` in request order.
    """

    acks: int
    timeout_ms: int
    transactional_id: str | None
    partitions: list[ProducePartition]


def produce_view(request: Any) -> ProduceRequestView:
    """Flatten a kio ProduceRequest (v3-v12). Records stay the bytes objects
    kio made; nothing is copied here."""
    return ProduceRequestView(
        acks=int(request.acks),
        timeout_ms=request.timeout // _ONE_MS,
        transactional_id=request.transactional_id,
        partitions=[
            ProducePartition(topic.name, partition.index, partition.records)
            for topic in request.topic_data
            for partition in topic.partition_data
        ],
    )


_FIRST_FLEXIBLE_PRODUCE = 9
_PRODUCE_FIRST, _PRODUCE_LAST = SUPPORTED_VERSIONS[PRODUCE]
"""The Produce versions the C readers (``produce_body``, ``plain_produce_body``, ``plain_produce_run``) take."""


def decode_produce(header: RequestHeader, frame: bytes | bytearray | memoryview) -> ProduceRequestView:
    """``produce_view(decode_request(header, frame))``, with a fast path for the usual request.

    The fast path (issue 13; in C since issue 23: kio's decode, the bounds walk that guards
    it and the view took ~9 % of the event loop at acks=0, the same walk in Python ~7 us per
    request) reads a Produce v3-v11 body straight into the view
    (``pipeline.native.produce_body``): records are ``bytes`` copies of the frame's, as kio
    makes them. It takes only what the general path accepts with the same result, and hands
    anything else to it (which then accepts it or raises ``InvalidRequestError``): a frame
    that is neither ``bytes`` nor ``bytearray``, any tagged field, a null where Kafka allows
    none, a negative length, a length past the frame end, a varint over 5 bytes, a name that
    is not UTF-8. Bytes after the body are ignored by both.

    :raises UnsupportedVersionError, InvalidRequestError: see ``decode_request``.
    """
    body = produce_body(header, frame)
    if body is not None:
        acks, timeout_ms, transactional_id, partitions = body
        return ProduceRequestView(acks, timeout_ms, transactional_id,
                                  [ProducePartition(topic, index, records) for topic, index, records in partitions])
    return produce_view(decode_request(header, frame))


def produce_body(header: RequestHeader,
                 frame: bytes | bytearray | memoryview,
                 ) -> tuple[int, int, str | None, list[tuple[str, int, bytes | None]]] | None:
    """The fast path of ``decode_produce`` without the view objects: ``(acks, timeout_ms,
    transactional_id, [(topic, partition, records), ...])`` (``pipeline.native.produce_body``),
    or None when it declines and ``decode_produce``'s general path decides (it accepts the
    request, with the same result, or raises). Never raises.
    """
    if header.api_key == PRODUCE and _PRODUCE_FIRST <= header.api_version <= _PRODUCE_LAST:
        return native.produce_body(frame, header.body_offset, header.api_version >= _FIRST_FLEXIBLE_PRODUCE)
    return None


def plain_produce_body(header: RequestHeader, frame: bytes | bytearray | memoryview,
                       ) -> tuple[int, int, list[tuple[str, int, bytes, int, int]]] | None:
    """``produce_body`` with each partition's records summarized (``summarize_fields``), in one C
    call (``pipeline.native.plain_produce``): ``(acks, timeout_ms, [(topic, partition, records,
    record_count, uncompressed_bytes), ...])`` for a Produce request with no transactional id, acks
    0/1/-1, at least one partition, and every partition's records uncompressed, valid (as
    ``validate_records`` checks them) and from a producer that is not idempotent or transactional;
    None for any other request, which the general path then accepts or refuses. Never raises.
    """
    if header.api_key == PRODUCE and _PRODUCE_FIRST <= header.api_version <= _PRODUCE_LAST:
        return native.plain_produce(frame, header.body_offset, header.api_version >= _FIRST_FLEXIBLE_PRODUCE,
                                    MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)
    return None


def plain_produce_run(requests: list[Any], start: int, checked: dict[tuple[str, int], bool], now: float,
                      min_timeout_ms: int) -> tuple[list[tuple[Any, int, float, list[tuple[str, int, bytes, int, int]]]], int]:
    """``plain_produce_body`` of ``requests[start:]`` in one C call (``pipeline.native.plain_run``),
    for a handler's produce run: each Produce request (objects with ``header``, ``frame``,
    ``received_at``, ``dequeued_at``) that ``plain_produce_body`` reads and whose every
    (topic, partition) is True in ``checked`` becomes ``(request, acks, deadline, parts)``, deadline
    ``received_at + max(timeout_ms, min_timeout_ms) / 1000`` (s), its ``dequeued_at`` set to
    ``now``; returns them and the index of the first request it left (``len(requests)`` if none).
    """
    return native.plain_run(requests, start, checked, now, min_timeout_ms, MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS,
                            PRODUCE, _PRODUCE_FIRST, _PRODUCE_LAST, _FIRST_FLEXIBLE_PRODUCE)


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class PartitionResult:
    """Outcome for one partition of a ProduceRequest.

    ``base_offset``: offset given to the first record (-1 on error).
    ``log_append_time_ms``: -1 for CreateTime topics (Kafka's convention).
    ``log_start_offset`` (v5+) and ``error_message`` (v8+) are dropped for
    versions that lack them.
    """

    topic: str
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def _partition_field_names(version: int) -> frozenset[str]:
    return frozenset(_RESPONSE_MODULES[(PRODUCE, version)].PartitionProduceResponse.__dataclass_fields__)


# Per Produce version: which optional partition fields exist (v5 adds
# log_start_offset, v8 record_errors and error_message). Precomputed because
# produce_response is on the hot path (one call per Produce request).
_PRODUCE_PARTITION_FIELDS = {
    version: _partition_field_names(version)
    for version in range(SUPPORTED_VERSIONS[PRODUCE][0], SUPPORTED_VERSIONS[PRODUCE][1] + 1)
}
_ERROR_CODES: dict[int, ErrorCode] = {int(code): code for code in ErrorCode}


def _error_code(code: int) -> ErrorCode:
    """kio's ErrorCode for ``code``; a dict hit instead of the enum's ~0.6 us
    constructor. :raises ValueError: not a Kafka error code."""
    try:
        return _ERROR_CODES[code]
    except KeyError:
        return ErrorCode(code)


def produce_response(header: RequestHeader, results: list[PartitionResult]) -> bytes:
    """Answer a ProduceRequest (version from ``header``): partitions grouped
    by topic in first-seen order, throttle time 0.

    Not called for acks=0, which Kafka answers with nothing.

    :raises ValueError: a result's error_code is not a Kafka error code.
    """
    version = header.api_version
    module = _RESPONSE_MODULES[(PRODUCE, version)]
    partition_cls = module.PartitionProduceResponse
    fields = _PRODUCE_PARTITION_FIELDS[version]
    with_start_offset = "log_start_offset" in fields
    with_errors = "record_errors" in fields
    by_topic: dict[str, list[Any]] = {}
    for result in results:
        values: dict[str, Any] = {
            "index": result.partition,
            "error_code": _error_code(result.error_code),
            "base_offset": result.base_offset,
            "log_append_time": (
                None
                if result.log_append_time_ms < 0
                else tz_aware_from_i64(i64(result.log_append_time_ms))
            ),
        }
        if with_start_offset:
            values["log_start_offset"] = result.log_start_offset
        if with_errors:
            values["record_errors"] = ()
            values["error_message"] = result.error_message
        partitions = by_topic.get(result.topic)
        if partitions is None:
            partitions = by_topic[result.topic] = []
        partitions.append(partition_cls(**values))
    body = module.ProduceResponse(
        responses=tuple(
            module.TopicProduceResponse(name=topic, partition_responses=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
        throttle_time=_ZERO_MS,
    )
    return encode_response(header, _encode(body))
