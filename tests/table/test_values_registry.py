"""Typed Avro values read with their writer's schema from the registry (issue 32): the id of a value's
wire-format header is looked up in pipeline's registry store, or in a registry over HTTP (confluent-kafka's
serializer against pipeline's registry server), and resolved against the topic's schema."""

from __future__ import annotations

import io
import json
import pickle
import socket

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer

from pipeline.registry.lookup import RegistryUnavailable
from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from pipeline.table.values import ValueFormat, parse_values
from tests.registry.test_http import running

V1 = {"type": "record", "name": "User", "namespace": "shop", "fields": [{"name": "name", "type": "string"}]}
V2 = {"type": "record", "name": "User", "namespace": "shop",
      "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": -1}]}
OTHER = {"type": "record", "name": "User", "namespace": "shop", "fields": [{"name": "name", "type": "int"}]}


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    """Confluent's wire format: magic byte 0, the 4-byte big-endian id, the Avro binary record."""
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


@pytest.fixture
def registered(tmp_path):
    """A registry store with User v1 and v2 under ``users-value``, and ``OTHER`` under another subject."""
    target = str(tmp_path / "registry.db")
    store = SchemaStore(target)
    registry = SchemaRegistry(store)
    ids = {name: registry.register(subject, {"schema": json.dumps(schema)})["id"]
           for name, subject, schema in [("v1", "users-value", V1), ("v2", "users-value", V2),
                                         ("other", "others-value", OTHER)]}
    yield target, registry, ids
    store.close()


def test_each_value_is_read_with_its_writer_schema_and_resolved(registered):
    target, _, ids = registered
    fmt = ValueFormat.for_avro(V2, registry=target)
    fmt = pickle.loads(pickle.dumps(fmt))  # as the decode worker gets it
    values = pa.array([framed(ids["v1"], V1, {"name": "ann"}), framed(ids["v2"], V2, {"name": "bob", "age": 7}),
                       None, framed(999, V1, {"name": "lost"}), framed(ids["other"], OTHER, {"name": 5})],
                      pa.binary())
    columns, errors = parse_values(values, fmt)
    assert columns.column("name").to_pylist() == ["ann", "bob", None, None, None]
    # v1 had no age: Avro schema resolution gives the reader's (the topic schema's) default.
    assert columns.column("age").to_pylist() == [-1, 7, None, None, None]
    errs = errors.to_pylist()
    assert errs[:3] == [None, None, None]
    assert "schema id 999 is not in the schema registry" in errs[3]
    assert errs[4] is not None and "Avro decode failed" in errs[4]  # int name cannot resolve to string


def test_without_a_registry_the_configured_schema_reads_every_value(registered):
    _, _, ids = registered
    v1_value = framed(ids["v1"], V1, {"name": "ann"})
    _, errors = parse_values(pa.array([v1_value], pa.binary()), ValueFormat.for_avro(V2))
    [error] = errors.to_pylist()  # read as a v2 record, the v1 bytes end where v2 wants its age
    assert error is not None and "Avro decode failed" in error


def test_an_unreachable_registry_raises_instead_of_judging_the_record(registered):
    _, _, ids = registered
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fmt = ValueFormat.for_avro(V2, registry=f"http://127.0.0.1:{port}")
    with pytest.raises(RegistryUnavailable):
        parse_values(pa.array([framed(ids["v1"], V1, {"name": "ann"})], pa.binary()), fmt)


def test_writer_schemas_from_a_registry_over_http(registered):
    """The external-registry setting, against pipeline's own registry server, with the values written by
    confluent-kafka's AvroSerializer (the producers' real client)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from pipeline.registry.http import RegistryListener

    _, registry, _ = registered
    with running(registry, RegistryListener("127.0.0.1", 0)) as url:
        client = SchemaRegistryClient({"url": url})
        ctx = SerializationContext("people", MessageField.VALUE)
        old = AvroSerializer(client, json.dumps(V1))({"name": "cy"}, ctx)
        new = AvroSerializer(client, json.dumps(V2))({"name": "di", "age": 30}, ctx)
        columns, errors = parse_values(pa.array([old, new], pa.binary()), ValueFormat.for_avro(V2, registry=url))
    assert errors.to_pylist() == [None, None]
    assert columns.to_pylist() == [{"name": "cy", "age": -1}, {"name": "di", "age": 30}]


def test_the_schema_id_in_a_record_header(registered):
    """Schema Registry 8.0's header form, written by confluent-kafka's ``header_schema_id_serializer``
    (a GUID in ``__value_schema_id``, the value all payload), beside the payload-prefix form, looked up
    in the store and over HTTP; a header that is neither a GUID nor an id is that record's error."""
    from confluent_kafka.schema_registry import SchemaRegistryClient, header_schema_id_serializer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from pipeline.registry.http import RegistryListener
    from pipeline.table.schema import HEADERS_ARROW_TYPE

    target, registry, _ = registered
    with running(registry, RegistryListener("127.0.0.1", 0)) as url:
        client = SchemaRegistryClient({"url": url})
        by_header = AvroSerializer(client, json.dumps(V1), conf={"schema.id.serializer": header_schema_id_serializer})
        ctx = SerializationContext("people", MessageField.VALUE, headers=[])
        in_header = by_header({"name": "eve"}, ctx)
        [(key, header)] = ctx.headers
        prefixed = AvroSerializer(client, json.dumps(V2))({"name": "fay", "age": 4},
                                                          SerializationContext("people", MessageField.VALUE))
        assert key == "__value_schema_id" and header[0] == 1 and len(header) == 17  # magic 1 + a GUID
        values = pa.array([in_header, prefixed, in_header], pa.binary())
        headers = pa.array([[{"key": key, "value": header}], None, [{"key": key, "value": b"\x07junk"}]],
                           HEADERS_ARROW_TYPE)
        for where in (target, url):
            columns, errors = parse_values(values, ValueFormat.for_avro(V2, registry=where), headers)
            assert columns.to_pylist()[:2] == [{"name": "eve", "age": -1}, {"name": "fay", "age": 4}], where
            assert errors.to_pylist()[:2] == [None, None]
            assert "neither a GUID" in errors.to_pylist()[2]
