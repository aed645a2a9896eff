"""The typed-table topic configs over the configuration file's table settings (``with_topic_configs``)."""

from __future__ import annotations

from pipeline.table.table_config import TOPIC_CONFIG_FIELDS, TableConfig, TopicTableConfig, with_topic_configs
from pipeline.table.layout import Granularity


def test_topic_configs_override_the_file_and_raw_means_untyped():
    static = TableConfig(topics={"s": TopicTableConfig(granularity=Granularity.DAY, value_format="avro",
                                                       value_schema='{"type": "record"}'),
                                 "p": TopicTableConfig(value_format="json", value_schema="id BIGINT")})
    configs = {
        "s": {"value.format": "raw", "retention.ms": "5"},  # raw: back to the records table
        "n": {"value.format": "avro", "value.wire.format": "confluent"},  # a topic the file does not name
        "q": {"retention.ms": "1"},  # no table setting: nothing changes
    }
    effective = with_topic_configs(static, configs)
    assert effective.topics["s"] == TopicTableConfig(granularity=Granularity.DAY, value_format=None,
                                                     value_schema='{"type": "record"}')
    assert effective.topics["n"] == TopicTableConfig(value_format="avro", value_wire_format="confluent")
    assert effective.topics["p"] == static.topics["p"] and "q" not in effective.topics
    assert with_topic_configs(static, {}) == static
    assert set(TOPIC_CONFIG_FIELDS) == {"value.format", "value.schema", "value.wire.format"}
