"""Topic configs this broker honours: validation, incremental changes and descriptions (sans-I/O).

Only what is honoured is accepted (Kafka's LogConfig lists ~40 keys; here):

* ``retention.ms`` (default broker ``log.retention.ms``) and ``retention.bytes``
  (default ``log.retention.bytes``): how long / how much of a partition's
  write-ahead log Fetch serves from before the table; read with
  ``TopicCatalog.retention``.
* ``cleanup.policy``: ``delete`` only; ``compact`` is refused (the table keeps
  every record, nothing compacts by key).
* ``message.timestamp.type``: ``CreateTime`` only (records keep the
  producer's timestamps; LogAppendTime is not implemented).
* ``segment.bytes``: read-only, the broker's ``log.segment.bytes``: the WAL's
  segments are shared by every topic, so a per-topic size cannot be honoured.
* the typed-table settings ``value.format`` (raw, json, avro, protobuf), ``value.schema``
  and ``value.wire.format``: a topic override takes effect at the table's next
  commit, no restart (``pipeline.persist.group_sink``); without one, the
  ``[topic."<name>"]`` table of the config file gives the value
  (STATIC_BROKER_CONFIG), else the default (raw: the records table).
* the other table settings of ``[topic."<name>"]`` (``table.partition.granularity``,
  ``table.retention.days``): read-only, listed so admin tools show them.

Sources and synonyms follow Kafka's DescribeConfigs (KIP-226): a topic
override is DYNAMIC_TOPIC_CONFIG; otherwise the broker's value, which is
STATIC_BROKER_CONFIG when the broker's configuration sets it and
DEFAULT_CONFIG when it is the default; synonyms list the override and then the
broker key, in that order (Kafka ``ConfigHelper.createTopicConfigEntry``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from pipeline.table.table_config import TOPIC_CONFIG_FIELDS, VALUE_FORMATS, TableConfig, TopicTableConfig

if TYPE_CHECKING:
    from pipeline.config import ServerConfig


class ConfigSource(enum.IntEnum):
    """Kafka ``DescribeConfigsResponse.ConfigSource`` (KIP-226)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class ConfigType(enum.IntEnum):
    """Kafka ``DescribeConfigsResponse.ConfigType`` (KIP-569, DescribeConfigs v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs ``config_operation`` (KIP-339)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class InvalidConfigError(ValueError):
    """A config name or value this broker does not accept (Kafka INVALID_CONFIG, 40); the message says why."""


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described config: what DescribeConfigs and CreateTopics v5+ return."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    config_type: ConfigType
    documentation: str
    synonyms: tuple[Synonym, ...] = ()


def _long(minimum: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected a long integer, got {text!r}") from None
        if value < minimum or value >= 1 << 63:
            raise ValueError(f"value {value} must be at least {minimum}")
        return str(value)

    return parse


def _cleanup_policy(text: str) -> str:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if policies != ["delete"]:
        raise ValueError("only 'delete' is supported: the table keeps every record, compaction by key "
                         f"('compact') is not implemented (got {text!r})")
    return "delete"


def _timestamp_type(text: str) -> str:
    if text.strip() != "CreateTime":
        raise ValueError(f"only CreateTime is supported: records keep their producers' timestamps (got {text!r})")
    return "CreateTime"


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text.strip()

    return parse


def _schema_text(text: str) -> str:
    if not text.strip():
        raise ValueError("the schema is empty (json: a Spark DDL string; avro: the schema's JSON)")
    return text


@dataclass(frozen=True, slots=True)
class _Alterable:
    name: str
    config_type: ConfigType
    parse: Callable[[str], str]
    doc: str
    broker_key: str | None = None     # the broker config it defaults to (its synonym)
    default: str | None = None        # when there is no broker key
    table_field: str | None = None    # the TopicTableConfig field of the config file that gives its default


ALTERABLE: dict[str, _Alterable] = {c.name: c for c in (
    _Alterable("retention.ms", ConfigType.LONG, _long(-1),
               "How long a partition's records are served from the write-ahead log before only the table "
               "has them (ms; -1: no time limit)", broker_key="log.retention.ms"),
    _Alterable("retention.bytes", ConfigType.LONG, _long(-1),
               "Write-ahead log bytes kept per partition before only the table has older records "
               "(-1: no size limit)", broker_key="log.retention.bytes"),
    _Alterable("cleanup.policy", ConfigType.LIST, _cleanup_policy,
               "Only 'delete': records leave the write-ahead log by retention; the table keeps them",
               default="delete"),
    _Alterable("message.timestamp.type", ConfigType.STRING, _timestamp_type,
               "Only CreateTime: record timestamps are the producer's", default="CreateTime"),
    _Alterable("value.format", ConfigType.STRING, _choice("raw", *VALUE_FORMATS),
               "How the table side reads the topic's values: raw (bytes in the records table), json, avro or "
               "protobuf (a table of the topic's own, a column per field; docs/table.md)", default="raw",
               table_field=TOPIC_CONFIG_FIELDS["value.format"]),
    _Alterable("value.schema", ConfigType.STRING, _schema_text,
               "The typed table's schema: json a Spark DDL string, avro the schema's JSON; unset for avro "
               "with a schema registry: the latest version of the subject <topic>-value", table_field=TOPIC_CONFIG_FIELDS["value.schema"]),
    _Alterable("value.wire.format", ConfigType.STRING, _choice("auto", "confluent", "none"),
               "The Schema Registry header (magic byte 0, 4-byte id) on values: auto, confluent (required) "
               "or none", default="auto", table_field=TOPIC_CONFIG_FIELDS["value.wire.format"]),
)}
"""Topic configs a client may set (CreateTopics, IncrementalAlterConfigs)."""

SEGMENT_BYTES = "segment.bytes"
_TABLE_KEYS: dict[str, str] = {
    "table.partition.granularity": "granularity",
    "table.retention.days": "retention_days",
}
"""Read-only per-topic table settings (``pipeline.config.TOPIC_KEYS``) -> TopicTableConfig field."""
_TABLE_TYPES = {"table.retention.days": ConfigType.INT}
_DEFAULT_TOPIC_TABLE = TopicTableConfig()
_FIELD_DEFAULTS = {f.name: getattr(_DEFAULT_TOPIC_TABLE, f.name) for f in fields(TopicTableConfig)}
READ_ONLY_REASON = {
    SEGMENT_BYTES: "segment.bytes cannot be set per topic: write-ahead log segments are shared by all topics "
                   "(broker config log.segment.bytes)",
    **{k: f"{k} is set in the server's config file ([topic.\"<name>\"] table), not by admin requests"
       for k in _TABLE_KEYS},
}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


class TopicConfigs:
    """The broker's topic config rules and defaults.

    Args:
        broker: broker config name -> (value as text or None, source) for the keys
            topic configs default to (``log.retention.ms``, ``log.retention.bytes``,
            ``log.segment.bytes``); STATIC_BROKER_CONFIG or DEFAULT_CONFIG.
        table: the config file's table settings (per-topic read-only entries).
    """

    def __init__(self, broker: Mapping[str, tuple[str | None, ConfigSource]],
                 table: TableConfig | None = None) -> None:
        self.broker = dict(broker)
        self.table = table or TableConfig()

    @property
    def names(self) -> tuple[str, ...]:
        """Every topic config DescribeConfigs lists, alterable first."""
        return (*ALTERABLE, SEGMENT_BYTES, *_TABLE_KEYS)

    def validate(self, configs: Iterable[tuple[str, str | None]]) -> dict[str, str]:
        """Check CreateTopics configs; returns name -> normalised value.

        Kafka ``ControllerApis.createTopics`` / ``LogConfig.validate``.

        Raises:
            InvalidConfigError: unknown or read-only name, null or bad value, a name twice.
        """
        out: dict[str, str] = {}
        for name, value in configs:
            if name in out:
                raise InvalidConfigError(f"Duplicate config key {name!r}")
            out[name] = self._check(name, value)
        return out

    def _check(self, name: str, value: str | None) -> str:
        spec = ALTERABLE.get(name)
        if spec is None:
            if name in READ_ONLY_REASON:
                raise InvalidConfigError(READ_ONLY_REASON[name])
            raise InvalidConfigError(f"Unknown topic config name: {name} (supported: {', '.join(ALTERABLE)})")
        if value is None:
            raise InvalidConfigError(f"Null value not supported for topic config: {name}")
        try:
            return spec.parse(value)
        except ValueError as exc:
            raise InvalidConfigError(f"Invalid value {value} for configuration {name}: {exc}") from None

    def alter(self, current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]]) -> dict[str, str]:
        """Apply IncrementalAlterConfigs operations to a topic's overrides; returns the new overrides.

        SET replaces, DELETE removes the override (back to the default),
        APPEND/SUBTRACT add/remove list items and are allowed only on LIST
        configs (KIP-339; Kafka ``ConfigAdminManager.prepareIncrementalConfigs``).

        Raises:
            InvalidConfigError: unknown or read-only name, bad value, APPEND/SUBTRACT on a non-list.
            ValueError: an operation code that is not one of ``AlterOp`` (Kafka INVALID_REQUEST).
        """
        out = dict(current)
        for name, op_code, value in ops:
            try:
                op = AlterOp(op_code)
            except ValueError:
                raise ValueError(f"Unknown alter config operation type {op_code}") from None
            if op is AlterOp.DELETE:
                if name not in ALTERABLE:
                    self._check(name, value)  # raises: unknown or read-only
                out.pop(name, None)
                continue
            if op is AlterOp.SET:
                out[name] = self._check(name, value)
                continue
            spec = ALTERABLE.get(name)
            if spec is None:
                self._check(name, value)  # raises
            assert spec is not None
            if spec.config_type is not ConfigType.LIST:
                raise InvalidConfigError(f"Config value append is not allowed for config key: {name}"
                                         if op is AlterOp.APPEND else
                                         f"Config value subtract is not allowed for config key: {name}")
            items = [i.strip() for i in self.value(out, name).split(",") if i.strip()]
            given = [i.strip() for i in (value or "").split(",") if i.strip()]
            if op is AlterOp.APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            out[name] = self._check(name, ",".join(items))
        return out

    def value(self, overrides: Mapping[str, str], name: str, topic: str | None = None) -> str:
        """The effective value of alterable config ``name``: override, else broker value (or the config
        file's ``[topic."<topic>"]`` value of a table setting), else default."""
        if name in overrides:
            return overrides[name]
        spec = ALTERABLE[name]
        if spec.broker_key is not None:
            return self.broker[spec.broker_key][0] or ""
        if spec.table_field is not None and topic is not None:
            static = _table_text(spec, getattr(self.table.topic(topic), spec.table_field))
            if static is not None:
                return static
        return spec.default or ""

    def describe(self, topic: str, overrides: Mapping[str, str], keys: Iterable[str] | None = None,
                 synonyms: bool = False) -> list[ConfigEntry]:
        """The topic's configs (all, or those of ``keys`` this broker knows), Kafka DescribeConfigs style."""
        wanted = None if keys is None else set(keys)
        out = []
        for name in self.names:
            if wanted is not None and name not in wanted:
                continue
            out.append(self._entry(topic, name, overrides, synonyms))
        return out

    def _entry(self, topic: str, name: str, overrides: Mapping[str, str], synonyms: bool) -> ConfigEntry:
        chain: list[Synonym] = []
        if name in ALTERABLE:
            spec = ALTERABLE[name]
            if name in overrides:
                chain.append(Synonym(name, overrides[name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
            if spec.broker_key is not None:
                value, source = self.broker[spec.broker_key]
                chain.append(Synonym(spec.broker_key, value, source))
            else:
                static = None if spec.table_field is None else _table_text(
                    spec, getattr(self.table.topic(topic), spec.table_field))
                if static is not None:  # the config file's [topic."<name>"] table
                    chain.append(Synonym(name, static, ConfigSource.STATIC_BROKER_CONFIG))
                chain.append(Synonym(name, spec.default, ConfigSource.DEFAULT_CONFIG))
            return ConfigEntry(name, chain[0].value, chain[0].source, False, spec.config_type, spec.doc,
                               tuple(chain) if synonyms else ())
        if name == SEGMENT_BYTES:
            value, source = self.broker["log.segment.bytes"]
            chain.append(Synonym("log.segment.bytes", value, source))
            return ConfigEntry(name, value, source, True, ConfigType.INT, READ_ONLY_REASON[name],
                               tuple(chain) if synonyms else ())
        attr = _TABLE_KEYS[name]
        value = getattr(self.table.topic(topic), attr)
        source = ConfigSource.DEFAULT_CONFIG if value == _FIELD_DEFAULTS[attr] else ConfigSource.STATIC_BROKER_CONFIG
        text = _text(value)
        return ConfigEntry(name, text, source, True, _TABLE_TYPES.get(name, ConfigType.STRING),
                           READ_ONLY_REASON[name], (Synonym(name, text, source),) if synonyms else ())

    def retention(self, overrides: Mapping[str, str]) -> tuple[int, int]:
        """(retention.ms, retention.bytes) in effect: the override or the broker default; -1 = no limit."""
        return int(self.value(overrides, "retention.ms")), int(self.value(overrides, "retention.bytes"))


def _table_text(spec: _Alterable, value: Any) -> str | None:
    """A config file table setting as its topic config's text; None when it is the default."""
    text = _text(value)
    if text is None or (spec.table_field is not None and value == _FIELD_DEFAULTS[spec.table_field]):
        return None
    return text


def broker_topic_defaults(server: ServerConfig) -> dict[str, tuple[str | None, ConfigSource]]:
    """``TopicConfigs.broker`` from a ``ServerConfig``: each key's value, STATIC_BROKER_CONFIG
    when it differs from the default (set in the file, environment or flags), else DEFAULT_CONFIG."""
    from pipeline.config import KEYS, default_value

    out: dict[str, tuple[str | None, ConfigSource]] = {}
    for key, attr in (("log.retention.ms", "log_retention_ms"), ("log.retention.bytes", "log_retention_bytes"),
                      ("log.segment.bytes", "log_segment_bytes")):
        value = getattr(server, attr)
        source = ConfigSource.DEFAULT_CONFIG if value == default_value(KEYS[key]) else ConfigSource.STATIC_BROKER_CONFIG
        out[key] = (str(value), source)
    return out
