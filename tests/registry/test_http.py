"""The registry's HTTP API with the real client of it: confluent-kafka's ``SchemaRegistryClient`` and
its Avro serializers, over real sockets (plain, TLS, basic authentication against SCRAM users)."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trustme

from pipeline.registry.http import CONTENT_TYPE, MAX_BODY_BYTES, RegistryListener, serve_registry
from pipeline.registry.service import SchemaRegistry
from pipeline.registry.store import SchemaStore
from pipeline.security.users import UserStore

confluent_sr = pytest.importorskip("confluent_kafka.schema_registry")
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

V1 = json.dumps({"type": "record", "name": "User", "namespace": "shop",
                 "fields": [{"name": "name", "type": "string"}]})
V2 = json.dumps({"type": "record", "name": "User", "namespace": "shop",
                 "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int", "default": -1}]})
V3 = json.dumps({"type": "record", "name": "User", "namespace": "shop",
                 "fields": [{"name": "name", "type": "int"}]})


@contextmanager
def running(registry: SchemaRegistry, listener: RegistryListener, authenticate=None) -> Iterator[str]:
    """``serve_registry`` in a thread of its own (its own trio run) until the block ends; yields its URL."""
    ready = threading.Event()
    state: dict = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            state["cancel"] = nursery.cancel_scope
            state["token"] = trio.lowlevel.current_trio_token()
            try:
                state["url"] = await nursery.start(serve_registry, registry, listener, authenticate)
            finally:
                ready.set()

    thread = threading.Thread(target=lambda: trio.run(main), daemon=True)
    thread.start()
    assert ready.wait(30) and "url" in state, "the registry did not start"
    try:
        yield state["url"]
    finally:
        state["token"].run_sync_soon(state["cancel"].cancel)
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[SchemaStore]:
    s = SchemaStore(tmp_path_factory.mktemp("registry") / "registry.db")
    yield s
    s.close()


@pytest.fixture(scope="module")
def url(store) -> Iterator[str]:
    with running(SchemaRegistry(store), RegistryListener("127.0.0.1", 0)) as u:
        yield u


def test_avro_producer_evolves_and_an_incompatible_version_is_refused(url):
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext("users", MessageField.VALUE)
    v1 = AvroSerializer(client, V1)({"name": "ann"}, ctx)
    v2 = AvroSerializer(client, V2)({"name": "bob", "age": 7}, ctx)
    assert v1[0] == v2[0] == 0  # Confluent's wire format: magic byte, then the 4-byte schema id
    id1, id2 = int.from_bytes(v1[1:5], "big"), int.from_bytes(v2[1:5], "big")
    assert id1 != id2
    # A reader with the writer's schema from the registry (the consumer's AvroDeserializer) reads both.
    reader = AvroDeserializer(client)
    assert reader(v1, ctx) == {"name": "ann"} and reader(v2, ctx) == {"name": "bob", "age": 7}
    # ...and with v2 as its reader schema, v1's record gets the new field's default.
    assert AvroDeserializer(client, V2)(v1, ctx) == {"name": "ann", "age": -1}
    assert client.get_versions("users-value") == [1, 2]
    assert client.get_latest_version("users-value").schema_id == id2
    assert client.get_schema(id1).schema_str == V1
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("users-value", Schema(V3, "AVRO"))
    assert e.value.http_status_code == 409 and e.value.error_code == 409
    assert client.test_compatibility("users-value", Schema(V3, "AVRO")) is False
    assert client.get_versions("users-value") == [1, 2]


def test_json_schema_producer_evolves_and_an_incompatible_version_is_refused(url):
    """JSON Schema (issue 32) with confluent-kafka's JSONSerializer and JSONDeserializer: v1 (a closed
    content model), v2 (an optional property added: BACKWARD), v3 (a property's type changed: 409)."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    def closed(**properties: str) -> str:
        return json.dumps({"type": "object", "additionalProperties": False,
                           "properties": {name: {"type": t} for name, t in properties.items()}})

    v1, v2, v3 = closed(sensor="string"), closed(sensor="string", celsius="number"), closed(sensor="integer")
    client = SchemaRegistryClient({"url": url})
    assert "JSON" in urllib.request.urlopen(f"{url}/schemas/types", timeout=10).read().decode()
    ctx = SerializationContext("readings", MessageField.VALUE)
    first = JSONSerializer(v1, client)({"sensor": "s-1"}, ctx)
    second = JSONSerializer(v2, client)({"sensor": "s-2", "celsius": 21.5}, ctx)
    assert first[0] == second[0] == 0 and first[1:5] != second[1:5]
    assert client.get_versions("readings-value") == [1, 2]
    assert client.get_latest_version("readings-value").schema.schema_type == "JSON"
    # The consumer's deserializer validates each value against its writer's schema, fetched by id.
    assert JSONDeserializer(None, schema_registry_client=client)(first, ctx) == {"sensor": "s-1"}
    assert JSONDeserializer(v2, schema_registry_client=client)(second, ctx) == {"sensor": "s-2", "celsius": 21.5}
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("readings-value", Schema(v3, "JSON"))
    assert e.value.http_status_code == 409
    assert client.test_compatibility("readings-value", Schema(v3, "JSON")) is False
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("readings-value", Schema('{"type": "strin"}', "JSON"))
    assert e.value.error_code == 42201


def test_another_broker_over_the_same_store_serves_the_schema(store, url):
    """A second registry over the same database (another broker of the cluster) reads what the first registered."""
    first = SchemaRegistryClient({"url": url})
    schema_id = first.register_schema("shared-value", Schema(V1, "AVRO"))
    with running(SchemaRegistry(SchemaStore(store.name)), RegistryListener("127.0.0.1", 0)) as other_url:
        other = SchemaRegistryClient({"url": other_url})
        assert other.get_schema(schema_id).schema_str == V1
        assert other.lookup_schema("shared-value", Schema(V1, "AVRO")).version == 1


def test_config_and_mode_over_http(url):
    client = SchemaRegistryClient({"url": url})
    client.register_schema("cfg-value", Schema(V1, "AVRO"))
    assert client.get_compatibility() == "BACKWARD"
    assert client.set_compatibility("cfg-value", "NONE") == {"compatibility": "NONE"}
    assert client.get_compatibility("cfg-value") == "NONE"
    client.register_schema("cfg-value", Schema(V3, "AVRO"))  # allowed under NONE
    assert client.update_mode("cfg-value", "READONLY") == "READONLY"
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema("cfg-value", Schema(V2, "AVRO"))
    assert e.value.error_code == 42205
    assert client.delete_mode("cfg-value") == "READONLY"
    assert client.register_schema("cfg-value", Schema(V2, "AVRO")) > 0  # writable again


def test_error_bodies_and_content_type(url):
    request = urllib.request.Request(f"{url}/subjects/nope/versions")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=10)
    assert e.value.code == 404 and e.value.headers["content-type"] == CONTENT_TYPE
    assert json.loads(e.value.read()) == {"error_code": 40401, "message": "Subject 'nope' not found."}
    bad = urllib.request.Request(f"{url}/subjects/x/versions", data=b"{oops", method="POST",
                                 headers={"Content-Type": CONTENT_TYPE})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad, timeout=10)
    assert e.value.code == 400
    # A body declared larger than the bound is refused before it is sent (or read).
    conn = http.client.HTTPConnection(*urllib.parse.urlsplit(url).netloc.split(":"), timeout=30)
    try:
        conn.putrequest("POST", "/subjects/x/versions")
        conn.putheader("Content-Type", CONTENT_TYPE)
        conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 413 and json.loads(response.read())["error_code"] == 413
    finally:
        conn.close()


def test_tls_and_basic_authentication_against_scram_users(tmp_path: Path, store):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_pem, ca_pem = tmp_path / "server.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(server_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    users = UserStore(tmp_path / "users.db")
    users.add("alice", "alice-secret")
    try:
        listener = RegistryListener("127.0.0.1", 0, certfile=server_pem)
        with running(SchemaRegistry(store), listener, users.verify_plain) as tls_url:
            assert tls_url.startswith("https://")
            good = SchemaRegistryClient({"url": tls_url, "ssl.ca.location": str(ca_pem),
                                         "basic.auth.user.info": "alice:alice-secret"})
            assert good.register_schema("auth-value", Schema(V1, "AVRO")) > 0
            for info in ("alice:wrong", "mallory:alice-secret"):
                bad = SchemaRegistryClient({"url": tls_url, "ssl.ca.location": str(ca_pem),
                                            "basic.auth.user.info": info})
                with pytest.raises(SchemaRegistryError) as e:
                    bad.get_subjects()
                assert e.value.http_status_code == 401 and e.value.error_code == 40101
            anonymous = SchemaRegistryClient({"url": tls_url, "ssl.ca.location": str(ca_pem)})
            with pytest.raises(SchemaRegistryError) as e:
                anonymous.get_subjects()
            assert e.value.http_status_code == 401
    finally:
        users.close()
