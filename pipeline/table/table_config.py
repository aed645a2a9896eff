"""The table side's settings: ``TableConfig`` (table-wide) and ``TopicTableConfig`` (per topic).

What ``pipeline.config`` builds from the ``table.*`` keys and the config file's ``[topic."<name>"]``
tables, and ``pipeline.table.catalog.TableCatalog`` applies. They live here, away from the catalog,
so that the configuration (and with it every ``pipeline`` command) loads without Spark and Arrow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from pipeline.table.layout import (
    DEFAULT_COMPACTION_MIN_FILES,
    DEFAULT_DATABASE,
    DEFAULT_FILE_DELETE_DELAY_MS,
    DEFAULT_TARGET_FILE_BYTES,
    Granularity,
)

if TYPE_CHECKING:
    from pipeline.table.values import WireFormat


@dataclass(frozen=True, slots=True)
class TopicTableConfig:
    """Per-topic table settings (``[topic."<name>"]`` in the config file).

    Attributes:
        granularity: ``table.partition.granularity``, hour (default) or day.
        retention_days: ``table.retention.days``: time partitions whose date is
            older than this many days are dropped (None: kept forever).
        value_format: ``value.format``: None (raw bytes, the records table),
            ``json``, ``avro`` or ``protobuf`` (a table of the topic's own with typed columns,
            ``pipeline.table.typed``; protobuf always follows its registry subject).
        value_schema: ``value.schema``: for json a Spark DDL string
            (``"id BIGINT, name STRING"``), for avro the schema (JSON) the table's columns come
            from. An avro topic without one takes the latest version of its registry subject
            (``<topic>-value``) at each commit, and its table's columns follow it
            (``TableConfig.schema_registry`` must be set).
        value_wire_format: ``value.wire.format``: auto, confluent or none
            (the Schema Registry header, ``pipeline.table.values.ValueFormat``).
    """

    granularity: Granularity = Granularity.HOUR
    retention_days: int | None = None
    value_format: str | None = None
    value_schema: str | None = None
    value_wire_format: WireFormat = "auto"


VALUE_FORMATS: dict[str, str] = {"json": "JSON", "avro": "AVRO", "protobuf": "PROTOBUF"}
"""``value.format`` -> the Schema Registry schema type its topic's registry subject must hold (a topic
of that format without ``value.schema`` takes the subject's latest version; ``pipeline.registry``).
``raw``, the default, is not here: raw values go to the records table."""

TOPIC_CONFIG_FIELDS = {"value.format": "value_format", "value.schema": "value_schema",
                       "value.wire.format": "value_wire_format"}
"""The topic configs (CreateTopics, IncrementalAlterConfigs; ``pipeline.admin.topic_configs``) that set a
``TopicTableConfig`` field, over the config file's ``[topic."<name>"]`` value; ``value.format`` raw is None."""


def with_topic_configs(static: "TableConfig", configs: Mapping[str, Mapping[str, str]]) -> "TableConfig":
    """``static`` (the config file's table settings) with each topic's ``TOPIC_CONFIG_FIELDS`` overrides
    (``configs``: topic -> its topic configs) applied."""
    topics = dict(static.topics)
    for topic, overrides in configs.items():
        fields_ = {}
        for name, attr in TOPIC_CONFIG_FIELDS.items():
            if name in overrides:
                value: object = overrides[name]
                fields_[attr] = None if name == "value.format" and value == "raw" else value
        if fields_:
            topics[topic] = replace(static.topic(topic), **fields_)  # type: ignore[arg-type]
    return replace(static, topics=topics)


@dataclass(frozen=True, slots=True)
class TableConfig:
    """Table-wide settings. Sizes in bytes, times in ms.

    Attributes:
        database: catalog database (``table.database``).
        target_file_bytes: ``table.target.file.bytes``.
        compaction_min_files: ``table.compaction.min.files``.
        file_delete_delay_ms: ``file.delete.delay.ms``.
        topics: per-topic settings; a topic not named has the defaults.
        schema_registry: where avro topics' values with a Schema Registry header have their
            writer schema looked up by id (``pipeline.table.values.ValueFormat.registry``): the
            ``schema.registry.url`` of an external registry, else pipeline's own registry's store
            when it serves one; None: every value is read with its topic's ``value.schema``.
    """

    database: str = DEFAULT_DATABASE
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    compaction_min_files: int = DEFAULT_COMPACTION_MIN_FILES
    file_delete_delay_ms: int = DEFAULT_FILE_DELETE_DELAY_MS
    topics: dict[str, TopicTableConfig] = field(default_factory=dict)
    schema_registry: str | None = None

    def topic(self, name: str) -> TopicTableConfig:
        return self.topics.get(name) or TopicTableConfig()

    @property
    def day_topics(self) -> frozenset[str]:
        return frozenset(t for t, c in self.topics.items() if c.granularity is Granularity.DAY)
