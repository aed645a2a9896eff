"""The admin apis in-process: real request frames in, decoded kio responses out.

Requests are encoded with kio (as a client would), parsed with the server's
header parser, handed to ``AdminApis`` and answered through a recording
connection; responses are decoded with kio's readers. The catalog has a real
SQLite store in tmp_path; the delete hook records what it is called with.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from pipeline.admin.apis import AdminApis, broker_configs
from pipeline.metadata.topics import TopicStore
from pipeline.admin.topic_configs import ConfigSource, TopicConfigs, broker_topic_defaults
from pipeline.bench.frames import encode_request
from pipeline.protocol import apis as papis
from pipeline.protocol.apis import BrokerInfo, topic_id_for
from pipeline.protocol.header import parse_request_header, response_header_version
from pipeline.requests.catalog import TopicCatalog
from pipeline.network.request_channel import Request
from pipeline.config import ServerConfig
from pipeline.table.table_config import TableConfig, TopicTableConfig

pytestmark = pytest.mark.trio

NONE, UNKNOWN_TOPIC, INVALID_TOPIC, UNKNOWN_SERVER = 0, 3, 17, -1
TOPIC_EXISTS, INVALID_PARTITIONS, INVALID_RF, INVALID_ASSIGNMENT, INVALID_CONFIG, INVALID_REQUEST = 36, 37, 38, 39, 40, 42
UNKNOWN_TOPIC_ID, MISMATCHED_ENDPOINT = 100, 114
MS = datetime.timedelta(milliseconds=30_000)


class Recorder:
    """A ConnectionHandle that keeps what it is given."""

    listener = "PLAINTEXT"

    def __init__(self) -> None:
        self.completed: list[tuple[int, bytes | None]] = []
        self.closed: list[str] = []

    def complete(self, token: int, payload: bytes | None) -> None:
        self.completed.append((token, payload))

    def close(self, reason: str) -> None:
        self.closed.append(reason)


class Admin:
    def __init__(self, tmp_path, config: ServerConfig | None = None, hook=None) -> None:
        self.config = config or ServerConfig(num_partitions=2, log_retention_ms=120_000)
        self.catalog = TopicCatalog(self.config.num_partitions, True, store=TopicStore(tmp_path / "topics.db"),
                                    retention_defaults=(self.config.log_retention_ms, self.config.log_retention_bytes))
        self.deleted: list[str] = []

        async def record(topic: str) -> None:
            self.deleted.append(topic)

        self.apis = AdminApis(BrokerInfo(7, "127.0.0.1", 9092, "cluster-x"), self.catalog,
                              TopicConfigs(broker_topic_defaults(self.config), self.config.table),
                              hook or record, broker_configs(self.config))
        self._cid = 0

    async def call(self, api_key: int, version: int, **fields):
        """Send a request of (api_key, version) with ``fields``; the decoded response."""
        request_cls = load_request_schema(api_key, version)
        entity = _build(request_cls, fields)
        self._cid += 1
        frame = encode_request(entity, self._cid, "admin-test")[4:]
        header = parse_request_header(frame)
        connection = Recorder()
        handler = {19: self.apis.create_topics, 20: self.apis.delete_topics, 37: self.apis.create_partitions,
                   32: self.apis.describe_configs, 44: self.apis.incremental_alter_configs,
                   60: self.apis.describe_cluster}[api_key]
        await handler(Request(connection, header, frame, 0))
        assert len(connection.completed) == 1, "a handler completes its request exactly once"
        payload = connection.completed[0][1]
        offset = 4 + (1 if response_header_version(api_key, version) >= 1 else 0)
        body, _ = entity_reader(load_response_schema(api_key, version))(payload, offset)
        return body


def _build(cls, fields: dict):
    """A kio entity of ``cls`` from plain values; nested dicts/lists become the field's classes."""
    import typing

    hints = typing.get_type_hints(cls)
    out = {}
    for name, value in fields.items():
        hint = hints[name]
        if isinstance(value, list):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            inner = typing.get_args(args[0])[0] if args and typing.get_args(args[0]) else typing.get_args(hint)[0]
            value = tuple(_build(inner, v) if isinstance(v, dict) else v for v in value)
        out[name] = value
    return cls(**out)


def creatable(name: str, partitions: int = -1, rf: int = -1, configs=(), assignments=()) -> dict:
    return {"name": name, "num_partitions": partitions, "replication_factor": rf,
            "assignments": list(assignments), "configs": [{"name": k, "value": v} for k, v in configs]}


def by_name(results) -> dict:
    return {r.name: r for r in results}


async def test_create_topics_rules_and_v7_results(tmp_path):
    a = Admin(tmp_path)
    body = await a.call(19, 7, timeout=MS, validate_only=False, topics=[
        creatable("plain"),
        creatable("three", 3, 1, configs=[("retention.ms", "1000"), ("cleanup.policy", "delete")]),
        creatable("bad name!"), creatable("dup"), creatable("dup"),
        creatable("zero", 0), creatable("rf2", 1, 2), creatable("rf0", 1, 0),
        creatable("compact", configs=[("cleanup.policy", "compact")]),
        creatable("unknowncfg", configs=[("max.message.bytes", "1")]),
        creatable("segment", configs=[("segment.bytes", "1000")]),
        creatable("logappend", configs=[("message.timestamp.type", "LogAppendTime")]),
        creatable("assigned", assignments=[{"partition_index": 0, "broker_ids": [7]},
                                           {"partition_index": 1, "broker_ids": [7]}]),
        creatable("elsewhere", assignments=[{"partition_index": 0, "broker_ids": [3]}]),
        creatable("both", 2, assignments=[{"partition_index": 0, "broker_ids": [7]}]),
    ])
    r = by_name(body.topics)
    codes = {name: int(res.error_code) for name, res in r.items()}
    assert codes == {"plain": NONE, "three": NONE, "bad name!": INVALID_TOPIC, "dup": INVALID_REQUEST,
                     "zero": INVALID_PARTITIONS, "rf2": INVALID_RF, "rf0": INVALID_RF, "compact": INVALID_CONFIG,
                     "unknowncfg": INVALID_CONFIG, "segment": INVALID_CONFIG, "logappend": INVALID_CONFIG,
                     "assigned": NONE, "elsewhere": INVALID_ASSIGNMENT, "both": INVALID_REQUEST}
    assert "compact" in r["compact"].error_message and "shared by all topics" in r["segment"].error_message
    assert r["plain"].num_partitions == 2 and r["three"].num_partitions == 3 and r["assigned"].num_partitions == 2
    assert r["three"].topic_id == topic_id_for("three") and r["zero"].topic_id in (None, uuid.UUID(int=0))  # kio reads the zero id as None
    configs = {c.name: (c.value, c.config_source, c.read_only) for c in r["three"].configs}
    assert configs["retention.ms"] == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)
    assert configs["retention.bytes"] == ("-1", ConfigSource.DEFAULT_CONFIG, False)
    assert configs["segment.bytes"][2] is True
    assert a.catalog.all_topics() == {"plain": 2, "three": 3, "assigned": 2}
    assert a.catalog.retention("three") == (1000, -1) and a.catalog.retention("plain") == (120_000, -1)

    again = await a.call(19, 2, timeout=MS, validate_only=False, topics=[creatable("plain")])
    assert int(again.topics[0].error_code) == TOPIC_EXISTS
    for version in range(2, 8):
        created = await a.call(19, version, timeout=MS, validate_only=False, topics=[creatable(f"v{version}")])
        assert int(created.topics[0].error_code) == NONE, version
    dry = await a.call(19, 5, timeout=MS, validate_only=True, topics=[creatable("dry", 4)])
    assert int(dry.topics[0].error_code) == NONE and dry.topics[0].num_partitions == 4
    assert a.catalog.partitions("dry") is None


async def test_delete_topics_by_name_and_by_id(tmp_path):
    a = Admin(tmp_path)
    await a.call(19, 7, timeout=MS, validate_only=False, topics=[creatable(n) for n in ("a", "b", "c")])
    v1 = await a.call(20, 1, timeout=MS, topic_names=["a", "missing"])
    assert {r.name: int(r.error_code) for r in v1.responses} == {"a": NONE, "missing": UNKNOWN_TOPIC}
    v6 = await a.call(20, 6, timeout=MS, topics=[
        {"name": None, "topic_id": topic_id_for("b")}, {"name": None, "topic_id": uuid.uuid4()},
        {"name": "c", "topic_id": topic_id_for("c")}])
    codes = [int(r.error_code) for r in v6.responses]
    assert codes == [NONE, UNKNOWN_TOPIC_ID, INVALID_REQUEST]
    assert v6.responses[0].name == "b"
    assert a.deleted == ["a", "b"]
    assert a.catalog.all_topics() == {"c": 2}
    # gone from the store too
    assert TopicCatalog(1, True, store=TopicStore(tmp_path / "topics.db")).all_topics() == {"c": 2}


async def test_a_failing_delete_hook_keeps_the_topic(tmp_path):
    async def broken(topic: str) -> None:
        raise RuntimeError("Spark is down")

    a = Admin(tmp_path, hook=broken)
    await a.call(19, 7, timeout=MS, validate_only=False, topics=[creatable("t")])
    body = await a.call(20, 5, timeout=MS, topic_names=["t"])
    assert int(body.responses[0].error_code) == UNKNOWN_SERVER and "Spark is down" in body.responses[0].error_message
    assert a.catalog.partitions("t") == 2


async def test_create_partitions_only_increases(tmp_path):
    a = Admin(tmp_path)
    await a.call(19, 7, timeout=MS, validate_only=False, topics=[creatable("t", 2)])
    body = await a.call(37, 3, timeout=MS, validate_only=False, topics=[
        {"name": "t", "count": 5, "assignments": None}, {"name": "missing", "count": 2, "assignments": None}])
    assert [int(r.error_code) for r in body.results] == [NONE, UNKNOWN_TOPIC]
    assert a.catalog.partitions("t") == 5
    for count in (5, 3):
        body = await a.call(37, 0, timeout=MS, validate_only=False, topics=[{"name": "t", "count": count,
                                                                             "assignments": None}])
        assert int(body.results[0].error_code) == INVALID_PARTITIONS
    body = await a.call(37, 1, timeout=MS, validate_only=False, topics=[
        {"name": "t", "count": 7, "assignments": [{"broker_ids": [7]}]}])
    assert int(body.results[0].error_code) == INVALID_ASSIGNMENT
    body = await a.call(37, 2, timeout=MS, validate_only=True, topics=[{"name": "t", "count": 9, "assignments": None}])
    assert int(body.results[0].error_code) == NONE and a.catalog.partitions("t") == 5
    assert TopicCatalog(1, True, store=TopicStore(tmp_path / "topics.db")).all_topics() == {"t": 5}


async def test_incremental_alter_then_describe_configs(tmp_path):
    config = ServerConfig(num_partitions=1, log_retention_ms=90_000,
                          table=TableConfig(topics={"t": TopicTableConfig(retention_days=3)}))
    a = Admin(tmp_path, config)
    await a.call(19, 7, timeout=MS, validate_only=False, topics=[creatable("t")])

    def res(name, *configs, rtype=2):
        return {"resource_type": rtype, "resource_name": name,
                "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in configs]}

    body = await a.call(44, 1, validate_only=False, resources=[
        res("t", ("retention.ms", 0, "5000"), ("retention.bytes", 0, "1048576")),
        res("missing", ("retention.ms", 0, "1")),
        res("7", ("log.retention.ms", 0, "1"), rtype=4),
    ])
    assert [int(r.error_code) for r in body.responses] == [NONE, UNKNOWN_TOPIC, INVALID_CONFIG]
    assert "dynamically" in body.responses[2].error_message
    assert a.catalog.retention("t") == (5000, 1048576)
    for bad, code in [(("retention.ms", 2, "1"), INVALID_CONFIG), (("cleanup.policy", 2, "compact"), INVALID_CONFIG),
                      (("nope", 0, "1"), INVALID_CONFIG), (("retention.ms", 9, "1"), INVALID_REQUEST),
                      (("retention.ms", 0, "abc"), INVALID_CONFIG), (("table.retention.days", 0, "1"), INVALID_CONFIG)]:
        body = await a.call(44, 0, validate_only=False, resources=[res("t", bad)])
        assert int(body.responses[0].error_code) == code, bad
    body = await a.call(44, 1, validate_only=True, resources=[res("t", ("retention.ms", 1, None))])
    assert int(body.responses[0].error_code) == NONE and a.catalog.retention("t") == (5000, 1048576)
    body = await a.call(44, 1, validate_only=False, resources=[res("t", ("retention.ms", 1, None))])
    assert int(body.responses[0].error_code) == NONE and a.catalog.retention("t") == (90_000, 1048576)

    body = await a.call(32, 4, include_synonyms=True, include_documentation=True, resources=[
        {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
        {"resource_type": 2, "resource_name": "missing", "configuration_keys": None},
        {"resource_type": 4, "resource_name": "7", "configuration_keys": ["log.retention.ms", "num.partitions"]},
        {"resource_type": 4, "resource_name": "3", "configuration_keys": None},
    ])
    topic, missing, broker, other = body.results
    assert int(topic.error_code) == NONE and int(missing.error_code) == UNKNOWN_TOPIC
    assert int(other.error_code) == INVALID_REQUEST
    entries = {c.name: c for c in topic.configs}
    assert entries["retention.bytes"].value == "1048576"
    assert entries["retention.bytes"].config_source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert [(s.name, s.source) for s in entries["retention.bytes"].synonyms] == [
        ("retention.bytes", ConfigSource.DYNAMIC_TOPIC_CONFIG), ("log.retention.bytes", ConfigSource.DEFAULT_CONFIG)]
    assert entries["retention.ms"].value == "90000"
    assert entries["retention.ms"].config_source == ConfigSource.STATIC_BROKER_CONFIG  # log.retention.ms set
    assert entries["table.retention.days"].value == "3" and entries["table.retention.days"].read_only
    assert entries["cleanup.policy"].value == "delete" and entries["retention.ms"].documentation
    assert {c.name: c.value for c in broker.configs} == {"log.retention.ms": "90000", "num.partitions": "1"}
    v1 = await a.call(32, 1, include_synonyms=False, resources=[
        {"resource_type": 2, "resource_name": "t", "configuration_keys": ["retention.ms"]}])
    assert [(c.name, c.value, c.synonyms) for c in v1.results[0].configs] == [("retention.ms", "90000", ())]


async def test_the_typed_table_settings_are_topic_configs(tmp_path):
    """value.format, value.schema and value.wire.format: the config file's [topic."<name>"] value is the
    default (STATIC_BROKER_CONFIG), a topic override (IncrementalAlterConfigs, CreateTopics) wins and is
    stored with the topic's other configs, where the table side reads it at its next commit."""
    config = ServerConfig(num_partitions=1, table=TableConfig(topics={"s": TopicTableConfig(value_format="avro")}))
    a = Admin(tmp_path, config)
    await a.call(19, 7, timeout=MS, validate_only=False, topics=[
        creatable("s"), creatable("r"),
        creatable("j", configs=[("value.format", "json"), ("value.schema", "id BIGINT")])])

    def alter(topic, *configs):
        return a.call(44, 1, validate_only=False, resources=[
            {"resource_type": 2, "resource_name": topic,
             "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in configs]}])

    async def described(topic):
        body = await a.call(32, 4, include_synonyms=True, include_documentation=False, resources=[
            {"resource_type": 2, "resource_name": topic, "configuration_keys": ["value.format", "value.schema"]}])
        return {c.name: (c.value, c.config_source, c.read_only) for c in body.results[0].configs}

    assert await described("s") == {"value.format": ("avro", ConfigSource.STATIC_BROKER_CONFIG, False),
                                     "value.schema": (None, ConfigSource.DEFAULT_CONFIG, False)}
    assert await described("r") == {"value.format": ("raw", ConfigSource.DEFAULT_CONFIG, False),
                                     "value.schema": (None, ConfigSource.DEFAULT_CONFIG, False)}
    assert await described("j") == {"value.format": ("json", ConfigSource.DYNAMIC_TOPIC_CONFIG, False),
                                     "value.schema": ("id BIGINT", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)}
    body = await alter("r", ("value.format", 0, "avro"), ("value.wire.format", 0, "confluent"))
    assert int(body.responses[0].error_code) == NONE
    stored = {t.name: dict(t.configs) for t in TopicStore(tmp_path / "topics.db").load()}
    assert stored["r"] == {"value.format": "avro", "value.wire.format": "confluent"}  # what the table side reads
    assert await described("r") == {"value.format": ("avro", ConfigSource.DYNAMIC_TOPIC_CONFIG, False),
                                     "value.schema": (None, ConfigSource.DEFAULT_CONFIG, False)}
    for bad in (("value.format", 0, "thrift"), ("value.wire.format", 0, "maybe"), ("value.schema", 0, " ")):
        body = await alter("r", bad)
        assert int(body.responses[0].error_code) == INVALID_CONFIG, bad
    body = await alter("s", ("value.format", 0, "raw"))
    assert int(body.responses[0].error_code) == NONE
    assert (await described("s"))["value.format"] == ("raw", ConfigSource.DYNAMIC_TOPIC_CONFIG, False)
    body = await alter("s", ("value.format", 1, None))  # DELETE: back to the config file's value
    assert (await described("s"))["value.format"] == ("avro", ConfigSource.STATIC_BROKER_CONFIG, False)


async def test_describe_cluster(tmp_path):
    a = Admin(tmp_path)
    v0 = await a.call(60, 0, include_cluster_authorized_operations=False)
    assert int(v0.error_code) == NONE and v0.cluster_id == "cluster-x" and v0.controller_id == 7
    assert [(b.broker_id, b.host, b.port) for b in v0.brokers] == [(7, "127.0.0.1", 9092)]
    v1 = await a.call(60, 1, include_cluster_authorized_operations=True, endpoint_type=2)
    assert int(v1.error_code) == MISMATCHED_ENDPOINT


async def test_registered_on_kafka_apis_and_advertised(tmp_path):
    a = Admin(tmp_path)
    served = {}

    class Apis:
        def register(self, key, handler):
            served[key] = handler

        def authorize(self, request, operation, resource_type, name, log_denied=True):
            return True

    a.apis.register(Apis())
    assert set(served) == {19, 20, 37, 32, 44, 60}
    assert all(k in papis.SUPPORTED_VERSIONS for k in served)
