"""One configuration for ``pipeline serve``: the keys, and defaults < file < environment < flags.

Every setting has a key, Kafka's broker (or producer) property name where
Kafka has one with that meaning (``listeners``, ``num.network.threads``,
``queued.max.requests``, ``socket.request.max.bytes``, ``linger.ms``, ...),
Spark's or Hive's where they own it (``spark.master``, ``spark.remote``,
``spark.connect.grpc.binding.port``, ``hive.metastore.uris``,
``hive.server2.thrift.port``), and ``table.*``, ``log.*`` or ``pipeline.*``
for our own. ``KEYS`` maps each key to the ``ServerConfig`` field(s) it sets
(``table.<field>``: of its ``TableConfig``; ``log.<field>``: of
``pipeline.observe.structured_logs.LogConfig``), its parser, its help and its flag. Defaults are
not repeated here: they are the dataclasses' (``default_value``).

A value comes from, lowest to highest precedence:

1. the default;
2. the TOML file given with ``--config FILE`` (TOML types: ``num.io.threads = 8``;
   dotted and quoted keys mean the same), plus per-topic ``[topic."<name>"]``
   tables (``TOPIC_KEYS``), which only the file can set::

       listeners = "PLAINTEXT://0.0.0.0:9092"
       num.network.threads = 4
       table.commit.interval.ms = 10000

       [topic."orders"]
       table.partition.granularity = "day"
       table.retention.days = 30

       [topic."payments"]                # typed columns (pipeline.table.typed)
       value.format = "json"
       value.schema = "id BIGINT, amount DECIMAL(12,2), at TIMESTAMP"

3. the environment: ``PIPELINE_<KEY>``, the key upper-cased with dots as
   underscores (``PIPELINE_NUM_NETWORK_THREADS=4``, ``PIPELINE_PIPELINE_QUEUES=8``);
   every variable starting ``PIPELINE_`` must be one;
4. the command line (``--network-threads 4``; ``Key.flag``).

An unknown key (file or environment), a value of the wrong type or range (any
source), or both ``spark.master`` and ``spark.remote`` set raises
``ConfigError`` naming the key and where it came from (``file:PATH``,
``env:NAME``, ``flag:--name``), before anything starts.
``pipeline config show`` prints every key's value and source (``Resolved``).
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pipeline.cluster.membership import ClusterBroker
from pipeline.log.partition import DEFAULT_INDEX_MAX_BYTES
from pipeline.metadata.database import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS
from pipeline.observe.structured_logs import FORMATS, LogConfig, level_number
from pipeline.network.connection_quotas import DEFAULT_MAX_CONNECTIONS
from pipeline.network.connection_limits import (
    DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_RECEIVE_TIMEOUT_MS,
    DEFAULT_RESPONSE_BUFFER_MAX_BYTES,
    DEFAULT_SEND_TIMEOUT_MS,
)
from pipeline.network.framing import DEFAULT_MAX_RECEIVE_BYTES
from pipeline.network.listeners import DEFAULT_PROTOCOL_MAP, Endpoint
from pipeline.network.memory_pool import DEFAULT_QUEUED_MAX_REQUEST_BYTES
from pipeline.security.sasl import DEFAULT_MECHANISMS
from pipeline.security.tls import DEFAULT_HANDSHAKE_TIMEOUT_MS
from pipeline.table.table_config import VALUE_FORMATS, TableConfig, TopicTableConfig
from pipeline.table.layout import (
    DEFAULT_COMMIT_IDLE_MS,
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_COMPACTION_INTERVAL_MS,
    Granularity,
)

if TYPE_CHECKING:
    from pipeline.persist.persister import AckOn

ENV_PREFIX = "PIPELINE_"
DEFAULT_SOURCE = "default"


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key and where it came from."""


# -- what `pipeline serve` is told ----------------------------------------------------------

class Mode(str, enum.Enum):
    """How requests travel from Processors to handlers."""

    MULTIQUEUE = "multiqueue"
    """AutoMQ: N queues, one handler each, routed by connection; no muting."""
    BASELINE = "baseline"
    """Classic Kafka: one shared queue, a handler pool, mute until response."""
    SHARED_UNMUTED = "shared-unmuted"
    """Benchmark ablation: shared queue + handler pool, no mute, responses in
    completion order. Breaks per-connection ordering on purpose, to show what
    the multiqueue hashing (or baseline's mute) prevents."""


@dataclass(slots=True)
class ServerConfig:
    """Everything ``pipeline serve`` can be told. Sizes in bytes, times in ms.

    Defaults follow Kafka's broker defaults where one exists (named in brackets).
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    # [listeners] in Kafka's NAME://HOST:PORT,... form (KIP-103); None: one PLAINTEXT listener on
    # listen_host:listen_port, which always give the first listener's address.
    listeners: tuple[Endpoint, ...] | None = None
    advertised_listeners: tuple[Endpoint, ...] | None = None  # [advertised.listeners] by name
    listener_security_protocol_map: tuple[tuple[str, str], ...] = DEFAULT_PROTOCOL_MAP
    ssl_keystore_location: Path | None = None   # [ssl.keystore.location], PEM chain + key
    ssl_keystore_type: str = "PEM"              # [ssl.keystore.type] PEM or PKCS12; Kafka's JKS is not read here
    ssl_keystore_password: str | None = None    # [ssl.keystore.password] of a PKCS12 keystore
    ssl_key_password: str | None = None         # [ssl.key.password]
    ssl_truststore_location: Path | None = None  # [ssl.truststore.location], PEM CAs
    ssl_truststore_type: str = "PEM"            # [ssl.truststore.type] PEM or PKCS12
    ssl_truststore_password: str | None = None  # [ssl.truststore.password] of a PKCS12 truststore
    ssl_client_auth: str = "none"               # [ssl.client.auth]
    ssl_enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")  # [ssl.enabled.protocols]
    ssl_handshake_timeout_ms: int = DEFAULT_HANDSHAKE_TIMEOUT_MS
    mode: Mode = Mode.MULTIQUEUE
    queues: int = 4
    io_threads: int = 8                         # [num.io.threads]
    queued_max_requests: int = 500              # [queued.max.requests]
    network_threads: int = 3                    # [num.network.threads]
    socket_request_max_bytes: int = DEFAULT_MAX_RECEIVE_BYTES  # [socket.request.max.bytes]
    queued_max_request_bytes: int = DEFAULT_QUEUED_MAX_REQUEST_BYTES  # [queued.max.request.bytes]
    max_in_flight_requests_per_connection: int = DEFAULT_MAX_IN_FLIGHT  # multiqueue; baseline is 1
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # [max.connections]
    max_connections_per_ip: int | None = None   # [max.connections.per.ip]; None: max_connections
    connections_max_idle_ms: int = DEFAULT_IDLE_TIMEOUT_MS  # [connections.max.idle.ms]
    request_receive_timeout_ms: int = DEFAULT_RECEIVE_TIMEOUT_MS
    response_buffer_max_bytes: int = DEFAULT_RESPONSE_BUFFER_MAX_BYTES
    response_send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    num_partitions: int = 1                     # [num.partitions]
    auto_create_topics: bool = True             # [auto.create.topics.enable]
    batch_max_records: int = 200_000
    batch_max_bytes: int = 64 * 1024 * 1024
    linger_ms: float = 50.0
    buffer_memory: int = 256 * 1024 * 1024
    data_dir: Path = field(default_factory=lambda: Path("data"))
    metadata_url: str | None = None             # [pipeline.metadata.url]; None: SQLite under DATA_DIR/_pipeline
    spark_master: str = "local[*]"
    ack_on: AckOn = "wal"
    log_segment_bytes: int = 64 * 1024 * 1024    # [log.segment.bytes] Kafka's 1 GiB; WAL segments
    log_retention_ms: int = 3_600_000           # [log.retention.ms] Kafka's 7 days; the table keeps the rest
    log_retention_bytes: int = -1               # [log.retention.bytes]
    wal_index_max_bytes: int = DEFAULT_INDEX_MAX_BYTES  # bounds the WAL index in memory
    group_initial_rebalance_delay_ms: int = 3000  # [group.initial.rebalance.delay.ms]
    group_min_session_timeout_ms: int = 6000    # [group.min.session.timeout.ms]
    group_max_session_timeout_ms: int = 1_800_000  # [group.max.session.timeout.ms]
    transaction_max_timeout_ms: int = 900_000   # [transaction.max.timeout.ms]
    wal_linger_ms: float = 0.0
    spark_remote: str | None = None
    table_commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS    # ack-on wal: linger of a table commit
    table_commit_idle_ms: int = DEFAULT_COMMIT_IDLE_MS            # ack-on wal: commit once input is quiet; 0: off
    table_compaction_interval_ms: int = DEFAULT_COMPACTION_INTERVAL_MS  # 0: no background compaction
    table: TableConfig = field(default_factory=TableConfig)       # database, file sizes, per-topic settings
    metastore_uris: str | None = None           # [hive.metastore.uris]; None: embedded Derby
    spark_connect_port: int | None = None       # [spark.connect.grpc.binding.port]; None: a free port; 0: off
    thrift_port: int = 0                        # [hive.server2.thrift.port]; 0: off
    metrics_port: int | None = None
    node_id: int = 0
    cluster_brokers: tuple[ClusterBroker, ...] | None = None  # [pipeline.cluster.brokers]; None: alone
    brokers: int = 1                            # `serve --brokers N`: a supervisor of N brokers
    cluster_id: str = "pipeline"
    cluster_leadership: str = "static"          # [pipeline.cluster.leadership]: static | database
    broker_session_timeout_ms: int = 9000       # [broker.session.timeout.ms] (Kafka KRaft's default)
    broker_heartbeat_interval_ms: int = 2000    # [broker.heartbeat.interval.ms] (Kafka KRaft's default)
    sasl_enabled_mechanisms: str = ",".join(DEFAULT_MECHANISMS)  # [sasl.enabled.mechanisms]
    listener_overrides: tuple = ()              # [listener.name.<name>.ssl.*/sasl.enabled.mechanisms], KIP-103:
    # ((listener name lower case, ((ServerConfig field, value), ...)), ...); see listener_config()
    failed_authentication_delay_ms: int = 100   # [connection.failed.authentication.delay.ms], Kafka's default
    authorizer_class_name: str = ""             # [authorizer.class.name]; empty: no authorizer
    super_users: str = ""                       # [super.users]
    allow_everyone_if_no_acl_found: bool = False  # [allow.everyone.if.no.acl.found]
    schema_registry_listener: str | None = None  # [schema.registry.listeners] http[s]://HOST:PORT; None: off
    schema_registry_authentication_method: str = "NONE"  # [schema.registry.authentication.method]


# -- parsers: (value, text) -> value ---------------------------------------------------------
# ``text`` is True for the environment and flags (strings to convert), False for
# TOML values (already typed: a quoted "10" is not a number). Each raises
# ValueError saying what was expected.

Parser = Callable[[Any, bool], Any]


def integer(minimum: int = 0, maximum: int | None = None) -> Parser:
    """An int in [minimum, maximum]."""
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(value: Any, text: bool) -> int:
        if text and isinstance(value, str):
            try:
                value = int(value.strip().replace("_", ""))
            except ValueError:
                raise ValueError(f"expected {expected}, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
                maximum is not None and value > maximum):
            raise ValueError(f"expected {expected}, got {value!r}")
        return value

    return parse


def number(minimum: float = 0.0) -> Parser:
    """A float >= minimum (an int is taken as one)."""

    def parse(value: Any, text: bool) -> float:
        if text and isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(f"expected a number >= {minimum:g}, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
            raise ValueError(f"expected a number >= {minimum:g}, got {value!r}")
        return float(value)

    return parse


def boolean(value: Any, text: bool) -> bool:
    """true/false (any case, from text)."""
    if text and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def string(value: Any, text: bool) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value.strip()


def choice(*options: str, convert: Callable[[str], Any] = str) -> Parser:
    """One of ``options`` (exactly), turned into ``convert(value)``."""

    def parse(value: Any, text: bool) -> Any:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return convert(value)

    return parse


def registry_listener(value: Any, text: bool) -> str:
    """The Schema Registry's listener, Confluent Schema Registry's ``listeners`` form:
    ``http://HOST:PORT`` or ``https://HOST:PORT`` (one; port 0 picks a free one)."""
    from urllib.parse import urlsplit

    url = string(value, text)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"expected http://HOST:PORT or https://HOST:PORT, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def listener_list(value: Any, text: bool) -> tuple[str, int, tuple | None]:
    """Kafka's ``listeners`` / ``advertised.listeners`` (KIP-103): ``NAME://HOST:PORT[,...]``, or
    ``HOST:PORT`` for one PLAINTEXT listener -> (first host, first port, every Endpoint, or None
    when the value is that one PLAINTEXT listener); port 0 picks a free one."""
    from pipeline.network.listeners import parse_endpoints

    endpoints = parse_endpoints(string(value, text))
    first = endpoints[0]
    return first.host, first.port, (None if len(endpoints) == 1 and first.name == "PLAINTEXT" else endpoints)


def protocol_map(value: Any, text: bool) -> tuple[tuple[str, str], ...]:
    """Kafka's ``listener.security.protocol.map``: ``NAME:PROTOCOL[,...]``."""
    from pipeline.network.listeners import parse_protocol_map

    return parse_protocol_map(string(value, text))


def tls_protocols(value: Any, text: bool) -> tuple[str, ...]:
    """Kafka's ``ssl.enabled.protocols``: ``TLSv1.2,TLSv1.3`` (a TOML array is taken too)."""
    from pipeline.security.tls import parse_protocols

    return parse_protocols(",".join(value) if isinstance(value, list) else string(value, text))


def cluster_brokers(value: Any, text: bool) -> tuple:
    """``pipeline.cluster.brokers``: ``ID@HOST:PORT[,...]`` (every broker of the cluster, like Kafka's
    ``controller.quorum.voters``) -> ``pipeline.cluster.membership.ClusterBroker``s sorted by id."""
    from pipeline.cluster.membership import parse_brokers

    return parse_brokers(string(value, text))


def secret(value: Any, text: bool) -> str:
    """A password: any non-empty string, shown as ``[hidden]`` (Kafka's Password type)."""
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return value


def metadata_url(value: Any, text: bool) -> str:
    """A PostgreSQL URL, ``postgresql://USER@HOST:PORT/DB`` (libpq's form; ``postgres://`` too)."""
    from pipeline.metadata.database import is_postgres_url

    url = string(value, text)
    if not is_postgres_url(url):
        raise ValueError(f"expected a postgresql://USER@HOST:PORT/DB URL, got {url!r}")
    return url


def path(value: Any, text: bool) -> Path:
    """A filesystem path (relative to the working directory)."""
    return Path(string(value, text))


def log_level(value: Any, text: bool) -> str:
    """A ``logging`` level name, upper-cased."""
    level_number(string(value, text))
    name = value.strip().upper()
    return "WARNING" if name == "WARN" else name


def _min_files(value: Any, text: bool) -> int:
    return integer(2)(value, text)


def _authorizer_name(value: Any, text: bool) -> str:
    from pipeline.security.acl import AUTHORIZER_NAMES

    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    name = value.strip()
    if name and name not in AUTHORIZER_NAMES:
        raise ValueError(f"expected empty or one of {', '.join(sorted(AUTHORIZER_NAMES))}, got {name!r}")
    return name


def _super_users(value: Any, text: bool) -> str:
    from pipeline.security.acl import parse_super_users

    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    users = value.strip()
    parse_super_users(users)  # InvalidAclError is a ValueError
    return users


def _sasl_mechanisms(value: Any, text: bool) -> str:
    """``sasl.enabled.mechanisms``: ``PLAIN,SCRAM-SHA-256`` (a TOML array is taken too), as that
    canonical comma-separated text."""
    from pipeline.security.sasl import SUPPORTED_MECHANISMS

    items = value if isinstance(value, list) else string(value, text).split(",")
    mechanisms = tuple(dict.fromkeys(str(m).strip().upper() for m in items if str(m).strip()))
    unknown = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if not mechanisms or unknown:
        raise ValueError(f"expected some of {', '.join(SUPPORTED_MECHANISMS)}, got {value!r}")
    return ",".join(mechanisms)


# -- the keys ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key.

    Attributes:
        name: the key (``num.network.threads``).
        fields: the ``ServerConfig`` field(s) it sets; ``table.<f>`` is a field of
            ``ServerConfig.table``, ``log.<f>`` of ``LogConfig``. Two fields take a
            (host, port) value.
        parse: (value, from text) -> value; raises ValueError.
        help: what it means, with units.
        flag: the command-line option (``--network-threads``).
        metavar: how the flag's value is shown in ``--help``.
        unset: what the default None means (``= max.connections``), if it can be None.
        group: the ``--help`` section.
        top_level: the flag is an option of ``pipeline`` itself (``--log-level``),
            also accepted after ``serve`` and ``config show``.
    """

    name: str
    fields: tuple[str, ...]
    parse: Parser
    help: str
    flag: str
    metavar: str | None = None
    unset: str | None = None
    group: str = "server"
    top_level: bool = False

    @property
    def env(self) -> str:
        """The environment variable: ``PIPELINE_`` + the key upper-cased, dots as underscores."""
        return ENV_PREFIX + self.name.upper().replace(".", "_")

    @property
    def dest(self) -> str:
        """The argparse destination of ``flag``."""
        return self.flag.lstrip("-").replace("-", "_")

    def show(self, value: Any) -> Any:
        """``value`` as ``config show`` prints it (JSON-able)."""
        if value is None:
            return None
        if self.parse is secret:
            return "[hidden]"
        if self.parse is metadata_url or self.parse is registry_listener:
            from pipeline.metadata.database import redact_url

            return redact_url(value)
        if isinstance(value, tuple) and len(self.fields) == 1:  # lists: "a,b" (pairs "n:v,n:v")
            return ",".join(":".join(v) if isinstance(v, tuple) else str(v) for v in value)
        if len(self.fields) == 3:  # listeners: (first host, first port, every endpoint or None)
            host, port, endpoints = value
            if host is None:
                return None
            if endpoints:
                return ",".join(str(e) for e in (type(endpoints[0])(endpoints[0].name, host, port), *endpoints[1:]))
            return f"PLAINTEXT://{host}:{port}"
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, str):  # Mode is a str enum
            return str(getattr(value, "value", value))
        return value


_MODES = ("multiqueue", "baseline", "shared-unmuted")


def _mode(value: str) -> Mode:
    return Mode(value)


_KEY_LIST: list[Key] = [
    # -- listener and broker identity
    Key("listeners", ("listen_host", "listen_port", "listeners"), listener_list,
        "where to listen: NAME://HOST:PORT[,NAME://HOST:PORT...] (KIP-103; HOST:PORT: one PLAINTEXT "
        "listener); port 0 picks a free one", "--listen", "HOST:PORT", group="listener"),
    Key("advertised.listeners", ("advertised_host", "advertised_port", "advertised_listeners"), listener_list,
        "what Metadata, FindCoordinator and DescribeCluster tell a client, per listener name "
        "(NAME://HOST:PORT[,...]; HOST:PORT: the first listener's)", "--advertised-listener", "HOST:PORT",
        unset="each listener's own address", group="listener"),
    Key("listener.security.protocol.map", ("listener_security_protocol_map",), protocol_map,
        "security protocol of each listener name: NAME:PROTOCOL[,...], PROTOCOL one of PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL", "--listener-security-protocol-map", "NAME:PROTOCOL,...", group="listener"),
    Key("ssl.keystore.location", ("ssl_keystore_location",), path,
        "keystore with the server's certificate chain and private key, for SSL and SASL_SSL listeners "
        "(PEM or PKCS12, ssl.keystore.type)",
        "--ssl-keystore-location", "FILE", unset="none (needed by a TLS listener)", group="TLS"),
    Key("ssl.keystore.type", ("ssl_keystore_type",), choice("PEM", "PKCS12"),
        "keystore format: PEM or PKCS12 (Kafka's JKS: convert with keytool -importkeystore -deststoretype PKCS12)",
        "--ssl-keystore-type", "PEM|PKCS12", group="TLS"),
    Key("ssl.keystore.password", ("ssl_keystore_password",), secret,
        "password of a PKCS12 keystore (never shown or logged)",
        "--ssl-keystore-password", "PASSWORD", unset="none", group="TLS"),
    Key("ssl.key.password", ("ssl_key_password",), secret,
        "password of an encrypted private key in a PEM keystore (never shown or logged)",
        "--ssl-key-password", "PASSWORD", unset="none (key not encrypted)", group="TLS"),
    Key("ssl.truststore.location", ("ssl_truststore_location",), path,
        "CAs client certificates must chain to (with ssl.client.auth): a PEM bundle or a PKCS12 truststore",
        "--ssl-truststore-location", "FILE", unset="the system's CAs", group="TLS"),
    Key("ssl.truststore.type", ("ssl_truststore_type",), choice("PEM", "PKCS12"),
        "truststore format: PEM or PKCS12", "--ssl-truststore-type", "PEM|PKCS12", group="TLS"),
    Key("ssl.truststore.password", ("ssl_truststore_password",), secret,
        "password of a PKCS12 truststore (never shown or logged)",
        "--ssl-truststore-password", "PASSWORD", unset="none", group="TLS"),
    Key("ssl.client.auth", ("ssl_client_auth",), choice("none", "requested", "required"),
        "client certificates: none, requested (verified if sent) or required (a client without one is "
        "closed); the principal of a client with one is User:<subject DN>",
        "--ssl-client-auth", "none|requested|required", group="TLS"),
    Key("ssl.enabled.protocols", ("ssl_enabled_protocols",), tls_protocols,
        "TLS versions accepted: TLSv1.2, TLSv1.3", "--ssl-enabled-protocols", "TLSv1.2,TLSv1.3", group="TLS"),
    Key("pipeline.ssl.handshake.timeout.ms", ("ssl_handshake_timeout_ms",), integer(1),
        "close a TLS connection whose handshake is not complete this long after accept (ms)",
        "--ssl-handshake-timeout-ms", "MS", group="TLS"),
    Key("node.id", ("node_id",), integer(0), "this broker's id in Metadata", "--node-id", "N", group="listener"),
    Key("pipeline.cluster.brokers", ("cluster_brokers",), cluster_brokers,
        "every broker of the cluster as ID@HOST:PORT[,...] (Kafka's controller.quorum.voters form), this one "
        "included (its node.id): partition leaders and group coordinators are spread over them; set by "
        "`serve --brokers N` for its brokers", "--cluster-brokers", "ID@HOST:PORT,...",
        unset="none: a cluster of this broker alone", group="listener"),
    Key("pipeline.brokers", ("brokers",), integer(1),
        "run this many brokers on this machine under one supervisor (node ids 0..N-1, listening on the "
        "--listen port and the next N-1), one shared Spark Connect server; 1: this process is the broker",
        "--brokers", "N", group="listener"),
    Key("pipeline.cluster.id", ("cluster_id",), string,
        "the cluster id in Metadata (Kafka keeps it in meta.properties, not a property)",
        "--cluster-id", "ID", group="listener"),
    Key("pipeline.cluster.leadership", ("cluster_leadership",), choice("static", "database"),
        "static: partition leaders and group coordinators follow the broker list (pipeline.cluster.brokers), "
        "a dead broker's partitions wait for it; database: brokers register with leases in the metadata "
        "database (pipeline.metadata.url, else SQLite under DATA_DIR), one of them is the controller and "
        "moves a dead broker's partitions and groups to live ones (with pipeline.ack.on=wal, once its WAL, "
        "on the shared data directory, is drained into the table)",
        "--cluster-leadership", "static|database", group="listener"),
    Key("broker.session.timeout.ms", ("broker_session_timeout_ms",), integer(1),
        "with pipeline.cluster.leadership=database: a broker whose heartbeats stop this long loses its "
        "membership, and its partitions move (ms); with pipeline.metadata.url above "
        f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS} ms plus broker.heartbeat.interval.ms", "--broker-session-timeout-ms",
        "MS", group="listener"),
    Key("broker.heartbeat.interval.ms", ("broker_heartbeat_interval_ms",), integer(1),
        "with pipeline.cluster.leadership=database: how often a broker renews its membership (ms)",
        "--broker-heartbeat-interval-ms", "MS", group="listener"),
    # -- the request path
    Key("pipeline.mode", ("mode",), choice(*_MODES, convert=_mode),
        "multiqueue: N queues routed by crc32(connection id) % N, one handler each (AutoMQ); "
        "baseline: classic Kafka shared queue + handler pool + mute until response; shared-unmuted: "
        "benchmark ablation that breaks per-connection ordering on purpose",
        "--mode", "|".join(_MODES), group="request path"),
    Key("pipeline.queues", ("queues",), integer(1),
        "multiqueue: request queues = RequestHandlers", "--queues", "N", group="request path"),
    Key("num.io.threads", ("io_threads",), integer(1),
        "baseline and shared-unmuted: RequestHandler pool size", "--io-threads", "N", group="request path"),
    Key("num.network.threads", ("network_threads",), integer(1),
        "Processors (trio tasks of one event loop)", "--network-threads", "N", group="request path"),
    Key("queued.max.requests", ("queued_max_requests",), integer(1),
        "requests that may wait in the RequestChannel; multiqueue splits it evenly over its queues",
        "--queued-max-requests", "N", group="request path"),
    Key("queued.max.request.bytes", ("queued_max_request_bytes",), integer(1),
        "MemoryPool: bytes all received requests may hold until handled; a connection whose next request "
        "does not fit is muted until memory returns", "--queued-max-request-bytes", "BYTES",
        group="request path"),
    Key("max.in.flight.requests.per.connection", ("max_in_flight_requests_per_connection",), integer(1),
        "multiqueue: requests of one connection read but not yet answered before its reading pauses "
        "(the producer's property, enforced by the server; baseline is always 1)",
        "--max-in-flight-requests-per-connection", "N", group="request path"),
    Key("socket.request.max.bytes", ("socket_request_max_bytes",), integer(1),
        "largest request frame (bytes); larger, negative, or larger than the pool: connection closed",
        "--socket-request-max-bytes", "BYTES", group="request path"),
    Key("max.connections", ("max_connections",), integer(1),
        "open connections in all; more are closed at accept", "--max-connections", "N", group="request path"),
    Key("max.connections.per.ip", ("max_connections_per_ip",), integer(1),
        "open connections of one client address", "--max-connections-per-ip", "N",
        unset="= max.connections", group="request path"),
    Key("connections.max.idle.ms", ("connections_max_idle_ms",), integer(1),
        "close connections idle this long (ms)", "--connections-max-idle-ms", "MS", group="request path"),
    Key("pipeline.request.receive.timeout.ms", ("request_receive_timeout_ms",), integer(1),
        "close a connection whose request frame is not complete this long after its first byte "
        "(ms, time muted excluded)", "--request-receive-timeout-ms", "MS", group="request path"),
    Key("pipeline.response.buffer.max.bytes", ("response_buffer_max_bytes",), integer(1),
        "stop reading a connection while this many bytes of its responses are unsent",
        "--response-buffer-max-bytes", "BYTES", group="request path"),
    Key("pipeline.response.send.timeout.ms", ("response_send_timeout_ms",), integer(1),
        "close a connection that takes none of its responses for this long (ms)",
        "--response-send-timeout-ms", "MS", group="request path"),
    Key("num.partitions", ("num_partitions",), integer(1),
        "partitions of an auto-created topic", "--num-partitions", "N", group="request path"),
    Key("auto.create.topics.enable", ("auto_create_topics",), boolean,
        "create a topic (num.partitions partitions) on its first Metadata request; false: topics are "
        "created with CreateTopics (AdminClient, kafka-topics.sh) only, others get UNKNOWN_TOPIC_OR_PARTITION",
        "--auto-create-topics-enable", "true|false", group="request path"),
    # -- persistence
    Key("pipeline.ack.on", ("ack_on",), choice("wal", "spark"),
        "acknowledge a produce once its records are fsynced in the write-ahead log (wal) or once the "
        "Spark commit holding them is done (spark)", "--ack-on", "wal|spark", group="persistence"),
    Key("linger.ms", ("linger_ms",), number(0.0),
        "with pipeline.ack.on=spark: commit a group this long after its first record (ms)",
        "--linger-ms", "MS", group="persistence"),
    Key("table.commit.max.records", ("batch_max_records",), integer(1),
        "commit to the table early once a group holds this many records (a flush size, not the "
        "producer's batch.size)", "--batch-max-records", "N", group="persistence"),
    Key("table.commit.max.bytes", ("batch_max_bytes",), integer(1),
        "commit to the table early once a group holds this many bytes of record batches "
        "(decompressed)", "--batch-max-bytes", "BYTES", group="persistence"),
    Key("buffer.memory", ("buffer_memory",), integer(1),
        "bytes of record batches (decompressed) buffered for persistence above which handlers wait",
        "--buffer-memory", "BYTES", group="persistence"),
    Key("pipeline.data.dir", ("data_dir",), path,
        "tables under DIR/tables; WAL, checkpoint and metastore under DIR/_pipeline (not Kafka's "
        "log.dirs: it holds tables, not log segments)", "--data-dir", "DIR", group="persistence"),
    Key("pipeline.metadata.url", ("metadata_url",), metadata_url,
        "keep topics, consumer groups and offsets, ACLs, SCRAM users, transactions and producer-id blocks "
        "in this PostgreSQL database, shared by brokers on several hosts (postgresql://USER@HOST:PORT/DB; "
        "a password is better in PGPASSWORD or ~/.pgpass than in the URL)", "--metadata-url", "URL",
        unset="SQLite files under DATA_DIR/_pipeline", group="persistence"),
    Key("log.segment.bytes", ("log_segment_bytes",), integer(1),
        "roll write-ahead log segment files at this size (bytes); the WAL is the log consumers fetch "
        "recent records from", "--log-segment-bytes", "BYTES", group="persistence"),
    Key("log.retention.ms", ("log_retention_ms",), integer(-1),
        "keep WAL segments this long after their last append (ms, -1: no time limit); older records "
        "are fetched from the table; a topic's retention.ms overrides it", "--log-retention-ms", "MS",
        group="persistence"),
    Key("log.retention.bytes", ("log_retention_bytes",), integer(-1),
        "keep at most this many WAL bytes per partition (-1: no size limit); a topic's "
        "retention.bytes overrides it", "--log-retention-bytes", "BYTES", group="persistence"),
    Key("pipeline.wal.index.max.bytes", ("wal_index_max_bytes",), integer(1),
        "memory the index of the retained WAL may take (48 bytes per produce request and partition); "
        "above it the oldest segments the table holds are deleted before their retention (their offsets "
        "are then read from the table)", "--wal-index-max-bytes", "BYTES", group="persistence"),
    Key("pipeline.wal.linger.ms", ("wal_linger_ms",), number(0.0),
        "wait this long to gather more requests into one WAL fsync (ms; 0: group whatever arrived "
        "during the previous fsync)", "--wal-linger-ms", "MS", group="persistence"),
    # -- consumer groups
    Key("group.initial.rebalance.delay.ms", ("group_initial_rebalance_delay_ms",), integer(0),
        "wait this long for more members before the first rebalance of an empty group (ms)",
        "--group-initial-rebalance-delay-ms", "MS", group="consumer groups"),
    Key("group.min.session.timeout.ms", ("group_min_session_timeout_ms",), integer(1),
        "smallest session.timeout.ms a member may ask for (ms)", "--group-min-session-timeout-ms", "MS",
        group="consumer groups"),
    Key("group.max.session.timeout.ms", ("group_max_session_timeout_ms",), integer(1),
        "largest session.timeout.ms a member may ask for (ms)", "--group-max-session-timeout-ms", "MS",
        group="consumer groups"),
    Key("transaction.max.timeout.ms", ("transaction_max_timeout_ms",), integer(1),
        "largest transaction.timeout.ms a transactional producer may ask for (ms)",
        "--transaction-max-timeout-ms", "MS", group="consumer groups"),
    # -- Spark and the table
    Key("spark.master", ("spark_master",), string,
        "Spark master URL: local[*] (embedded) or spark://HOST:PORT", "--spark-master", "URL",
        group="Spark and the table"),
    Key("spark.remote", ("spark_remote",), string,
        "Spark Connect server sc://HOST:PORT instead of a master", "--spark-remote", "URL",
        unset="none: spark.master", group="Spark and the table"),
    Key("hive.metastore.uris", ("metastore_uris",), string,
        "external Hive metastore, e.g. thrift://127.0.0.1:9083", "--metastore-uris", "URIS",
        unset="embedded, in DATA_DIR/_pipeline/metastore_db", group="Spark and the table"),
    Key("spark.connect.grpc.binding.port", ("spark_connect_port",), integer(0, 65535),
        "serve Spark Connect on 127.0.0.1:PORT from the server's driver, so other sessions and "
        "`pipeline sql` query the tables while it runs; 0: off", "--spark-connect-port", "PORT",
        unset="a free port, published in DATA_DIR/_pipeline/endpoints.json (where `pipeline sql` looks)",
        group="Spark and the table"),
    Key("hive.server2.thrift.port", ("thrift_port",), integer(0, 65535),
        "serve JDBC/ODBC (Spark Thrift Server, jdbc:hive2://127.0.0.1:PORT/) on 127.0.0.1; 0: off",
        "--thrift-port", "PORT", group="Spark and the table"),
    Key("table.database", ("table.database",), string,
        "catalog database of the tables", "--table-database", "NAME", group="Spark and the table"),
    Key("table.commit.interval.ms", ("table_commit_interval_ms",), integer(1),
        "with pipeline.ack.on=wal: commit to the table this often (ms); with spark linger.ms applies",
        "--table-commit-interval-ms", "MS", group="Spark and the table"),
    Key("table.commit.idle.ms", ("table_commit_idle_ms",), integer(0),
        "with pipeline.ack.on=wal: also commit once no record has arrived for this long (ms), if at "
        "least 4 MiB wait; 0: only table.commit.interval.ms", "--table-commit-idle-ms", "MS",
        group="Spark and the table"),
    Key("table.compaction.interval.ms", ("table_compaction_interval_ms",), integer(0),
        "look for partitions to compact this often (ms); 0: never", "--table-compaction-interval-ms", "MS",
        group="Spark and the table"),
    Key("table.compaction.min.files", ("table.compaction_min_files",), _min_files,
        "compact a time partition once it has this many small files (>= 2)",
        "--table-compaction-min-files", "N", group="Spark and the table"),
    Key("table.target.file.bytes", ("table.target_file_bytes",), integer(1),
        "compaction merges small files up to this size (bytes)", "--table-target-file-bytes", "BYTES",
        group="Spark and the table"),
    Key("file.delete.delay.ms", ("table.file_delete_delay_ms",), integer(0),
        "keep files a compaction or retention replaced this long for running queries (ms)",
        "--file-delete-delay-ms", "MS", group="Spark and the table"),
    # -- SASL (pipeline.security.sasl)
    Key("sasl.enabled.mechanisms", ("sasl_enabled_mechanisms",), _sasl_mechanisms,
        "SASL mechanisms SASL_PLAINTEXT/SASL_SSL listeners offer: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 "
        "(users: `pipeline users add`)", "--sasl-enabled-mechanisms", "MECH,...", group="SASL"),
    Key("connection.failed.authentication.delay.ms", ("failed_authentication_delay_ms",), integer(0),
        "hold a failed authentication's answer and close this long (KIP-306), doubled for every further "
        "failure from the same address within a minute, up to 50 times (ms; 0: no delay)",
        "--failed-authentication-delay-ms", "MS", group="SASL"),
    # -- observability
    Key("pipeline.metrics.port", ("metrics_port",), integer(0, 65535),
        "serve Prometheus /metrics, /healthz and /readyz on 127.0.0.1:PORT (0: a free port)",
        "--metrics-port", "PORT", unset="off", group="logs and metrics"),
    Key("log.level", ("log.level",), log_level,
        "logging level: DEBUG, INFO, WARNING, ERROR", "--log-level", "LEVEL",
        group="logs and metrics", top_level=True),
    Key("log.format", ("log.format",), choice(*FORMATS),
        "log lines: plain text or one JSON object per line", "--log-format", "|".join(FORMATS),
        group="logs and metrics", top_level=True),
    # -- authorization (Kafka's ACLs, pipeline.security.acl)
    Key("authorizer.class.name", ("authorizer_class_name",), _authorizer_name,
        "turn on ACL authorization: pipeline, or Kafka's org.apache.kafka.metadata.authorizer.StandardAuthorizer "
        "or kafka.security.authorizer.AclAuthorizer (same rules); empty: no authorizer, everything allowed",
        "--authorizer-class-name", "NAME", group="security"),
    Key("super.users", ("super_users",), _super_users,
        "principals allowed everything, separated by semicolons (User:admin;User:ops)",
        "--super-users", "PRINCIPALS", group="security"),
    Key("allow.everyone.if.no.acl.found", ("allow_everyone_if_no_acl_found",), boolean,
        "with the authorizer on: allow a resource that no ACL matches (else deny)",
        "--allow-everyone-if-no-acl-found", "true|false", group="security"),
    # -- the Schema Registry (pipeline.registry)
    Key("schema.registry.url", ("table.schema_registry",), registry_listener,
        "an external Confluent-compatible registry (Confluent, Karapace, Apicurio, Redpanda; http[s]://"
        "[USER:PASSWORD@]HOST:PORT) where avro topics' writer schemas are looked up by the id in a value's "
        "wire-format header; unset: pipeline's own registry when schema.registry.listeners serves one",
        "--schema-registry-url", "http[s]://HOST:PORT", unset="pipeline's own registry, if served",
        group="schema registry"),
    Key("schema.registry.listeners", ("schema_registry_listener",), registry_listener,
        "serve a Confluent-compatible Schema Registry on this address: http://HOST:PORT, or https://HOST:PORT "
        "with ssl.keystore.location's PEM certificate and key (port 0: a free one); its schemas are in the "
        "metadata store, so every broker serves the same registry",
        "--schema-registry-listeners", "http[s]://HOST:PORT", unset="off", group="schema registry"),
    Key("schema.registry.authentication.method", ("schema_registry_authentication_method",),
        choice("NONE", "BASIC"),
        "NONE, or BASIC: every registry request needs HTTP basic authentication as one of the broker's "
        "SCRAM users (`pipeline users add`)",
        "--schema-registry-authentication-method", "NONE|BASIC", group="schema registry"),
]

KEYS: dict[str, Key] = {k.name: k for k in _KEY_LIST}
"""Every configuration key, in ``--help`` order."""
ENV_KEYS: dict[str, Key] = {k.env: k for k in _KEY_LIST}
"""Environment variable -> key."""


def _value_format(v: Any, text: bool = False) -> str:
    if v not in VALUE_FORMATS:
        raise ValueError(f"expected one of {', '.join(VALUE_FORMATS)}, got {v!r}")
    return v


def _wire_format(v: Any, text: bool = False) -> str:
    if v not in ("auto", "confluent", "none"):
        raise ValueError(f"expected auto, confluent or none, got {v!r}")
    return v


def _schema(v: Any, text: bool = False) -> str:
    """A DDL string, or an Avro schema given as a TOML table/array or a JSON string."""
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return string(v, text)


def _granularity(v: Any, text: bool = False) -> Granularity:
    try:
        return Granularity(v)
    except ValueError:
        raise ValueError(f"expected one of {[g.value for g in Granularity]}, got {v!r}") from None


TOPIC_KEYS: dict[str, tuple[Parser, str]] = {
    "table.partition.granularity": (_granularity, "granularity"),
    "table.retention.days": (integer(1), "retention_days"),
    "value.format": (_value_format, "value_format"),
    "value.schema": (_schema, "value_schema"),
    "value.wire.format": (_wire_format, "value_wire_format"),
}
"""Keys of a ``[topic."<name>"]`` table (file only) -> (parser, TopicTableConfig field)."""


def default_value(key: Key) -> Any:
    """The key's default, read from the dataclass that defines it (``ServerConfig``,
    its ``TableConfig``, ``LogConfig``): never repeated here."""
    values = tuple(_get(ServerConfig(), LogConfig(), f) for f in key.fields)
    return values if len(values) > 1 and any(v is not None for v in values) else values[0]


REFERENCE_COMMAND = ".venv/bin/pipeline config docs > docs/configuration.md"
"""How docs/configuration.md is made (tests/docs checks the file equals ``reference_markdown()``)."""

_REFERENCE_INTRO = """\
# Configuration

<!-- Generated from pipeline/config.py (KEYS, ServerConfig and the dataclasses it names) by
     `{command}`; do not edit: tests/docs fails when this file differs from that output. -->

Every setting of `pipeline serve` has one **key**: Kafka's property name where
Kafka has one with that meaning, Spark's or Hive's where they own it, and
`table.*`, `log.*` or `pipeline.*` for our own. Each key can be given three
ways, each overriding the one before (defaults < file < environment < flags):

- a TOML file, `--config FILE`: `num.network.threads = 4`,
  `listeners = "PLAINTEXT://0.0.0.0:9092"`; plus per-topic `[topic."NAME"]`
  tables with the keys {topic_keys} (in the file as defaults; `value.*` are topic
  configs too, set by CreateTopics and AlterConfigs; [table.md](table.md#configuration)), and `listener.name.<name>.<key>` for a
  listener's own `ssl.*` keys and `sasl.enabled.mechanisms` (KIP-103, file only;
  [security.md](security.md));
- an environment variable `PIPELINE_` + the key upper-cased with dots as
  underscores: `PIPELINE_NUM_NETWORK_THREADS=4` (every `PIPELINE_*` variable
  must name a key);
- a flag of `pipeline serve`, given in the table below (`--log-level` and
  `--log-format` may also come before the command: `pipeline --log-format json serve`).

`.venv/bin/pipeline config show [--config FILE] [flags...]` prints the
effective value of every key and where it came from (`default`, `file:PATH`,
`env:NAME`, `flag:--name`), as a table or with `--format json`. An unknown key
or a bad value, from any source, stops the server before anything starts,
naming the key and its source (exit code 2). `pipeline sql`, `pipeline compact`
and `pipeline users` read the keys they use from the same three sources (their
`--help` lists them). Sizes are in bytes, times in milliseconds.
"""


def _reference_default(key: Key) -> str:
    """A key's default as docs/configuration.md shows it: ``Key.show`` of ``default_value``,
    ``Key.unset`` where the default is None, with sizes in MiB/GiB and times in s/min/h beside
    exact values."""
    default = default_value(key)
    if default is None:
        return key.unset or "none"
    shown = key.show(default)
    if isinstance(shown, bool):
        return "true" if shown else "false"
    if shown == "":
        return "empty"
    text = f"`{shown}`"
    if isinstance(shown, int) and shown > 0:  # bool was handled above
        if key.metavar == "BYTES" and shown >= 1 << 20 and shown % (1 << 20) == 0:
            text += f" ({shown >> 30} GiB)" if shown % (1 << 30) == 0 else f" ({shown >> 20} MiB)"
        elif key.metavar == "MS" and shown >= 60_000 and shown % 60_000 == 0:
            text += f" ({shown // 3_600_000} h)" if shown % 3_600_000 == 0 else f" ({shown // 60_000} min)"
        elif key.metavar == "MS" and shown >= 1000 and shown % 1000 == 0:
            text += f" ({shown // 1000} s)"
    return text


def reference_markdown() -> str:
    """docs/configuration.md: the prose above, then one table per ``Key.group`` (``KEYS`` order)
    of key, flag, default and meaning, every cell from ``KEYS`` and the dataclasses' defaults.

    Returns:
        The Markdown text, ending with a newline (``pipeline config docs`` prints it).
    """

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("<", "\\<")  # a pipe ends a cell; <x> is HTML

    out = [_REFERENCE_INTRO.format(command=REFERENCE_COMMAND,
                                   topic_keys=", ".join(f"`{name}`" for name in TOPIC_KEYS))]
    groups: dict[str, list[Key]] = {}
    for key in KEYS.values():
        groups.setdefault(key.group, []).append(key)
    for group, keys in groups.items():
        out.append(f"\n## {group[0].upper()}{group[1:]}\n\n| key | flag | default | meaning |\n|---|---|---|---|\n")
        for key in keys:
            flag = f"{key.flag} {key.metavar}" if key.metavar else key.flag
            out.append(f"| `{key.name}` | `{cell(flag)}` | {cell(_reference_default(key))} | {cell(key.help)} |\n")
    return "".join(out)


def _get(server: ServerConfig, log: LogConfig, name: str) -> Any:
    if name.startswith("log."):
        return getattr(log, name.removeprefix("log."))
    return server_value(server, name)


def server_value(server: ServerConfig, name: str) -> Any:
    """The value in ``server`` of key field ``name`` (a ``Key.fields`` entry that is not a
    ``log.*`` one: those live in ``LogConfig``)."""
    if name.startswith("table."):
        return getattr(server.table, name.removeprefix("table."))
    return getattr(server, name)


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def parse_value(key: Key, value: Any, source: str, text: bool) -> Any:
    """``key.parse`` with errors as ``ConfigError("SOURCE: KEY: what was expected")``."""
    try:
        return key.parse(value, text)
    except ValueError as exc:
        raise ConfigError(f"{source}: {key.name}: {exc}") from None


# -- the file ---------------------------------------------------------------------------------

def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


LISTENER_PREFIX = "listener.name."
LISTENER_KEYS = ("ssl.keystore.location", "ssl.keystore.type", "ssl.keystore.password", "ssl.key.password",
                 "ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.password", "ssl.client.auth",
                 "ssl.enabled.protocols", "sasl.enabled.mechanisms")
"""Keys a listener can override with Kafka's ``listener.name.<listener name, lower case>.<key>`` prefix
(KIP-103; Kafka ``ListenerName.configPrefix``): the TLS and SASL settings, so that, e.g., an internal
and an external SSL listener present different certificates. File only (the prefix has no flag)."""


def listener_override(name: str) -> tuple[str, str] | None:
    """``listener.name.internal.ssl.keystore.location`` -> (``internal``, ``ssl.keystore.location``);
    None if ``name`` has no listener prefix. The listener name ends at the first dot: listener
    names have none (Kafka ListenerName: letters, digits and underscores)."""
    if not name.startswith(LISTENER_PREFIX):
        return None
    rest = name[len(LISTENER_PREFIX):]
    listener, dot, key = rest.partition(".")
    return (listener, key) if dot and listener else None


@dataclass(slots=True)
class FileConfig:
    """What a configuration file sets.

    Attributes:
        values: key -> parsed value, for the keys the file sets.
        topics: the ``[topic."<name>"]`` tables.
        listeners: listener name (lower case) -> {key of ``LISTENER_KEYS``: parsed value}, from
            ``listener.name.<name>.<key>`` entries.
        sources: key (``topic.<name>.<key>`` for a topic's, the whole prefixed key for a
            listener's) -> ``file:PATH``.
    """

    values: dict[str, Any] = field(default_factory=dict)
    topics: dict[str, TopicTableConfig] = field(default_factory=dict)
    listeners: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def server(self) -> dict[str, Any]:
        """ServerConfig field -> value for the keys the file sets outside the table and the log."""
        out: dict[str, Any] = {}
        for name, value in self.values.items():
            key = KEYS[name]
            if key.fields[0].startswith(("table.", "log.")):
                continue
            out.update(zip(key.fields, value if len(key.fields) > 1 else (value,)))
        return out

    @property
    def table(self) -> TableConfig:
        """The default ``TableConfig`` with the file's table keys and topics applied."""
        fields = {KEYS[n].fields[0].removeprefix("table."): v for n, v in self.values.items()
                  if KEYS[n].fields[0].startswith("table.")}
        return replace(TableConfig(), **fields, topics=self.topics)


def load_config(file: str | Path) -> FileConfig:
    """Read and check a configuration file.

    Raises:
        ConfigError: the file is unreadable or not TOML, a key is unknown, or
            a value is wrong; the message names the file and the key.
    """
    file = Path(file)
    source = f"file:{file}"
    try:
        data = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    result = FileConfig()
    topic_tables = data.pop("topic", {})
    if not isinstance(topic_tables, dict):
        raise ConfigError(f"{source}: 'topic' must be a table of topics, e.g. [topic.\"orders\"]")
    for name, value in _flatten(data).items():
        override = listener_override(name)
        if override is not None:
            listener, key_name = override
            if key_name not in LISTENER_KEYS:
                raise ConfigError(f"{source}: {name}: a listener can override only "
                                  f"{', '.join(LISTENER_KEYS)} ({_suggest(key_name, list(LISTENER_KEYS))})")
            result.listeners.setdefault(listener.lower(), {})[key_name] = parse_value(
                KEYS[key_name], value, source, text=False)
            result.sources[name] = source
            continue
        key = KEYS.get(name)
        if key is None:
            raise ConfigError(f"{source}: unknown key {name!r} ({_suggest(name, list(KEYS))}"
                              "`pipeline config show` lists every key)")
        result.values[name] = parse_value(key, value, source, text=False)
        result.sources[name] = source
    for topic, settings in topic_tables.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"{source}: topic.{topic} must be a table of settings")
        topic_fields: dict[str, Any] = {}
        schema = settings.get("value", {}).pop("schema", None) if isinstance(settings.get("value"), dict) else None
        if schema is not None:  # an Avro schema given as a TOML table is not flattened
            settings = {**settings, "value.schema": schema}
        for name, value in _flatten(settings).items():
            if name not in TOPIC_KEYS:
                raise ConfigError(f"{source}: topic {topic!r}: unknown key {name!r} "
                                  f"({_suggest(name, list(TOPIC_KEYS))}known: {', '.join(sorted(TOPIC_KEYS))})")
            parse, target = TOPIC_KEYS[name]
            try:
                topic_fields[target] = parse(value, False)
            except ValueError as exc:
                raise ConfigError(f"{source}: topic {topic!r}: {name}: {exc}") from None
            result.sources[f"topic.{topic}.{name}"] = source
        result.topics[topic] = TopicTableConfig(**topic_fields)
    return result


# -- resolving --------------------------------------------------------------------------------

@dataclass(slots=True)
class Resolved:
    """The effective configuration.

    Attributes:
        server: the ``ServerConfig`` (``ServerConfig.table`` with the file's topics).
        log: the ``LogConfig``.
        values: key -> value (parsed; None where ``Key.unset`` applies).
        sources: key -> ``default``, ``file:PATH``, ``env:NAME`` or ``flag:--name``;
            also ``topic.<name>.<key>`` -> ``file:PATH`` for per-topic settings.
    """

    server: ServerConfig
    log: LogConfig
    values: dict[str, Any]
    sources: dict[str, str]

    def rows(self) -> list[dict[str, Any]]:
        """One ``{"key", "value", "source"}`` per key (``KEYS`` order), then per-topic settings."""
        rows = [{"key": name, "value": KEYS[name].show(self.values[name]), "source": self.sources[name]}
                for name in KEYS]
        for topic, settings in self.server.table.topics.items():
            for name, (_parse, attr) in TOPIC_KEYS.items():
                where = self.sources.get(f"topic.{topic}.{name}")
                if where is not None:
                    value = getattr(settings, attr)
                    rows.append({"key": f'topic."{topic}".{name}',
                                 "value": getattr(value, "value", value), "source": where})
        by_field = {key.fields[0]: name for name, key in KEYS.items() if name in LISTENER_KEYS}
        for listener, settings in self.server.listener_overrides:
            for target, value in settings:
                name = f"{LISTENER_PREFIX}{listener}.{by_field[target]}"
                rows.append({"key": name, "value": KEYS[by_field[target]].show(value),
                             "source": self.sources.get(name, "file")})
        return rows


def environment_values(environ: Mapping[str, str], keys: Mapping[str, Key] | None = None) -> dict[str, tuple[Any, str]]:
    """key -> (value, ``env:NAME``) for every ``PIPELINE_*`` variable of ``environ``.

    Args:
        keys: the keys to read (default all); a ``PIPELINE_*`` variable of another
            known key is then ignored, an unknown one is still an error.

    Raises:
        ConfigError: a ``PIPELINE_*`` variable that is no key's, or a bad value.
    """
    out: dict[str, tuple[Any, str]] = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        source = f"env:{name}"
        key = ENV_KEYS.get(name)
        if key is None:
            guess = name.removeprefix(ENV_PREFIX).lower().replace("_", ".")
            raise ConfigError(f"{source}: unknown key {guess!r} ({_suggest(name, list(ENV_KEYS))}every "
                              f"{ENV_PREFIX}* variable must name a key; `pipeline config show` lists them)")
        if keys is not None and key.name not in keys:
            continue
        out[key.name] = (parse_value(key, environ[name], source, text=True), source)
    return out


def resolve(config_file: str | Path | None = None, environ: Mapping[str, str] | None = None,
            flags: Mapping[str, tuple[Any, str]] | None = None) -> Resolved:
    """Defaults < ``config_file`` < ``environ`` (default ``os.environ``) < ``flags``.

    Args:
        flags: key -> (value, ``flag:--name``) for the flags given, values
            already parsed (``flag_values``).

    Raises:
        ConfigError: see the module docstring.
    """
    values = {name: default_value(key) for name, key in KEYS.items()}
    sources = {name: DEFAULT_SOURCE for name in KEYS}
    topics: dict[str, TopicTableConfig] = {}
    overrides: dict[str, dict[str, Any]] = {}
    if config_file is not None:
        file = load_config(config_file)
        values.update(file.values)
        sources.update(file.sources)
        topics = file.topics
        overrides = file.listeners
    layered = {**environment_values(os.environ if environ is None else environ), **(flags or {})}
    for name, (value, source) in layered.items():
        values[name] = value
        sources[name] = source
    if values["listeners"][2] or values["advertised.listeners"] and values["advertised.listeners"][2]:
        from pipeline.network.listeners import check_listeners

        try:
            check_listeners(values["listeners"][2] or (), (values["advertised.listeners"] or (0, 0, ()))[2] or (),
                            values["listener.security.protocol.map"])
        except ValueError as exc:
            raise ConfigError(f"{sources['listeners']}: listeners: {exc}") from None
    if overrides:
        names = {e.name.lower() for e in values["listeners"][2] or ()} or {"plaintext"}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(f"file:{config_file}: listener.name.{unknown[0]}.*: no listener named "
                              f"{unknown[0]!r} in listeners ({', '.join(sorted(names))}; names are compared in "
                              "lower case, as Kafka's listener.name prefix)")
    if values["pipeline.cluster.brokers"] is not None:
        if values["node.id"] not in {b.node_id for b in values["pipeline.cluster.brokers"]}:
            raise ConfigError(f"{sources['node.id']}: node.id {values['node.id']} is not in "
                              f"pipeline.cluster.brokers ({sources['pipeline.cluster.brokers']})")
        if values["listeners"][2] and len(values["listeners"][2]) > 1:
            raise ConfigError(f"{sources['listeners']}: listeners: a broker of a cluster "
                              "(pipeline.cluster.brokers) has one listener")
        if values["pipeline.brokers"] > 1:
            raise ConfigError(f"pipeline.brokers ({sources['pipeline.brokers']}) and pipeline.cluster.brokers "
                              f"({sources['pipeline.cluster.brokers']}) are both set: --brokers N makes the list itself")
    if values["pipeline.cluster.leadership"] == "database":
        if values["broker.heartbeat.interval.ms"] >= values["broker.session.timeout.ms"]:
            raise ConfigError(f"broker.heartbeat.interval.ms ({sources['broker.heartbeat.interval.ms']}) must be "
                              f"below broker.session.timeout.ms ({sources['broker.session.timeout.ms']})")
        stall_ms = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS + values["broker.heartbeat.interval.ms"]
        if values["pipeline.metadata.url"] is not None and values["broker.session.timeout.ms"] <= stall_ms:
            raise ConfigError(
                f"broker.session.timeout.ms ({sources['broker.session.timeout.ms']}) must be above {stall_ms} ms "
                f"with pipeline.metadata.url ({sources['pipeline.metadata.url']}): PostgreSQL ends a session of "
                f"a broker stalled inside a transaction after {PG_IDLE_IN_TRANSACTION_TIMEOUT_MS} ms "
                f"(pipeline.metadata.database), and until then the brokers waiting for its rows may miss their "
                f"heartbeats, every broker.heartbeat.interval.ms ({sources['broker.heartbeat.interval.ms']})")
    if values["pipeline.brokers"] > 1 and values["listeners"][2] and len(values["listeners"][2]) > 1:
        raise ConfigError(f"{sources['listeners']}: listeners: --brokers N gives each broker one listener")
    if values["spark.remote"] is not None and sources["spark.master"] != DEFAULT_SOURCE:
        raise ConfigError(f"spark.master ({sources['spark.master']}) and spark.remote "
                          f"({sources['spark.remote']}) are both set: give one")
    server_fields: dict[str, Any] = {}
    table_fields: dict[str, Any] = {}
    log_fields: dict[str, Any] = {}
    for name, key in KEYS.items():
        parts = values[name] if len(key.fields) > 1 else (values[name],)
        if len(key.fields) > 1 and parts is None:
            parts = (None, None)
        for target, value in zip(key.fields, parts):
            if target.startswith("table."):
                table_fields[target.removeprefix("table.")] = value
            elif target.startswith("log."):
                log_fields[target.removeprefix("log.")] = value
            else:
                server_fields[target] = value
    table = replace(TableConfig(), **table_fields, topics=topics)
    server_fields["listener_overrides"] = _listener_overrides(overrides)
    server = replace(ServerConfig(), **server_fields, table=table)
    return Resolved(server, LogConfig(**log_fields), values, sources)


def _listener_overrides(overrides: dict[str, dict[str, Any]]) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """``{listener: {key: value}}`` -> ``ServerConfig.listener_overrides``: (listener, ((field, value), ...))
    with ``ServerConfig`` field names, sorted (hashable and printable)."""
    return tuple((listener, tuple(sorted((KEYS[key].fields[0], value) for key, value in keys.items())))
                 for listener, keys in sorted(overrides.items()))
