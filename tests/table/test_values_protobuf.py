"""Typed Protobuf values (issue 32): each value read with its writer's message from pipeline's registry
store (the wire format's id and message indexes, or a ``__value_schema_id`` header), turned into the
table's columns (``protobuf_to_arrow_schema``); the table follows the subject's latest version."""

from __future__ import annotations

import pickle
import socket
import uuid
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from google.protobuf.message_factory import GetMessageClass

from pipeline.registry.lookup import RegistryUnavailable
from pipeline.registry.protobuf_kind import ProtobufKind
from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from pipeline.table.values import TIMESTAMP_TYPE, ValueFormat, parse_values, protobuf_to_arrow_schema

V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Order {
  enum Status { NEW = 0; PAID = 1; }
  message Line { string sku = 1; uint32 qty = 2; }
  string id = 1;
  int32 small = 2;
  sint64 big = 3;
  uint64 huge = 4;
  fixed32 f32 = 5;
  bool ok = 6;
  float ratio = 7;
  double price = 8;
  bytes blob = 9;
  Status status = 10;
  repeated Line lines = 11;
  map<string, int64> counts = 12;
  google.protobuf.Timestamp at = 13;
  google.protobuf.Int64Value maybe = 14;
  optional string note = 15;
  map<int32, string> by_num = 16;
}
"""
V2 = V1.replace("map<int32, string> by_num = 16;", "map<int32, string> by_num = 16;\n  string coupon = 17;")
OTHER = 'syntax = "proto3"; package shop; message Order { int64 id = 1; }'
AVRO = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}'


def message_class(text: str):
    """The message class of ``text``'s first message (compiled by protoc, as the registry does)."""
    return GetMessageClass(ProtobufKind.parse(text, ()).message([0]))


def framed(schema_id: int, message, indexes: bytes = b"\x00") -> bytes:
    """Confluent's Protobuf wire format: magic 0, the 4-byte id, the message indexes, the message."""
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + message.SerializeToString()


@pytest.fixture
def registered(tmp_path):
    target = str(tmp_path / "registry.db")
    store = SchemaStore(target)
    registry = SchemaRegistry(store)
    v1 = registry.register("orders-value", {"schema": V1, "schemaType": "PROTOBUF"})
    # v2 as confluent-kafka's Python serializer registers: a base64 FileDescriptorProto
    v2_serialized = ProtobufKind.parse(V2, ()).serialized()
    v2 = registry.register("orders-value", {"schema": v2_serialized, "schemaType": "PROTOBUF"})
    other = registry.register("others-value", {"schema": OTHER, "schemaType": "PROTOBUF"})
    avro = registry.register("avro-value", {"schema": AVRO})
    yield target, {"v1": v1, "v2": v2, "other": other, "avro": avro}, v2_serialized
    store.close()


def test_the_mapping_to_arrow():
    schema = protobuf_to_arrow_schema(V2)
    assert [(f.name, str(f.type)) for f in schema] == [
        ("id", "string"), ("small", "int32"), ("big", "int64"), ("huge", "int64"), ("f32", "int64"),
        ("ok", "bool"), ("ratio", "float"), ("price", "double"), ("blob", "binary"), ("status", "string"),
        ("lines", "list<element: struct<sku: string, qty: int64>>"), ("counts", "map<string, int64>"),
        ("at", "timestamp[us, tz=UTC]"), ("maybe", "int64"), ("note", "string"),
        ("by_num", "map<int32, string>"), ("coupon", "string")]
    assert schema.field("at").type == TIMESTAMP_TYPE
    assert all(f.nullable for f in schema)
    with pytest.raises(ValueError, match="recursive message"):
        protobuf_to_arrow_schema('syntax = "proto3"; message Node { Node next = 1; }')
    with pytest.raises(ValueError, match="not defined"):
        protobuf_to_arrow_schema('syntax = "proto3"; message A { Nope x = 1; }')


def test_each_value_is_read_with_its_writer_message(registered):
    target, ids, v2_text = registered
    fmt = ValueFormat.for_protobuf(v2_text, "auto", target)
    fmt = pickle.loads(pickle.dumps(fmt))  # as the decode worker gets it
    old, new = message_class(V1), message_class(V2)
    full = old(id="a1", small=-5, big=-(2**40), huge=2**63 - 1, f32=2**32 - 1, ok=True, ratio=0.5, price=9.99,
               blob=b"\x00\x01", status=1, counts={"x": 3}, by_num={7: "seven"}, note="hi")
    full.lines.add(sku="s", qty=4)
    full.at.FromDatetime(datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc))
    full.maybe.value = 42
    values = pa.array([
        framed(ids["v1"]["id"], full),
        framed(ids["v2"]["id"], new(id="b2", coupon="SALE")),
        framed(ids["v2"]["id"], new(id="c3"), indexes=b"\x02\x00"),  # the explicit form of [0]
        None,
        framed(999, old(id="lost")),
        framed(ids["avro"]["id"], old(id="avro")),
        framed(ids["other"]["id"], message_class(OTHER)(id=5)),  # shop.Order with an int64 id: not a string
        framed(ids["v1"]["id"], old()) + b"\xff",  # undecodable bytes
        framed(ids["v1"]["id"], old(huge=2**64 - 1)),
        framed(ids["v1"]["id"], old(), indexes=b"\x02\x06"),  # message [3]: none
    ], pa.binary())
    typed, errors = parse_values(values, fmt)
    rows = typed.to_pylist()
    errs = errors.to_pylist()
    assert errs[:4] == [None, None, None, None], errs
    first = rows[0]
    assert first["id"] == "a1" and first["small"] == -5 and first["big"] == -(2**40)
    assert first["huge"] == 2**63 - 1 and first["f32"] == 2**32 - 1 and first["ok"] is True
    assert first["ratio"] == 0.5 and first["price"] == 9.99 and first["blob"] == b"\x00\x01"
    assert first["status"] == "PAID" and first["lines"] == [{"sku": "s", "qty": 4}]
    assert first["counts"] == [("x", 3)] and first["by_num"] == [(7, "seven")]
    assert first["at"] == datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc)
    assert first["maybe"] == 42 and first["note"] == "hi"
    # v1 had no coupon: null in the v2 column (not the proto3 default "")
    assert first["coupon"] is None
    second = rows[1]
    assert second["coupon"] == "SALE" and second["id"] == "b2"
    # proto3 scalars without presence read as their defaults; fields with presence unset are null
    assert second["small"] == 0 and second["status"] == "NEW" and second["lines"] == []
    assert second["at"] is None and second["maybe"] is None and second["note"] is None
    assert rows[2]["id"] == "c3"
    assert rows[3] == dict.fromkeys(typed.column_names)  # a tombstone
    assert "schema id 999 is not in the schema registry" in errs[4]
    assert "is a AVRO schema" in errs[5]
    assert errs[6] is not None  # an int64 id where the table has a string
    assert errs[7] is not None and "Protobuf decode failed" in errs[7]
    assert errs[8] is not None and "out of range for int64" in errs[8]
    assert errs[9] is not None and "no message 3" in errs[9]
    assert all(v is None for v in rows[4].values())


def test_the_schema_id_in_a_record_header(registered):
    """confluent-kafka's header_schema_id_serializer: magic 1 + the GUID + the message indexes in the
    ``__value_schema_id`` header, the value all message; an id header without indexes: they lead the value."""
    target, ids, v2_text = registered
    fmt = ValueFormat.for_protobuf(v2_text, "auto", target)
    message = message_class(V2)(id="h1", coupon="X").SerializeToString()
    guid = uuid.UUID(str(ids["v2"]["guid"])).bytes
    headers = pa.array([[{"key": "__value_schema_id", "value": b"\x01" + guid + b"\x00"}],
                        [{"key": "__value_schema_id", "value": b"\x00" + ids["v2"]["id"].to_bytes(4, "big")}],
                        [{"key": "__value_schema_id", "value": b"\x07"}]],
                       pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    values = pa.array([message, b"\x00" + message, message], pa.binary())
    typed, errors = parse_values(values, fmt, headers)
    assert errors.to_pylist()[:2] == [None, None]
    assert typed.column("id").to_pylist()[:2] == ["h1", "h1"]
    assert "neither a GUID" in errors.to_pylist()[2]


def test_a_headerless_value_is_read_with_the_table_message(registered):
    target, _, v2_text = registered
    fmt = ValueFormat.for_protobuf(v2_text, "auto", target)
    typed, errors = parse_values(pa.array([message_class(V2)(id="plain").SerializeToString()], pa.binary()), fmt)
    assert errors.to_pylist() == [None] and typed.column("id").to_pylist() == ["plain"]
    fmt = ValueFormat.for_protobuf(v2_text, "confluent", target)
    _, errors = parse_values(pa.array([message_class(V2)(id="plain").SerializeToString()], pa.binary()), fmt)
    assert "no Schema Registry header" in errors.to_pylist()[0]


def test_an_unreachable_registry_raises_instead_of_judging_the_record(registered):
    _, ids, v2_text = registered
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fmt = ValueFormat.for_protobuf(v2_text, "auto", f"http://127.0.0.1:{port}")
    with pytest.raises(RegistryUnavailable):
        parse_values(pa.array([framed(ids["v1"]["id"], message_class(V1)(id="a"))], pa.binary()), fmt)


def test_a_subset_of_the_columns_and_refusals():
    fmt = ValueFormat("protobuf", pa.schema([("price", pa.float64()), ("id", pa.string())]),
                      registry="unused.db", protobuf_schema=V1)
    assert fmt.schema.names == ["price", "id"]
    with pytest.raises(ValueError, match="schema says int32"):
        ValueFormat("protobuf", pa.schema([("price", pa.int32())]), registry="unused.db", protobuf_schema=V1)
    with pytest.raises(ValueError, match="needs a registry"):
        ValueFormat("protobuf", pa.schema([("id", pa.string())]), protobuf_schema=V1)


MONEY = 'syntax = "proto3"; package common; message Money { int64 units = 1; string currency = 2; }'
PRICED = ('syntax = "proto3"; package shop; import "common/money.proto";\n'
          "message Priced { string sku = 1; common.Money price = 2; }")


@pytest.mark.parametrize("over_http", [False, True])
def test_references_are_resolved_for_the_table_and_the_writer(tmp_path, over_http):
    """A schema importing another subject's version (as confluent-kafka registers an import): the table's
    columns and each writer's message are built with it, from the store or over HTTP."""
    from pipeline.registry.http import RegistryListener
    from pipeline.registry.lookup import SchemaLookup
    from pipeline.table.values import registry_value_format
    from tests.registry.test_http import running

    store = SchemaStore(tmp_path / "registry.db")
    registry = SchemaRegistry(store)
    registry.register("common/money.proto", {"schema": MONEY, "schemaType": "PROTOBUF"})
    priced = registry.register("priced-value", {
        "schema": PRICED, "schemaType": "PROTOBUF",
        "references": [{"name": "common/money.proto", "subject": "common/money.proto", "version": 1}]})
    refs = [("common/money.proto", "PROTOBUF", MONEY)]
    message = GetMessageClass(ProtobufKind.parse(PRICED, refs).message([0]))(sku="s1")
    message.price.units, message.price.currency = 12, "EUR"

    def check(target: str) -> None:
        found = SchemaLookup(target).references(priced["id"])
        assert found == tuple(refs)
        fmt = registry_value_format("PROTOBUF", PRICED, "auto", target, found)
        typed, errors = parse_values(pa.array([framed(priced["id"], message)], pa.binary()), fmt)
        assert errors.to_pylist() == [None]
        assert typed.to_pylist() == [{"sku": "s1", "price": {"units": 12, "currency": "EUR"}}]

    try:
        if over_http:
            with running(registry, RegistryListener("127.0.0.1", 0)) as url:
                check(url)
        else:
            check(str(tmp_path / "registry.db"))
    finally:
        store.close()
