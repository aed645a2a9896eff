"""Protobuf through the registry's HTTP API with the real clients: confluent-kafka's ``ProtobufSerializer``
registers (a base64 ``FileDescriptorProto``, its imports as references) and ``ProtobufDeserializer`` reads
back (``?format=serialized``); a Java/Go-style ``.proto`` text registration is served serialized too."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

from pipeline.registry.http import RegistryListener
from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from tests.registry.test_http import running

pytest.importorskip("confluent_kafka.schema_registry")
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

F = descriptor_pb2.FieldDescriptorProto


def message_class(fields: list[tuple[str, int, int]], *, money_type: int | None = None):
    """``shop.Order`` with ``fields`` ((name, number, type)) and a ``common.Money`` field (``price``) from
    an imported file ``common/money.proto`` whose ``units`` has type ``money_type`` (default int64): a
    fresh pool each time, as two builds of a producer would have."""
    pool = descriptor_pool.DescriptorPool()
    money = descriptor_pb2.FileDescriptorProto(name="common/money.proto", package="common", syntax="proto3")
    money.message_type.add(name="Money").field.add(name="units", number=1, type=money_type or F.TYPE_INT64,
                                                   label=F.LABEL_OPTIONAL)
    pool.Add(money)
    order = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3",
                                               dependency=["common/money.proto"])
    message = order.message_type.add(name="Order")
    for name, number, type_ in fields:
        message.field.add(name=name, number=number, type=type_, label=F.LABEL_OPTIONAL)
    message.field.add(name="price", number=15, type=F.TYPE_MESSAGE, type_name=".common.Money",
                      label=F.LABEL_OPTIONAL)
    pool.Add(order)
    return GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


V1 = [("id", 1, F.TYPE_STRING)]
V2 = [("id", 1, F.TYPE_STRING), ("qty", 2, F.TYPE_INT32)]
V3 = [("id", 1, F.TYPE_INT64)]  # string -> int64: another wire group


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    store = SchemaStore(tmp_path_factory.mktemp("registry") / "registry.db")
    with running(SchemaRegistry(store), RegistryListener("127.0.0.1", 0)) as u:
        yield u
    store.close()


def test_protobuf_producer_evolves_and_an_incompatible_version_is_refused(url):
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1_class, v2_class = message_class(V1), message_class(V2)
    v1 = ProtobufSerializer(v1_class, client)(v1_class(id="a"), ctx)
    v2_message = v2_class(id="b", qty=3)
    v2_message.price.units = 7
    v2 = ProtobufSerializer(v2_class, client)(v2_message, ctx)
    assert v1[0] == v2[0] == 0 and v1[5:6] == b"\x00"  # magic, id, message indexes [0]
    assert int.from_bytes(v1[1:5], "big") != int.from_bytes(v2[1:5], "big")
    assert client.get_versions("orders-value") == [1, 2]
    # the import came as a reference, registered under its file name (reference.subject.name.strategy)
    latest = client.get_latest_version("orders-value")
    assert [(r.name, r.subject) for r in latest.schema.references] == [("common/money.proto", "common/money.proto")]
    # the consumer: the writer's schema asked ?format=serialized, references too
    assert ProtobufDeserializer(v2_class, {"use.deprecated.format": False})(v2, ctx) == v2_message
    assert ProtobufDeserializer(v1_class, {"use.deprecated.format": False})(v1, ctx).id == "a"
    read = ProtobufDeserializer(v2_class, {"use.deprecated.format": False}, client)(v1, ctx)
    assert read.id == "a" and read.qty == 0
    v3_class = message_class(V3)
    with pytest.raises(SchemaRegistryError) as e:  # the serializer's registration is refused
        ProtobufSerializer(v3_class, client)(v3_class(id=5), ctx)
    assert e.value.http_status_code == 409 and "FIELD_SCALAR_KIND_CHANGED" in e.value.error_message
    assert client.get_versions("orders-value") == [1, 2]
    # an incompatible change inside the referenced file: the field using it changed type
    other_money = message_class(V2, money_type=F.TYPE_STRING)
    serialized_money = base64.standard_b64encode(other_money.DESCRIPTOR.file.dependencies[0].serialized_pb).decode()
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("common/money.proto", Schema(serialized_money, "PROTOBUF"))
    assert refused.value.http_status_code == 409


def test_a_proto_text_registration_is_served_serialized(url):
    client = SchemaRegistryClient({"url": url})
    text = 'syntax = "proto3";\npackage shop;\nmessage Ping {\n  string id = 1;\n}\n'
    schema_id = client.register_schema("pings-value", Schema(text, "PROTOBUF"))
    assert client.get_schema(schema_id).schema_str == text
    fresh = SchemaRegistryClient({"url": url})  # the client caches a schema by id whatever the format
    serialized = fresh.get_schema(schema_id, fmt="serialized").schema_str
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized))
    assert proto.package == "shop" and proto.message_type[0].name == "Ping"
    assert client.get_latest_version("pings-value", fmt="serialized").schema.schema_str == serialized
    # the same schema registered in the other form is compatible with it, and the type must be served
    assert client.test_compatibility("pings-value", Schema(serialized, "PROTOBUF")) is True
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("pings-value", Schema('syntax = "proto3"; message Ping { strin id = 1; }',
                                                     "PROTOBUF"))
    assert e.value.error_code == 42201 and "strin" in e.value.error_message
