"""Listener parsing (KIP-103), the per-listener endpoint of BrokerInfo, and the listener keys of the config."""

import pytest

from pipeline.config import ConfigError, KEYS, resolve
from pipeline.network.listeners import (
    DEFAULT_PROTOCOL_MAP,
    Endpoint,
    check_listeners,
    parse_endpoints,
    parse_protocol_map,
    security_protocol,
)
from pipeline.protocol.apis import BrokerInfo
from pipeline.config import ServerConfig
from pipeline.server import advertised_endpoints, listener_endpoints


def test_kafka_listener_lists_parse_in_order():
    assert parse_endpoints("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,sasl_ssl://[::1]:0") == (
        Endpoint("PLAINTEXT", "127.0.0.1", 9092), Endpoint("SSL", "127.0.0.1", 9093), Endpoint("SASL_SSL", "::1", 0))
    assert parse_endpoints("0.0.0.0:19092") == (Endpoint("PLAINTEXT", "0.0.0.0", 19092),)
    assert str(Endpoint("SSL", "::1", 9093)) == "SSL://[::1]:9093"


@pytest.mark.parametrize("text, message", [
    ("", "expected NAME://HOST:PORT"),
    ("127.0.0.1", "expected NAME://HOST:PORT"),
    ("PLAINTEXT://127.0.0.1:9092,", "expected NAME://HOST:PORT"),
    ("127.0.0.1:9092,SSL://127.0.0.1:9093", "NAME://HOST:PORT for each"),
    ("PLAINTEXT://h:1,PLAINTEXT://h:2", "different name"),
    ("PLAINTEXT://h:1,SSL://h:1", "different port"),
    ("SSL://h:70000", "expected NAME://HOST:PORT"),
    ("S SL://h:1", "bad listener name"),
])
def test_bad_listener_lists_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_endpoints(text)


def test_two_listeners_on_port_0_are_fine():
    assert [e.port for e in parse_endpoints("PLAINTEXT://h:0,SSL://h:0")] == [0, 0]


def test_protocol_map():
    assert parse_protocol_map("internal:ssl, EXTERNAL:SASL_SSL") == (("INTERNAL", "SSL"), ("EXTERNAL", "SASL_SSL"))
    assert security_protocol("SASL_PLAINTEXT", DEFAULT_PROTOCOL_MAP) == "SASL_PLAINTEXT"
    for bad in ("INTERNAL", "INTERNAL:TLS", "A:SSL,A:PLAINTEXT", ":SSL"):
        with pytest.raises(ValueError):
            parse_protocol_map(bad)
    with pytest.raises(ValueError, match="no security protocol defined for listener INTERNAL"):
        check_listeners((Endpoint("INTERNAL", "h", 1),), (), DEFAULT_PROTOCOL_MAP)
    with pytest.raises(ValueError, match="advertised.listeners names SSL"):
        check_listeners((Endpoint("PLAINTEXT", "h", 1),), (Endpoint("SSL", "h", 2),), DEFAULT_PROTOCOL_MAP)


def test_config_keys_take_kafka_syntax_and_show_it_back():
    resolved = resolve(None, {"PIPELINE_LISTENERS": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:9093",
                              "PIPELINE_ADVERTISED_LISTENERS": "SSL://broker.example:19093",
                              "PIPELINE_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,SSL:SSL",
                              "PIPELINE_SSL_KEY_PASSWORD": "s3cret"}, {})
    c = resolved.server
    assert (c.listen_host, c.listen_port) == ("127.0.0.1", 0)
    assert listener_endpoints(c) == (Endpoint("PLAINTEXT", "127.0.0.1", 0), Endpoint("SSL", "127.0.0.1", 9093))
    rows = {r["key"]: r["value"] for r in resolved.rows()}
    assert rows["listeners"] == "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:9093"
    assert rows["advertised.listeners"] == "SSL://broker.example:19093"
    assert rows["ssl.key.password"] == "[hidden]"
    assert rows["ssl.client.auth"] == "none" and rows["ssl.enabled.protocols"] == "TLSv1.2,TLSv1.3"
    assert KEYS["listeners"].parse(rows["listeners"], True) == resolved.values["listeners"]
    # the bound ports go to the listeners without an advertised entry
    bound = [(Endpoint("PLAINTEXT", "127.0.0.1", 0), "127.0.0.1", 40001), (Endpoint("SSL", "127.0.0.1", 9093),
                                                                          "127.0.0.1", 9093)]
    assert advertised_endpoints(c, bound) == (("PLAINTEXT", "127.0.0.1", 40001), ("SSL", "broker.example", 19093))


def test_a_listener_without_protocol_or_advertised_name_stops_the_config():
    with pytest.raises(ConfigError, match="^env:PIPELINE_LISTENERS: listeners: no security protocol"):
        resolve(None, {"PIPELINE_LISTENERS": "INTERNAL://127.0.0.1:0"}, {})
    c = resolve(None, {"PIPELINE_LISTENERS": "INTERNAL://127.0.0.1:0",
                       "PIPELINE_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:SSL"}, {}).server
    assert listener_endpoints(c)[0].name == "INTERNAL"
    with pytest.raises(ConfigError, match="advertised.listeners names SSL"):
        resolve(None, {"PIPELINE_ADVERTISED_LISTENERS": "SSL://h:1"}, {})


def test_the_legacy_advertised_address_applies_to_the_first_listener():
    c = ServerConfig(advertised_host="example.test", advertised_port=19092)
    assert advertised_endpoints(c, [(Endpoint("PLAINTEXT", "127.0.0.1", 0), "127.0.0.1", 5)]) == (
        ("PLAINTEXT", "example.test", 19092),)


def test_broker_info_answers_with_the_connections_listener():
    b = BrokerInfo(0, "127.0.0.1", 9092, "c", (("PLAINTEXT", "127.0.0.1", 9092), ("SSL", "tls.example", 9093)))
    assert b.for_listener("PLAINTEXT") is b
    assert (b.for_listener("SSL").host, b.for_listener("SSL").port) == ("tls.example", 9093)
    assert b.for_listener("UNKNOWN") is b
    assert BrokerInfo(0, "h", 1, "c").for_listener("PLAINTEXT").port == 1


def test_listener_prefixed_overrides_give_each_tls_listener_its_own_certificate(tmp_path):
    """Kafka's listener.name.<name>.ssl.* (KIP-103): two SSL listeners, two certificates, one file."""
    import ssl

    import trustme

    from pipeline.server import build_listeners, listener_config

    ca = trustme.CA()
    default, internal = tmp_path / "external.pem", tmp_path / "internal.pem"
    ca.issue_cert("broker.example").private_key_and_cert_chain_pem.write_to_path(str(default))
    ca.issue_cert("broker.internal").private_key_and_cert_chain_pem.write_to_path(str(internal))
    toml = tmp_path / "pipeline.toml"
    toml.write_text(f'''
listeners = "EXTERNAL://127.0.0.1:0,INTERNAL://127.0.0.1:0,CLIENTS://127.0.0.1:0"
listener.security.protocol.map = "EXTERNAL:SSL,INTERNAL:SSL,CLIENTS:SASL_PLAINTEXT"
ssl.keystore.location = "{default}"
listener.name.internal.ssl.keystore.location = "{internal}"
listener.name.internal.ssl.client.auth = "required"
listener.name.internal.ssl.key.password = "not-shown"
listener.name.clients.sasl.enabled.mechanisms = "SCRAM-SHA-512"
''')
    resolved = resolve(toml, {}, {})
    c = resolved.server
    assert listener_config(c, "EXTERNAL") is c
    inside = listener_config(c, "INTERNAL")
    assert inside.ssl_keystore_location == internal and inside.ssl_client_auth == "required"
    assert listener_config(c, "CLIENTS").sasl_enabled_mechanisms == "SCRAM-SHA-512"
    rows = {r["key"]: (r["value"], r["source"]) for r in resolved.rows()}
    assert rows["listener.name.internal.ssl.keystore.location"] == (str(internal), f"file:{toml}")
    assert rows["listener.name.internal.ssl.key.password"][0] == "[hidden]"
    assert rows["listener.name.clients.sasl.enabled.mechanisms"][0] == "SCRAM-SHA-512"
    # the key password applies to INTERNAL only; its key is not encrypted, so drop it to build contexts
    c = c.__class__(**{**{f: getattr(c, f) for f in c.__dataclass_fields__},
                       "listener_overrides": tuple((n, tuple(kv for kv in s if kv[0] != "ssl_key_password"))
                                                   for n, s in c.listener_overrides)})
    listeners = {endpoint.name: listener for endpoint, listener in build_listeners(c)}
    external, inner = listeners["EXTERNAL"].ssl_context, listeners["INTERNAL"].ssl_context
    assert external is not inner and listeners["CLIENTS"].ssl_context is None
    assert external.verify_mode == ssl.CERT_NONE and inner.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("line, message", [
    ('listener.name.internal.num.io.threads = 4', "a listener can override only ssl.keystore.location"),
    ('listener.name.nosuch.ssl.client.auth = "required"', "no listener named 'nosuch' in listeners"),
    ('listener.name.internal.ssl.client.auth = "sometimes"', "ssl.client.auth"),
])
def test_bad_listener_overrides_name_the_key(tmp_path, line, message):
    toml = tmp_path / "pipeline.toml"
    toml.write_text(f'listeners = "INTERNAL://127.0.0.1:0"\nlistener.security.protocol.map = "INTERNAL:SSL"\n{line}\n')
    with pytest.raises(ConfigError, match=message):
        resolve(toml, {}, {})


def test_a_free_listen_port_is_below_the_ephemeral_range_bindable_and_not_one_to_avoid():
    import socket

    from pipeline.network.listeners import ephemeral_ports, free_listen_port

    low, high = ephemeral_ports()
    assert 1024 <= low <= high <= 65535
    picked: set[int] = set()
    for _ in range(20):
        port = free_listen_port("127.0.0.1", avoid=picked)
        assert port < low and port not in picked
        picked.add(port)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_free_listen_port_comes_from_the_ports_asked_for_and_not_a_bound_one():
    import socket

    from pipeline.network.listeners import free_listen_port
    from tests.e2e.server_process import free_port

    # both ports from this worker's slice of the test ports, below the ephemeral range: a port next to
    # a kernel-picked one (port 0) was once taken by another process's outgoing connection mid-test
    bound, other = free_port(), free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", bound))
        taken.listen()
        # the bound port is never handed out: every pick is the other one
        assert {free_listen_port("127.0.0.1", ports=[bound, other]) for _ in range(20)} == {other}
        with pytest.raises(OSError, match="no free port"):
            free_listen_port("127.0.0.1", ports=[bound], tries=5)
