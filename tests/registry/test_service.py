"""The Schema Registry's operations (``pipeline.registry.service``) over a real store, on SQLite and
PostgreSQL: ids, versions, compatibility levels, deletes, modes, references, and the error codes
Confluent answers with."""

from __future__ import annotations

import json
import uuid

import pytest

from pipeline.registry.service import RegistryError, SchemaRegistry
from pipeline.registry.store import SchemaStore


def record(*fields: tuple[str, object], name: str = "User", **extra: object) -> dict:
    """A registration body for an Avro record of ``fields`` ((name, type) or (name, type, default))."""
    out = []
    for f in fields:
        entry = {"name": f[0], "type": f[1]}
        if len(f) > 2:
            entry["default"] = f[2]
        out.append(entry)
    return {"schema": json.dumps({"type": "record", "name": name, "fields": out}), **extra}


V1 = record(("name", "string"))
V2 = record(("name", "string"), ("age", "int", -1))  # a field added with a default: BACKWARD-compatible
V2_NO_DEFAULT = record(("name", "string"), ("age", "int"))  # not BACKWARD: old data has no age
V3 = record(("name", "int"))  # a type change: compatible in no direction


@pytest.fixture
def registry(metadata_target):
    store = SchemaStore(metadata_target("registry.db"))
    yield SchemaRegistry(store)
    store.close()


def code(excinfo: pytest.ExceptionInfo[RegistryError]) -> tuple[int, int]:
    return excinfo.value.error_code, excinfo.value.status


def test_ids_versions_and_the_same_schema_again(registry):
    registered = registry.register("users-value", V1)
    first, guid = registered["id"], registered["guid"]
    assert str(uuid.UUID(guid)) == guid
    assert registry.register("users-value", V1) == registered  # no new version, no check
    # Whitespace and key order do not make another schema; a registration under another subject keeps the id.
    spaced = {"schema": json.dumps(json.loads(V1["schema"]), indent=2, sort_keys=True)}
    assert registry.register("other-value", spaced) == registered
    v2 = registry.register("users-value", V2)
    second, second_guid = v2["id"], v2["guid"]
    assert second != first and second_guid != guid
    assert registry.versions("users-value") == [1, 2]
    assert registry.subjects() == ["other-value", "users-value"]
    latest = registry.version("users-value", "latest")
    assert latest == {"subject": "users-value", "version": 2, "id": second, "guid": second_guid,
                      "schema": V2["schema"]}
    assert registry.schema_by_guid(second_guid) == registry.schema_by_guid(second_guid.upper()) == {
        "schema": V2["schema"]}
    with pytest.raises(RegistryError) as e:
        registry.schema_by_guid(str(uuid.uuid4()))
    assert code(e) == (40403, 404)
    assert registry.version("users-value", 1)["id"] == first
    assert registry.schema_by_id(second) == {"schema": V2["schema"]}
    assert registry.schema_versions(first) == [{"subject": "other-value", "version": 1},
                                               {"subject": "users-value", "version": 1}]
    assert registry.lookup("users-value", V1) == {"subject": "users-value", "version": 1, "id": first,
                                                  "guid": guid, "schema": V1["schema"]}


def test_backward_is_the_default_and_refuses_with_409(registry):
    registry.register("s", V1)
    assert registry.get_config(None) == {"compatibilityLevel": "BACKWARD"}
    with pytest.raises(RegistryError) as e:
        registry.register("s", V2_NO_DEFAULT)
    assert code(e) == (409, 409) and "age" in e.value.message
    with pytest.raises(RegistryError) as e:
        registry.register("s", V3)
    assert code(e) == (409, 409)
    assert registry.versions("s") == [1]  # nothing registered by a refusal
    assert registry.test_compatibility("s", "latest", V3, verbose=True)["is_compatible"] is False
    assert registry.test_compatibility("s", None, V2) == {"is_compatible": True}


@pytest.mark.parametrize("level, accepted", [
    ("NONE", {"V2_NO_DEFAULT", "V3"}),
    ("FORWARD", {"V2_NO_DEFAULT"}),  # the old schema reads new data: it ignores the extra field
    ("FULL", set()),
])
def test_levels(registry, level, accepted):
    schemas = {"V2_NO_DEFAULT": V2_NO_DEFAULT, "V3": V3}
    for name, body in schemas.items():
        subject = f"{level}-{name}"
        registry.register(subject, V1)
        assert registry.set_config(subject, {"compatibility": level.lower()}) == {"compatibility": level}
        if name in accepted:
            assert registry.register(subject, body)["id"] > 0
        else:
            with pytest.raises(RegistryError) as e:
                registry.register(subject, body)
            assert code(e) == (409, 409)


def test_transitive_checks_every_version(registry):
    registry.set_config(None, {"compatibility": "NONE"})
    registry.register("t", V1)
    registry.register("t", V3)  # name: int, allowed under NONE
    as_long = record(("name", "long"))  # reads v2's int (Avro's promotion), not v1's string
    assert registry.set_config("t", {"compatibility": "BACKWARD_TRANSITIVE"})
    with pytest.raises(RegistryError) as e:
        registry.register("t", as_long)
    assert "string" in e.value.message
    registry.set_config("t", {"compatibility": "BACKWARD"})
    assert registry.register("t", as_long)["id"] > 0
    registry.set_config("t", {"compatibility": "BACKWARD_TRANSITIVE"})
    assert registry.get_config("t") == {"compatibilityLevel": "BACKWARD_TRANSITIVE"}
    assert registry.delete_config("t") == {"compatibilityLevel": "BACKWARD_TRANSITIVE"}
    with pytest.raises(RegistryError) as e:
        registry.get_config("t")
    assert code(e) == (40408, 404)
    assert registry.get_config("t", default_to_global=True) == {"compatibilityLevel": "NONE"}
    with pytest.raises(RegistryError) as e:
        registry.set_config(None, {"compatibility": "SIDEWAYS"})
    assert code(e) == (42203, 422)


def test_deletes(registry):
    first = registry.register("d", V1)["id"]
    second = registry.register("d", V2)["id"]
    with pytest.raises(RegistryError) as e:
        registry.delete_version("d", 1, permanent=True)
    assert code(e) == (40407, 404)
    assert registry.delete_version("d", 2) == 2
    assert registry.versions("d") == [1] and registry.versions("d", deleted=True) == [1, 2]
    assert registry.version("d", "latest")["version"] == 1
    assert registry.register("d", V2)["id"] == second  # registered again: version 3, the same id
    assert registry.versions("d") == [1, 3]
    with pytest.raises(RegistryError) as e:
        registry.delete_subject("d", permanent=True)
    assert code(e) == (40405, 404)
    assert registry.delete_subject("d") == [1, 3]
    assert registry.subjects() == [] and registry.subjects(deleted=True) == ["d"]
    with pytest.raises(RegistryError) as e:
        registry.versions("d")
    assert code(e) == (40401, 404)
    assert registry.delete_subject("d", permanent=True) == [1, 2, 3]
    assert registry.subjects(deleted=True) == []
    assert registry.schema_by_id(first) == {"schema": V1["schema"]}  # ids stay readable: records carry them


def test_errors(registry):
    with pytest.raises(RegistryError) as e:
        registry.versions("nope")
    assert code(e) == (40401, 404)
    registry.register("e", V1)
    for bad, expected in [("0", 42202), ("x", 42202), ("7", 40402)]:
        with pytest.raises(RegistryError) as e:
            registry.version("e", bad)
        assert e.value.error_code == expected
    with pytest.raises(RegistryError) as e:
        registry.schema_by_id(999)
    assert code(e) == (40403, 404)
    with pytest.raises(RegistryError) as e:
        registry.lookup("e", V2)
    assert code(e) == (40403, 404)
    for body in ({"schema": "{not json"}, {"schema": '{"type": "record", "name": "R", "fields": [{"name": "a"}]}'},
                 {"schema": '"nope"'}, {}, {"schema": '"string"', "schemaType": "XML"}):
        with pytest.raises(RegistryError) as e:
            registry.register("e", body)
        assert code(e) == (42201, 422), body
    with pytest.raises(RegistryError) as e:
        registry.register("e", {**V2, "id": 5})
    assert code(e) == (42204, 422)


def test_modes(registry):
    registry.register("m", V1)
    assert registry.get_mode(None) == {"mode": "READWRITE"}
    assert registry.set_mode("m", {"mode": "READONLY"}) == {"mode": "READONLY"}
    with pytest.raises(RegistryError) as e:
        registry.register("m", V2)
    assert code(e) == (42205, 422)
    with pytest.raises(RegistryError) as e:
        registry.delete_subject("m")
    assert code(e) == (42205, 422)
    assert registry.register("n", V1)["id"] > 0  # other subjects follow the global mode
    assert registry.delete_mode("m") == {"mode": "READONLY"}
    assert registry.register("m", V2)["id"] > 0
    with pytest.raises(RegistryError) as e:
        registry.set_mode(None, {"mode": "IMPORT"})
    assert code(e) == (42204, 422)


def test_references(registry):
    address = {"schema": json.dumps({"type": "record", "name": "Address", "namespace": "shop",
                                     "fields": [{"name": "city", "type": "string"}]})}
    registry.register("address", address)
    order = {"schema": json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                                   "fields": [{"name": "to", "type": "shop.Address"}]}),
             "references": [{"name": "shop.Address", "subject": "address", "version": 1}]}
    order_id = registry.register("orders-value", order)["id"]
    assert registry.schema_by_id(order_id)["references"] == order["references"]
    assert registry.referenced_by("address", 1) == [order_id]
    without = {"schema": order["schema"]}
    with pytest.raises(RegistryError) as e:
        registry.register("orders-value", without)  # shop.Address is unknown without the reference
    assert code(e) == (42201, 422)
    missing = {**order, "references": [{"name": "shop.Address", "subject": "address", "version": 9}]}
    with pytest.raises(RegistryError) as e:
        registry.register("other", missing)
    assert code(e) == (42201, 422)


def test_two_registries_over_one_store_agree(metadata_target):
    """Two brokers' registries over one database (SQLite file or PostgreSQL): what one registers,
    the other reads and checks against."""
    a, b = (SchemaRegistry(SchemaStore(metadata_target("registry.db"))) for _ in range(2))
    try:
        first = a.register("shared-value", V1)["id"]
        assert b.schema_by_id(first) == {"schema": V1["schema"]}
        assert b.register("shared-value", V1)["id"] == first
        with pytest.raises(RegistryError):
            b.register("shared-value", V3)
        second = b.register("shared-value", V2)["id"]
        assert a.version("shared-value", "latest")["id"] == second and second == first + 1
    finally:
        a.store.close()
        b.store.close()
