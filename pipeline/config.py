"""The configuration file (``pipeline serve --config FILE``): TOML with Kafka-style property names.

Keys are Kafka's or Hive's property names where one exists, written as TOML
keys (dotted keys and quoted keys mean the same: ``table.commit.interval.ms
= 10000`` and ``"table.commit.interval.ms" = 10000``). Per-topic settings go
in a ``[topic."<name>"]`` table. Command-line flags override the file::

    table.commit.interval.ms = 10000
    table.target.file.bytes = 134217728
    file.delete.delay.ms = 60000

    [topic."orders"]
    table.partition.granularity = "day"
    table.retention.days = 30

    [topic."payments"]                # typed columns (pipeline.table.typed)
    value.format = "json"
    value.schema = "id BIGINT, amount DECIMAL(12,2), at TIMESTAMP"

An unknown key, or a value of the wrong type or range, raises ``ConfigError``
naming the key, before anything starts.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from pipeline.table.catalog import TableConfig, TopicTableConfig
from pipeline.table.layout import Granularity


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key and the file."""


def _positive(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"expected an integer >= 1, got {v!r}")
    return v


def _non_negative(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected an integer >= 0, got {v!r}")
    return v


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def _min_files(v: Any) -> int:
    if _positive(v) < 2:
        raise ValueError(f"expected an integer >= 2, got {v!r}")
    return v


def _granularity(v: Any) -> Granularity:
    try:
        return Granularity(v)
    except ValueError:
        raise ValueError(f"expected one of {[g.value for g in Granularity]}, got {v!r}") from None


# key -> (parser, ServerConfig field or "table.<TableConfig field>")
SERVER_KEYS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "table.commit.interval.ms": (_positive, "table_commit_interval_ms"),
    "table.compaction.interval.ms": (_non_negative, "table_compaction_interval_ms"),
    "table.database": (_string, "table.database"),
    "table.target.file.bytes": (_positive, "table.target_file_bytes"),
    "table.compaction.min.files": (_min_files, "table.compaction_min_files"),
    "file.delete.delay.ms": (_non_negative, "table.file_delete_delay_ms"),
    "hive.metastore.uris": (_string, "metastore_uris"),
}
"""Top-level keys this version reads."""

def _value_format(v: Any) -> str:
    if v not in ("json", "avro"):
        raise ValueError(f"expected json or avro, got {v!r}")
    return v


def _wire_format(v: Any) -> str:
    if v not in ("auto", "confluent", "none"):
        raise ValueError(f"expected auto, confluent or none, got {v!r}")
    return v


def _schema(v: Any) -> str:
    """A DDL string, or an Avro schema given as a TOML table/array or a JSON string."""
    import json

    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return _string(v)


TOPIC_KEYS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "table.partition.granularity": (_granularity, "granularity"),
    "table.retention.days": (_positive, "retention_days"),
    "value.format": (_value_format, "value_format"),
    "value.schema": (_schema, "value_schema"),
    "value.wire.format": (_wire_format, "value_wire_format"),
}
"""Keys of a ``[topic."<name>"]`` table."""


def _flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass(slots=True)
class FileConfig:
    """What a configuration file sets.

    Attributes:
        server: ServerConfig field -> value (top-level keys other than the table's).
        table: the ``TableConfig`` with the file's table keys and topics applied to the defaults.
        sources: key -> where it came from (``file:PATH``).
    """

    server: dict[str, Any] = field(default_factory=dict)
    table: TableConfig = field(default_factory=TableConfig)
    sources: dict[str, str] = field(default_factory=dict)


def load_config(path: str | Path) -> FileConfig:
    """Read and check a configuration file.

    Raises:
        ConfigError: the file is unreadable or not TOML, a key is unknown, or
            a value is wrong; the message names the file and the key.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    result = FileConfig()
    table_fields: dict[str, Any] = {}
    topics: dict[str, TopicTableConfig] = {}
    topic_tables = data.pop("topic", {})
    if not isinstance(topic_tables, dict):
        raise ConfigError(f"{path}: 'topic' must be a table of topics, e.g. [topic.\"orders\"]")
    for key, value in _flatten(data).items():
        if key not in SERVER_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join(sorted(SERVER_KEYS))})")
        parse, target = SERVER_KEYS[key]
        try:
            parsed = parse(value)
        except ValueError as exc:
            raise ConfigError(f"{path}: {key}: {exc}") from None
        if target.startswith("table."):
            table_fields[target.removeprefix("table.")] = parsed
        else:
            result.server[target] = parsed
        result.sources[key] = f"file:{path}"
    for topic, settings in topic_tables.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"{path}: topic.{topic} must be a table of settings")
        topic_fields: dict[str, Any] = {}
        schema = settings.get("value", {}).pop("schema", None) if isinstance(settings.get("value"), dict) else None
        if schema is not None:  # an Avro schema given as a TOML table is not flattened
            settings = {**settings, "value.schema": schema}
        for key, value in _flatten(settings).items():
            if key not in TOPIC_KEYS:
                raise ConfigError(f"{path}: topic {topic!r}: unknown key {key!r} "
                                  f"(known: {', '.join(sorted(TOPIC_KEYS))})")
            parse, target = TOPIC_KEYS[key]
            try:
                topic_fields[target] = parse(value)
            except ValueError as exc:
                raise ConfigError(f"{path}: topic {topic!r}: {key}: {exc}") from None
            result.sources[f"topic.{topic}.{key}"] = f"file:{path}"
        topics[topic] = TopicTableConfig(**topic_fields)
    result.table = replace(TableConfig(), **table_fields, topics=topics)
    return result
