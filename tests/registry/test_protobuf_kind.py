"""Protobuf schemas in the registry: both registered forms, references, and Confluent's compatibility
rules (``protobuf-provider/.../diff``), each rule by one pair of schemas."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import descriptor_pb2

from pipeline.registry import compatibility
from pipeline.registry.compatibility import InvalidSchema
from pipeline.registry.protobuf_kind import ProtobufKind

BASE = """syntax = "proto3";
package shop;
message Order {
  string id = 1;
  int32 qty = 2;
  repeated string tags = 3;
  Item item = 4;
  map<string, int32> counts = 5;
  oneof pay { string card = 6; string iban = 7; }
  Status status = 8;
  double price = 9;
}
message Item { string sku = 1; }
enum Status { NEW = 0; PAID = 1; }
"""


def reasons(new: str, old: str = BASE, level: str = "BACKWARD", refs=()) -> list[str]:
    """Why ``new`` may not follow ``old`` under ``level`` ([] if it may)."""
    parsed_old = compatibility.parse("PROTOBUF", old, refs)
    parsed_new = compatibility.parse("PROTOBUF", new, refs)
    return compatibility.check(level, parsed_new, [parsed_old])


def kinds(found: list[str]) -> set[str]:
    return {r.split('"')[1] for r in found}


@pytest.mark.parametrize("change", [
    ("double price = 9;", "double price = 9;\n  string coupon = 10;"),  # field added
    ("double price = 9;", ""),  # field removed
    ("string id = 1;", "string order_id = 1;"),  # renamed
    ("int32 qty = 2;", "int64 qty = 2;"),  # int32 int64 uint32 uint64 bool: one wire group
    ("int32 qty = 2;", "bool qty = 2;"),
    ("string id = 1;", "bytes id = 1;"),
    ("Status status = 8;", "int32 status = 8;"),  # an enum is a number
    ("repeated string tags = 3;", "string tags = 3;"),  # string/bytes labels may change
    ("int32 qty = 2;", "repeated int32 qty = 2;"),  # proto3's implicit presence has no label to compare
    # out of a oneof (backward only: forward, two fields would move into one oneof)
    ("oneof pay { string card = 6; string iban = 7; }", "string card = 6; string iban = 7;"),
    ("oneof pay { string card = 6; string iban = 7; }", ""),  # a oneof removed whole
    ("enum Status { NEW = 0; PAID = 1; }", "enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }"),
    ("message Item { string sku = 1; }", "message Item { string sku = 1; }\nmessage Extra { int32 x = 1; }"),
])
def test_compatible_changes(change):
    old, new = change
    changed = BASE.replace(old, new)
    assert changed != BASE
    assert reasons(changed) == []
    if "oneof" not in old and "message" not in old:  # a message added or a field moved out: backward only
        assert reasons(changed, level="FULL") == []


@pytest.mark.parametrize("change, kind", [
    (("int32 qty = 2;", "sint32 qty = 2;"), "FIELD_SCALAR_KIND_CHANGED"),
    (("string id = 1;", "int64 id = 1;"), "FIELD_SCALAR_KIND_CHANGED"),
    (("double price = 9;", "float price = 9;"), "FIELD_SCALAR_KIND_CHANGED"),
    (("int32 qty = 2;", "Item qty = 2;"), "FIELD_KIND_CHANGED"),
    (("Item item = 4;", "map<string, string> item = 4;"), "FIELD_KIND_CHANGED"),
    (("map<string, int32> counts = 5;", "map<string, string> counts = 5;"), "FIELD_SCALAR_KIND_CHANGED"),
    (("Item item = 4;", "Order item = 4;"), "FIELD_NAMED_TYPE_CHANGED"),
    (("Item item = 4;", "Thing item = 4;"), "FIELD_NAMED_TYPE_CHANGED"),  # Item renamed Thing (below)
    (("package shop;", "package store;"), "PACKAGE_CHANGED"),
    (("oneof pay { string card = 6; string iban = 7; }", "oneof pay { string card = 6; }"), "ONEOF_FIELD_REMOVED"),
    (("oneof pay { string card = 6; string iban = 7; }",
      "oneof pay { string card = 6; string iban = 7; int32 qty2 = 2; }"), "FIELD_MOVED_TO_EXISTING_ONEOF"),
])
def test_incompatible_changes(change, kind):
    old, new = change
    changed = BASE.replace(old, new)
    if "qty2 = 2" in changed:  # tag 2 moves into the oneof
        changed = changed.replace("  int32 qty = 2;\n", "")
    if "Thing item" in changed:
        changed = changed.replace("message Item {", "message Thing {")
    assert changed != BASE
    assert kind in kinds(reasons(changed))


def test_messages_removed_and_fields_moved_into_a_new_oneof():
    assert "MESSAGE_REMOVED" in kinds(reasons(BASE.replace("message Item { string sku = 1; }", "")
                                              .replace("Item item = 4;", "")))
    moved = BASE.replace("  string id = 1;\n  int32 qty = 2;\n", "  oneof both { string id = 1; int32 qty = 2; }\n")
    assert kinds(reasons(moved)) == {"MULTIPLE_FIELDS_MOVED_TO_ONEOF"}


def test_proto2_labels_and_required_fields():
    v1 = 'syntax = "proto2"; message M { optional int32 a = 1; optional string s = 2; required int32 r = 3; }'
    assert kinds(reasons(v1.replace("optional int32 a", "repeated int32 a"), v1)) == {"FIELD_NUMERIC_LABEL_CHANGED"}
    assert reasons(v1.replace("optional string s", "repeated string s"), v1) == []
    assert kinds(reasons(v1.replace("required int32 r = 3;", ""), v1)) == {"REQUIRED_FIELD_REMOVED"}
    assert kinds(reasons(v1.replace("}", "required int32 n = 4; }"), v1)) == {"REQUIRED_FIELD_ADDED"}


def test_a_referenced_message_is_compared_field_by_field():
    main = 'syntax = "proto3"; package shop; import "common/money.proto"; message A { common.Money m = 1; }'
    money = 'syntax = "proto3"; package common; message Money { int64 units = 1; }'
    old = compatibility.parse("PROTOBUF", main, [("common/money.proto", "PROTOBUF", money)])
    new = compatibility.parse("PROTOBUF", main,
                              [("common/money.proto", "PROTOBUF", money.replace("int64 units", "string units"))])
    assert kinds(compatibility.check("BACKWARD", new, [old])) == {"FIELD_SCALAR_KIND_CHANGED",
                                                                  "FIELD_NAMED_TYPE_CHANGED"}
    fine = compatibility.parse("PROTOBUF", main,
                               [("common/money.proto", "PROTOBUF", money.replace("}", "int32 nanos = 2; }"))])
    assert compatibility.check("FULL", fine, [old]) == []


def test_both_forms_parse_to_the_same_schema_and_serialize():
    text = ('syntax = "proto3"; package shop; import "google/protobuf/timestamp.proto";\n'
            "message Order { string id = 1; google.protobuf.Timestamp at = 2; }")
    parsed = compatibility.parse("PROTOBUF", text)
    serialized = compatibility.formatted(parsed, "serialized")
    assert serialized is not None
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized))
    assert proto.name == "default" and proto.package == "shop"
    assert list(proto.dependency) == ["google/protobuf/timestamp.proto"]  # well-known: no reference needed
    again = compatibility.parse("PROTOBUF", serialized)
    assert compatibility.check("FULL", again, [parsed]) == []
    assert compatibility.canonical("PROTOBUF", serialized) == serialized
    assert compatibility.canonical("PROTOBUF", f"  {text}\n") == text
    assert compatibility.formatted(parsed, "ignore_extensions") is None
    assert "PROTOBUF" in compatibility.SCHEMA_TYPES


@pytest.mark.parametrize("text, refs, message", [
    ('syntax = "proto3"; message A { strin x = 1; }', (), '"strin" is not defined'),
    ('syntax = "proto3"; import "other.proto"; message A { int32 x = 1; }', (), "neither a reference"),
    ('syntax = "proto3"; import "a.avsc"; message A { int32 x = 1; }', (("a.avsc", "AVRO", "{}"),),
     "cannot reference a AVRO schema"),
    ("", (), "empty"),
])
def test_invalid_schemas(text, refs, message):
    with pytest.raises(InvalidSchema, match=message):
        compatibility.canonical("PROTOBUF", text)
        ProtobufKind.parse(text, refs)
