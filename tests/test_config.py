"""The configuration key registry (pipeline/config.py) and its flags (pipeline/cli.py), without a server."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from pipeline.cli import add_serve_arguments, build_parser, flag_values
from pipeline.config import ENV_PREFIX, KEYS, ConfigError, default_value, load_config, resolve
from pipeline.observe.structured_logs import LogConfig
from pipeline.config import Mode, ServerConfig
from pipeline.table.table_config import TableConfig


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_every_serverconfig_field_has_exactly_one_key():
    reached = [f for key in KEYS.values() for f in key.fields]
    assert len(reached) == len(set(reached)), "a field set by two keys"
    server_fields = {f.name for f in dataclasses.fields(ServerConfig)} - {"table", "listener_overrides"}
    table_fields = {f"table.{f.name}" for f in dataclasses.fields(TableConfig)} - {"table.topics"}
    log_fields = {f"log.{f.name}" for f in dataclasses.fields(LogConfig)}
    assert set(reached) == server_fields | table_fields | log_fields


def test_defaults_are_the_dataclasses_own():
    resolved = resolve(None, environ={}, flags={})
    assert resolved.server == ServerConfig()
    assert resolved.log == LogConfig()
    assert set(resolved.sources.values()) == {"default"}
    d = ServerConfig()
    assert default_value(KEYS["listeners"]) == (d.listen_host, d.listen_port, None)
    assert default_value(KEYS["advertised.listeners"]) is None
    assert default_value(KEYS["num.network.threads"]) == d.network_threads
    assert default_value(KEYS["file.delete.delay.ms"]) == d.table.file_delete_delay_ms
    assert default_value(KEYS["log.format"]) == "plain"


def test_every_default_survives_the_text_of_env_and_flags():
    """What ``config show`` prints for a default, given back through the environment, is the default."""
    for key in KEYS.values():
        default = default_value(key)
        if default is None:
            continue
        shown = key.show(default)
        text = str(shown).lower() if isinstance(shown, bool) else str(shown)
        assert key.parse(text, True) == default, key.name


def test_names_env_variables_and_flags_are_unique_and_follow_the_rule():
    envs = [k.env for k in KEYS.values()]
    flags = [k.flag for k in KEYS.values()]
    assert len(set(envs)) == len(envs) and len(set(flags)) == len(flags)
    assert KEYS["num.network.threads"].env == "PIPELINE_NUM_NETWORK_THREADS"
    assert KEYS["pipeline.queues"].env == "PIPELINE_PIPELINE_QUEUES"
    assert all(e == ENV_PREFIX + k.name.upper().replace(".", "_") for e, k in zip(envs, KEYS.values()))


def test_precedence_defaults_file_environment_flags(tmp_path):
    toml = tmp_path / "pipeline.toml"
    toml.write_text('num.network.threads = 5\nnum.io.threads = 6\nqueued.max.requests = 7\n'
                    'listeners = "PLAINTEXT://127.0.0.1:0"\n[topic."orders"]\ntable.retention.days = 3\n')
    env = {"PIPELINE_NUM_IO_THREADS": "16", "PIPELINE_QUEUED_MAX_REQUESTS": "17", "HOME": "/x"}
    args = serve_args("--queued-max-requests", "27", "--linger-ms", "5")
    resolved = resolve(toml, env, flag_values(args))
    c = resolved.server
    assert (c.network_threads, c.io_threads, c.queued_max_requests, c.linger_ms) == (5, 16, 27, 5.0)
    assert (c.listen_host, c.listen_port) == ("127.0.0.1", 0)
    assert c.table.topic("orders").retention_days == 3
    assert resolved.sources["num.network.threads"] == f"file:{toml}"
    assert resolved.sources["num.io.threads"] == "env:PIPELINE_NUM_IO_THREADS"
    assert resolved.sources["queued.max.requests"] == "flag:--queued-max-requests"
    assert resolved.sources["num.partitions"] == "default"
    rows = {r["key"]: r for r in resolved.rows()}
    assert rows["listeners"] == {"key": "listeners", "value": "PLAINTEXT://127.0.0.1:0", "source": f"file:{toml}"}
    assert rows['topic."orders".table.retention.days']["value"] == 3


def test_flags_tests_and_bench_pass_still_work(tmp_path):
    args = serve_args("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path), "--linger-ms", "20",
                      "--table-commit-interval-ms", "100", "--table-compaction-interval-ms", "0",
                      "--spark-connect-port", "0", "--metrics-port", "0", "--mode", "baseline",
                      "--io-threads", "2", "--ack-on", "spark", "--table-compaction-min-files", "3",
                      "--file-delete-delay-ms", "0", "--advertised-listener", "example.test:19092",
                      "--network-threads=2")
    c = resolve(None, {}, flag_values(args)).server
    assert (c.listen_host, c.listen_port, c.data_dir) == ("127.0.0.1", 0, Path(tmp_path))
    assert (c.linger_ms, c.table_commit_interval_ms, c.table_compaction_interval_ms) == (20.0, 100, 0)
    assert (c.spark_connect_port, c.metrics_port, c.mode, c.io_threads, c.ack_on) == (0, 0, Mode.BASELINE, 2, "spark")
    assert (c.table.compaction_min_files, c.table.file_delete_delay_ms) == (3, 0)
    assert (c.advertised_host, c.advertised_port, c.network_threads) == ("example.test", 19092, 2)


def test_log_options_before_and_after_the_command():
    top = build_parser().parse_args(["--log-format", "json", "--log-level", "debug", "serve"])
    resolved = resolve(None, {}, flag_values(top))
    assert resolved.log == LogConfig(level="DEBUG", format="json")
    assert resolved.sources["log.format"] == "flag:--log-format"
    after = serve_args("--log-format", "json")
    assert resolve(None, {"PIPELINE_LOG_FORMAT": "plain"}, flag_values(after)).log.format == "json"
    assert resolve(None, {"PIPELINE_LOG_LEVEL": "warn"}, {}).log.level == "WARNING"


@pytest.mark.parametrize("text, named", [
    ("num.network.thread = 5", "unknown key 'num.network.thread' (did you mean 'num.network.threads'?"),
    ("num.network.threads = 0", "num.network.threads: expected an integer >= 1, got 0"),
    ('num.network.threads = "4"', "num.network.threads: expected an integer >= 1, got '4'"),
    ('listeners = "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092"', "listeners: each listener must have a different port"),
    ('listeners = "INTERNAL://127.0.0.1:9093"', "listeners: no security protocol defined for listener INTERNAL"),
    ("auto.create.topics.enable = 1", "auto.create.topics.enable: expected true or false"),
    ('pipeline.mode = "fast"', "pipeline.mode: expected one of multiqueue, baseline, shared-unmuted"),
    ("table.compaction.min.files = 1", "table.compaction.min.files: expected an integer >= 2"),
    ('log.format = "xml"', "log.format: expected one of plain, json"),
])
def test_a_bad_file_key_or_value_names_the_file_and_the_key(tmp_path, text, named):
    toml = tmp_path / "bad.toml"
    toml.write_text(text + "\n")
    with pytest.raises(ConfigError) as caught:
        resolve(toml, {}, {})
    assert str(caught.value).startswith(f"file:{toml}: ")
    assert named in str(caught.value)


@pytest.mark.parametrize("env, named", [
    ({"PIPELINE_NUM_NETWORK_THREAD": "2"},
     "env:PIPELINE_NUM_NETWORK_THREAD: unknown key 'num.network.thread' (did you mean 'PIPELINE_NUM_NETWORK_THREADS'?"),
    ({"PIPELINE_NUM_NETWORK_THREADS": "two"}, "env:PIPELINE_NUM_NETWORK_THREADS: num.network.threads: expected an integer"),
    ({"PIPELINE_AUTO_CREATE_TOPICS_ENABLE": "yes"}, "env:PIPELINE_AUTO_CREATE_TOPICS_ENABLE: auto.create.topics.enable"),
    ({"PIPELINE_LINGER_MS": "-1"}, "env:PIPELINE_LINGER_MS: linger.ms: expected a number >= 0"),
])
def test_a_bad_environment_variable_names_it_and_the_key(env, named):
    with pytest.raises(ConfigError, match="^" + named.replace("(", r"\(").replace("?", r"\?")):
        resolve(None, env, {})


def test_environment_text_is_converted_per_type():
    c = resolve(None, {"PIPELINE_AUTO_CREATE_TOPICS_ENABLE": "False", "PIPELINE_LISTENERS": "0.0.0.0:19092",
                       "PIPELINE_PIPELINE_DATA_DIR": "/tmp/d", "PIPELINE_LINGER_MS": "2.5",
                       "PIPELINE_MAX_CONNECTIONS_PER_IP": "10", "PIPELINE_PIPELINE_MODE": "baseline"}, {}).server
    assert (c.auto_create_topics, c.listen_host, c.listen_port, c.data_dir) == (False, "0.0.0.0", 19092, Path("/tmp/d"))
    assert (c.linger_ms, c.max_connections_per_ip, c.mode) == (2.5, 10, Mode.BASELINE)


@pytest.mark.parametrize("argv, named", [
    (["--queues", "0"], "flag:--queues: pipeline.queues: expected an integer >= 1, got 0"),
    (["--listen", "127.0.0.1"], "flag:--listen: listeners: expected NAME://HOST:PORT"),
    (["--ack-on", "disk"], "flag:--ack-on: pipeline.ack.on: expected one of wal, spark"),
    (["--spark-connect-port", "70000"], "flag:--spark-connect-port: spark.connect.grpc.binding.port: "
                                        "expected an integer from 0 to 65535"),
])
def test_a_bad_flag_value_names_the_flag_and_the_key(argv, named):
    with pytest.raises(ConfigError) as caught:
        flag_values(serve_args(*argv))
    assert str(caught.value).startswith(named)


def test_spark_master_and_remote_exclude_each_other_whatever_their_sources():
    assert resolve(None, {"PIPELINE_SPARK_REMOTE": "sc://127.0.0.1:15002"}, {}).server.spark_remote == "sc://127.0.0.1:15002"
    with pytest.raises(ConfigError, match=r"spark.master \(flag:--spark-master\) and spark.remote "
                                          r"\(env:PIPELINE_SPARK_REMOTE\) are both set"):
        resolve(None, {"PIPELINE_SPARK_REMOTE": "sc://127.0.0.1:15002"},
                flag_values(serve_args("--spark-master", "local[2]")))


def test_leadership_through_the_database_needs_a_session_that_outlasts_a_heartbeat_and_a_stalled_transaction():
    """broker.heartbeat.interval.ms below broker.session.timeout.ms; with PostgreSQL (pipeline.metadata.url)
    the session above PostgreSQL's end of a stalled transaction (PG_IDLE_IN_TRANSACTION_TIMEOUT_MS) plus a
    heartbeat interval: a broker waiting that long for a stalled one's rows must not lose its lease."""
    from pipeline.metadata.database import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS

    url = "postgresql://pipeline@db.example:5432/pipeline"
    database = ("--cluster-leadership", "database", "--broker-heartbeat-interval-ms", "1000")
    with pytest.raises(ConfigError, match=r"broker.heartbeat.interval.ms \(flag:--broker-heartbeat-interval-ms\) "
                                          r"must be below broker.session.timeout.ms"):
        resolve(None, {}, flag_values(serve_args(*database, "--broker-session-timeout-ms", "1000")))
    stall = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS + 1000
    with pytest.raises(ConfigError, match=rf"broker.session.timeout.ms \(flag:--broker-session-timeout-ms\) "
                                          rf"must be above {stall} ms with pipeline.metadata.url"):
        resolve(None, {}, flag_values(serve_args(*database, "--broker-session-timeout-ms", str(stall),
                                                 "--metadata-url", url)))
    ok = resolve(None, {}, flag_values(serve_args(*database, "--broker-session-timeout-ms", str(stall + 1),
                                                  "--metadata-url", url)))
    assert ok.server.broker_session_timeout_ms == stall + 1
    # SQLite (no pipeline.metadata.url): no such timeout, only the heartbeat's rule
    assert resolve(None, {}, flag_values(serve_args(*database, "--broker-session-timeout-ms", str(stall)))
                   ).server.broker_session_timeout_ms == stall


def test_load_config_keeps_its_shape_for_the_table_keys(tmp_path):
    toml = tmp_path / "t.toml"
    toml.write_text('table.commit.interval.ms = 2000\nfile.delete.delay.ms = 0\nnum.partitions = 3\n')
    file = load_config(toml)
    assert file.server == {"table_commit_interval_ms": 2000, "num_partitions": 3}
    assert file.table.file_delete_delay_ms == 0


def test_help_shows_each_key_its_variable_and_the_dataclass_default():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    text = parser.format_help().replace("\n", " ")
    text = " ".join(text.split())
    d = ServerConfig()
    assert f"[num.network.threads, env PIPELINE_NUM_NETWORK_THREADS; default {d.network_threads}]" in text
    assert f"default {d.table.target_file_bytes}]" in text
    assert "[max.connections.per.ip, env PIPELINE_MAX_CONNECTIONS_PER_IP; default = max.connections]" in text


def test_metadata_url_takes_postgresql_urls_only_and_hides_their_password():
    key = KEYS["pipeline.metadata.url"]
    c = resolve(None, {}, flag_values(serve_args("--metadata-url", "postgresql://broker:pw@db.internal:5432/meta")))
    assert c.server.metadata_url == "postgresql://broker:pw@db.internal:5432/meta"
    assert key.show(c.server.metadata_url) == "postgresql://broker:***@db.internal:5432/meta"
    assert resolve(None, {}, {}).server.metadata_url is None  # SQLite under DATA_DIR/_pipeline
    for bad in ("sqlite:///x.db", "db.internal:5432", " "):
        with pytest.raises(ValueError):
            key.parse(bad, True)


def test_reference_markdown_has_one_row_per_key_with_its_default():
    """docs/configuration.md's generator (tests/docs checks the file equals it): a row per key
    under its --help group, the dataclass default with its unit, cells that stay cells."""
    from pipeline.config import reference_markdown

    text = reference_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(KEYS)
    assert "| `queued.max.request.bytes` | `--queued-max-request-bytes BYTES` | `104857600` (100 MiB) |" in text
    assert "| `log.retention.ms` | `--log-retention-ms MS` | `3600000` (1 h) |" in text
    assert "| `max.connections.per.ip` | `--max-connections-per-ip N` | = max.connections |" in text
    assert "`--mode multiqueue\\|baseline\\|shared-unmuted`" in text  # a pipe inside a cell is escaped
    assert "User:\\<subject DN>" in text  # not an HTML tag
    assert all(len(re.split(r"(?<!\\)\|", line)) == 6 for line in rows)  # 4 cells, no more
    assert "\n## Request path\n" in text


def test_the_table_side_looks_writer_schemas_up_where_the_registry_is(tmp_path):
    """schema.registry.url (an external registry) wins; else pipeline's own registry's store when
    schema.registry.listeners serves one (its SQLite file, or the metadata database); else none."""
    from dataclasses import replace

    from pipeline.cli import _table_config
    from pipeline.table.table_config import TableConfig

    base = ServerConfig(data_dir=tmp_path)
    assert _table_config(base).schema_registry is None
    served = replace(base, schema_registry_listener="http://127.0.0.1:0")
    assert _table_config(served).schema_registry == str(tmp_path / "_pipeline" / "registry.db")
    on_pg = replace(served, metadata_url="postgresql://u@h:5432/db")
    assert _table_config(on_pg).schema_registry == "postgresql://u@h:5432/db"
    external = replace(served, table=TableConfig(schema_registry="http://registry:8081"))
    assert _table_config(external).schema_registry == "http://registry:8081"


HEAVY_LIBRARIES = ("pyspark", "pyarrow", "numpy", "kafka", "kio", "trio", "scramp")
"""What the server needs and a command that only reads or prints configuration does not."""


@pytest.mark.parametrize("argv", [["--help"], ["config", "show"], ["users", "--help"]])
def test_commands_that_read_the_configuration_load_no_spark_arrow_protocol_or_trio(argv, tmp_path):
    """``pipeline --help`` and ``pipeline config show`` answer in ~0.25 s, not the ~1.2 s it took
    to load Spark's and Arrow's Python packages, kafka-python, kio and trio for the defaults the
    configuration reads: the modules it reads them from load none of those (a fresh interpreter,
    as the console script is)."""
    import json
    import subprocess
    import sys

    code = ("import contextlib, io, json, sys\n"
            "from pipeline.cli import main\n"
            f"sys.argv = ['pipeline', *{argv!r}]\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    main()\n"
            f"print(json.dumps(sorted(m for m in {HEAVY_LIBRARIES!r} if m in sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
