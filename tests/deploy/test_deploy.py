"""deploy/, checked without a container engine: the same command lines, run here.

No image is built and no container runs on this machine. What can be
checked is checked on the files as they are:

* every command line in ``deploy/`` (the systemd unit's ExecStart, the
  Containerfile's ENTRYPOINT + CMD and HEALTHCHECK, each compose service's
  entrypoint + command and healthcheck, the StatefulSet's args and probes)
  is accepted by ``pipeline``'s own argument parser or names classes that
  Spark's jars hold, and the files agree with each other (ports, the data
  directory, volumes, the Connect URL, the catalog settings, stop timeouts);
* the ConfigMap's TOML loads with ``pipeline.config.load_config``;
* the slow tests run those command lines as local processes, with only the
  host-specific parts replaced (``Localizer``: 0.0.0.0 and the compose
  service names by 127.0.0.1, fixed ports by free ones, /var/lib/pipeline and
  /etc/pipeline by temporary directories, /opt/spark by pyspark's Spark), and
  run the health checks and probes against them, then stop them as the
  platform would (SIGTERM; under tini where the image uses it).
* the cluster examples (compose.cluster.yaml, k8s/cluster: three brokers with
  leadership through PostgreSQL) are checked the same way, and compose's three
  broker commands run as one cluster against the session's PostgreSQL and
  Spark Connect servers standing in for its ``postgres`` and ``spark-connect``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.e2e.server_process import free_port
from tests.missing import missing
import yaml

from pipeline.cli import STOP_TIMEOUT_S, build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
DATA_DIR = Path("/var/lib/pipeline")
DRAIN_S = 30
"""Server.serve waits at most 30 s for connections to write what they owe (docs/architecture.md, "Shutdown")."""
SHUTDOWN_BUDGET_S = DRAIN_S + STOP_TIMEOUT_S
"""Longest ordered shutdown: the drain, then Spark's stop bounded by ``STOP_TIMEOUT_S``."""
LISTENING = re.compile(r"listening on (\S+):(\d+)")
PROBE_URL = re.compile(r"urlopen\('(http://[^']+)'")
TCP_PROBE = re.compile(r"create_connection\(\('([^']+)', (\d+)\)")


# ---------------------------------------------------------------- the files


def systemd_unit() -> dict[str, dict[str, str]]:
    """deploy/pipeline.service as {section: {key: value}} (the last value of a repeated key)."""
    sections: dict[str, dict[str, str]] = {}
    current = None
    for line in (DEPLOY / "pipeline.service").read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current[key.strip()] = value.strip()
    return sections


@dataclass
class Containerfile:
    instructions: list[tuple[str, str]]

    def all(self, name: str) -> list[str]:
        return [rest for instruction, rest in self.instructions if instruction == name]

    def last(self, name: str) -> str:
        return self.all(name)[-1]

    def exec_form(self, name: str) -> list[str]:
        return json.loads(self.last(name))

    def healthcheck(self) -> tuple[dict[str, str], list[str]]:
        options, _, cmd = self.last("HEALTHCHECK").partition(" CMD ")
        opts = dict(o.lstrip("-").split("=", 1) for o in options.split())
        return opts, json.loads(cmd)


def containerfile() -> Containerfile:
    """deploy/Containerfile's instructions, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in (DEPLOY / "Containerfile").read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # a comment, also between continuation lines
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip():
            instruction, _, rest = line.strip().partition(" ")
            instructions.append((instruction.upper(), " ".join(rest.split())))
    return Containerfile(instructions)


_INTERPOLATION = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    """Compose's ``${VAR}`` / ``${VAR:-default}`` interpolation, recursively."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def compose(env: dict[str, str] | None = None, file: str = "compose.yaml") -> dict:
    """deploy/``file`` (compose.yaml, compose.cluster.yaml) as compose reads it (YAML merge keys
    resolved; variables from ``env``, else defaults)."""
    return interpolate(yaml.safe_load((DEPLOY / file).read_text()), env or {})


def compose_argv(service: dict) -> list[str]:
    """A compose service's argv: its entrypoint (else the image's) + its command (else the image's CMD)."""
    image = containerfile()
    entrypoint = service.get("entrypoint", image.exec_form("ENTRYPOINT"))
    command = service.get("command", image.exec_form("CMD") if "entrypoint" not in service else [])
    return [*entrypoint, *command]


def k8s_documents(directory: Path = DEPLOY / "k8s") -> dict[tuple[str, str], dict]:
    """Every resource of a kustomization directory (deploy/k8s, deploy/k8s/cluster), by (kind, name);
    checks its kustomization.yaml lists every file of the directory (not of its subdirectories)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files = sorted(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    docs = {}
    for name in files:
        for doc in yaml.safe_load_all((directory / name).read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def k8s_argv(container: dict, values: dict[str, str]) -> list[str]:
    """A container's argv as the kubelet runs it: ``command`` (else the image's ENTRYPOINT) +
    ``args`` (else the image's CMD), with ``$(VAR)`` expanded from its env, whose
    fieldRefs take ``values`` (fieldPath -> value); a secretKeyRef's value is ``<secret NAME.KEY>``
    (no secret reaches a command line here). Every referenced variable must exist
    (Kubernetes leaves an unknown ``$(VAR)`` as it is)."""
    image = containerfile()
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"<secret {ref['name']}.{ref['key']}>"
        else:
            env[var["name"]] = values[var["valueFrom"]["fieldRef"]["fieldPath"]]
    command = container.get("command", image.exec_form("ENTRYPOINT"))
    args = container.get("args", image.exec_form("CMD") if "command" not in container else [])

    def expand(text: str) -> str:
        for ref in re.findall(r"\$\((\w+)\)", text):
            assert ref in env, f"$({ref}) in {text!r} is not in the container's env"
        return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], text)

    return [expand(a) for a in [*command, *args]]


def serve_config(argv: list[str], environ: dict[str, str] | None = None):
    """``argv`` (``... pipeline serve ...``) as ``pipeline serve`` reads it: its own parser
    (argparse exits on an unknown flag), then defaults < ``--config`` file < ``environ``'s
    ``PIPELINE_*`` < flags (``pipeline.config.resolve``, which raises ``ConfigError`` on a
    bad value). Returns the ``ServerConfig``."""
    from pipeline.cli import flag_values
    from pipeline.config import resolve

    i = next(i for i, a in enumerate(argv) if a == "pipeline" or a.endswith("/pipeline"))
    args = build_parser().parse_args(argv[i + 1:])
    assert args.command == "serve"
    return resolve(args.config, environ or {}, flag_values(args)).server


def probe_url(cmd: list[str]) -> str:
    """The URL a ``python -c "...urlopen('URL'...)"`` health check asks for."""
    assert cmd[:2] == ["python", "-c"], cmd
    m = PROBE_URL.search(cmd[2])
    assert m, cmd
    return m.group(1)


def tcp_probe(cmd: list[str]) -> tuple[str, int]:
    assert cmd[:2] == ["python", "-c"], cmd
    m = TCP_PROBE.search(cmd[2])
    assert m, cmd
    return m.group(1), int(m.group(2))


def spark_home() -> Path:
    from pipeline.persist.spark_cluster import spark_home as home

    return home()


def spark_submit_confs(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def seconds(duration: str) -> float:
    """A compose duration (``120s``, ``2m``, ``1m30s``)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


# ------------------------------------------------------------ static checks


def test_systemd_exec_start_is_todays_cli():
    unit = systemd_unit()
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == f"{service['WorkingDirectory']}/.venv/bin/pipeline"  # the install the unit's comment describes
    config = serve_config(argv)
    assert config.data_dir == Path(service["ReadWritePaths"])
    assert config.metrics_port is not None
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to the server only: Spark's JVM lives through the flush
    assert float(service["TimeoutStopSec"]) >= SHUTDOWN_BUDGET_S


def test_containerfile_is_multi_stage_non_root_and_runs_todays_cli():
    image = containerfile()
    stages = image.all("FROM")
    assert len(stages) >= 2 and stages[-1].endswith(" AS runtime")
    assert any("pip wheel" in run for run in image.all("RUN"))
    runtime = max(i for i, (instruction, _) in enumerate(image.instructions) if instruction == "FROM")
    runtime_runs = " ".join(rest for instruction, rest in image.instructions[runtime:] if instruction == "RUN")
    assert "openjdk-17-jre-headless" in runtime_runs and "/wheels/pipeline-" in runtime_runs
    user = image.last("USER").split(":")[0]
    assert user not in ("root", "0")

    argv = [*image.exec_form("ENTRYPOINT"), *image.exec_form("CMD")]
    assert argv[:3] == ["/usr/bin/tini", "--", "pipeline"]
    config = serve_config(argv)
    assert config.listen_host == "0.0.0.0"
    assert config.advertised_host is not None  # 0.0.0.0 must not reach clients' Metadata
    assert image.exec_form("VOLUME") == [str(config.data_dir)] == [str(DATA_DIR)]
    exposed = {int(p) for p in image.last("EXPOSE").split()}
    assert {config.listen_port, config.metrics_port, config.spark_connect_port, 10000} <= exposed
    assert image.last("STOPSIGNAL") == "SIGTERM"

    options, check = image.healthcheck()
    assert probe_url(check) == f"http://127.0.0.1:{config.metrics_port}/healthz"
    # the HEALTHCHECK's interval and retries leave the start-up time to the start period
    assert seconds(options["start-period"]) >= 30

    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(image.all("ENV"))))
    assert env["SPARK_HOME"] == "/opt/spark"


def image_check_module():
    """deploy/image_check.py (the image check .ci/run runs, a script outside the package) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_check", DEPLOY / "image_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_image_check_finds_in_the_containerfile_what_it_runs(tmp_path):
    """What deploy/image_check.py reads from the image is in the Containerfile: the build stage it keeps,
    the --metrics-port of /readyz and the Kafka port of --listen, a user in the image's passwd, and a stop
    bound as long as the longest ordered shutdown. (The check itself builds and runs the image in CI.)"""
    check = image_check_module()
    image = containerfile()
    assert any(rest.endswith(f" AS {check.BUILD_STAGE}") for rest in image.all("FROM"))
    assert image.last("ARG") == "PYTHON_IMAGE=python:3.11-slim-bookworm" and check.SUITE == "bookworm"
    argv = [*image.exec_form("ENTRYPOINT"), *image.exec_form("CMD")]
    config = serve_config(argv)
    assert int(check.option(argv, "--metrics-port")) == config.metrics_port
    assert check.option(argv, "--listen").rsplit(":", 1)[-1] == str(config.listen_port)
    assert image.last("STOPSIGNAL") == "SIGTERM" and check.STOP_S >= SHUTDOWN_BUDGET_S

    # USER uid:gid as the image's passwd and group will have them (the useradd/groupadd of the RUN above)
    run = " ".join(image.all("RUN"))
    uid = re.search(r"useradd .*--uid (\d+)", run).group(1)
    gid = re.search(r"groupadd .*--gid (\d+)", run).group(1)
    home = re.search(r"--home-dir (\S+)", run).group(1)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(f"root:x:0:0:root:/root:/bin/bash\npipeline:x:{uid}:{gid}::{home}:/x\n")
    (tmp_path / "etc/group").write_text(f"root:x:0:\npipeline:x:{gid}:\n")
    assert check.resolve_user(tmp_path, image.last("USER")) == (int(uid), int(gid), home)
    assert check.resolve_user(tmp_path, "pipeline") == (int(uid), int(gid), home)
    with pytest.raises(check.CheckFailed, match="no such user"):
        check.resolve_user(tmp_path, "nobody-here")


def test_compose_services_run_todays_cli_and_agree_with_each_other():
    services = compose()["services"]
    assert set(services) == {"spark-master", "spark-worker", "spark-connect", "pipeline", "metrics-proxy"}
    image = containerfile()
    for name, service in services.items():
        # one image, built from the Containerfile
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Containerfile"}, name
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        # the image's HEALTHCHECK is the front end's: every service needs its own
        assert service["healthcheck"]["test"][0] == "CMD", name

    front = services["pipeline"]
    config = serve_config(compose_argv(front), front.get("environment"))
    assert config.listen_host == "0.0.0.0"
    # the default, for clients on the host
    assert (config.advertised_host, config.advertised_port) == ("localhost", config.listen_port)
    assert f"{config.listen_port}:{config.listen_port}" in front["ports"]
    assert probe_url(front["healthcheck"]["test"][1:]) == f"http://127.0.0.1:{config.metrics_port}/readyz"
    assert seconds(front["stop_grace_period"]) >= SHUTDOWN_BUDGET_S
    # the listener can be changed for clients on the compose network
    other = compose({"PIPELINE_ADVERTISED_LISTENERS": "pipeline:9092"})["services"]["pipeline"]
    other_config = serve_config(compose_argv(other), other["environment"])
    assert (other_config.advertised_host, other_config.advertised_port) == ("pipeline", 9092)

    # the data volume at the front end's --data-dir wherever table files are touched
    for name in ("pipeline", "spark-connect", "spark-worker"):
        assert f"pipeline-data:{config.data_dir}" in services[name]["volumes"], name
    assert "pipeline-data" in compose()["volumes"]

    master = compose_argv(services["spark-master"])
    assert master[:2] == ["/usr/bin/tini", "--"] and master[2] == "/opt/spark/bin/spark-class"
    master_url = f"spark://{flag(master, '--host')}:{flag(master, '--port')}"
    assert flag(master, "--host") == "spark-master"
    assert tcp_probe(services["spark-master"]["healthcheck"]["test"][1:]) == ("spark-master", int(flag(master, "--port")))

    worker = compose_argv(services["spark-worker"])
    assert worker[2] == "/opt/spark/bin/spark-class" and worker[4] == master_url
    assert tcp_probe(services["spark-worker"]["healthcheck"]["test"][1:]) == ("spark-worker", int(flag(worker, "--port")))

    connect = compose_argv(services["spark-connect"])
    assert connect[2] == "/opt/spark/bin/spark-submit"
    assert flag(connect, "--master") == master_url
    confs = spark_submit_confs(connect)
    connect_port = int(confs["spark.connect.grpc.binding.port"])
    assert config.spark_remote == f"sc://spark-connect:{connect_port}"
    assert confs["spark.driver.host"] == "spark-connect"
    assert tcp_probe(services["spark-connect"]["healthcheck"]["test"][1:]) == ("spark-connect", connect_port)
    assert f"{connect_port}:{connect_port}" in services["spark-connect"]["ports"]
    # the Connect server's catalog is exactly the one pipeline itself would use on that data directory
    from pipeline.table.catalog import catalog_conf

    for key, value in catalog_conf(config.data_dir).items():
        assert confs.get(key) == value, key

    # start order: each waits for what it needs to be healthy
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert {k: v["condition"] for k, v in services["spark-connect"]["depends_on"].items()} == {
        "spark-master": "service_healthy", "spark-worker": "service_healthy"}
    assert front["depends_on"]["spark-connect"]["condition"] == "service_healthy"

    proxy = services["metrics-proxy"]
    assert proxy["network_mode"] == "service:pipeline"
    socat = compose_argv(proxy)
    assert socat[:3] == ["/usr/bin/tini", "--", "socat"]
    listen_port = int(re.match(r"TCP-LISTEN:(\d+),", socat[3]).group(1))
    assert socat[4] == f"TCP:127.0.0.1:{config.metrics_port}"
    assert f"{listen_port}:{listen_port}" in front["ports"]  # ports belong to the namespace's owner
    assert image.exec_form("ENTRYPOINT")[0] == "/usr/bin/tini"


def test_compose_spark_commands_name_classes_spark_ships():
    """The classes the compose services start are in pyspark's own jars (the image's /opt/spark)."""
    services = compose()["services"]
    wanted = {
        compose_argv(services["spark-master"])[3],
        compose_argv(services["spark-worker"])[3],
        flag(compose_argv(services["spark-connect"]), "--class"),
    }
    paths = {name.replace(".", "/") + ".class": name for name in wanted}
    found = set()
    for jar in (spark_home() / "jars").glob("spark-*.jar"):
        with zipfile.ZipFile(jar) as z:
            found |= {paths[n] for n in z.namelist() if n in paths}
    assert found == wanted
    for service in ("spark-master", "spark-worker", "spark-connect"):
        script = compose_argv(services[service])[2]
        assert (spark_home() / Path(script).relative_to("/opt/spark")).is_file()


def test_k8s_manifests_fit_together_and_run_todays_cli(tmp_path):
    docs = k8s_documents()
    sts = docs[("StatefulSet", "pipeline")]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"] == labels
    assert spec["replicas"] == 1

    headless = docs[("Service", spec["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    main = next(c for c in pod["containers"] if c["name"] == "pipeline")
    proxy = next(c for c in pod["containers"] if c["name"] == "metrics-proxy")
    named_ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    for (kind, _name), doc in docs.items():
        if kind == "Service":
            assert doc["spec"]["selector"] == labels
            for port in doc["spec"]["ports"]:
                assert port["targetPort"] in named_ports

    argv = k8s_argv(main, {"metadata.name": "pipeline-0", "metadata.namespace": "default"})
    assert argv[:3] == ["/usr/bin/tini", "--", "pipeline"]
    config_file = Path(argv[argv.index("--config") + 1])
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    config_volume = next(v for v in pod["volumes"] if v["name"] == "config")
    config_map = docs[("ConfigMap", config_volume["configMap"]["name"])]
    assert config_file.parent == Path(mounts["config"]) and config_file.name in config_map["data"]
    # the ConfigMap's file, where the pod would see it
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / config_file.name).write_text(config_map["data"][config_file.name])
    config = serve_config(Localizer({mounts["config"]: str(etc)})(argv))

    assert (config.listen_host, config.listen_port) == ("0.0.0.0", named_ports["kafka"])
    # advertised: the pod's name under the headless Service, which resolves to this pod
    assert (config.advertised_host, config.advertised_port) == (
        f"pipeline-0.{headless['metadata']['name']}.default.svc", named_ports["kafka"])
    claim = spec["volumeClaimTemplates"][0]
    assert mounts[claim["metadata"]["name"]] == str(config.data_dir) == str(DATA_DIR)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]

    # the ConfigMap's TOML is a valid --config file, and its values are the defaults, as it says
    from dataclasses import asdict

    from pipeline.config import load_config
    from pipeline.config import ServerConfig
    from pipeline.table.table_config import TableConfig

    loaded = load_config(etc / config_file.name)
    defaults = ServerConfig()
    for name, value in loaded.server.items():
        assert value == getattr(defaults, name), name
    table = asdict(loaded.table)
    for name, value in asdict(TableConfig()).items():
        assert table[name] == value, name
    assert loaded.sources  # it did set keys
    assert asdict(config.table) == table

    metrics = config.metrics_port
    assert probe_url(main["readinessProbe"]["exec"]["command"]) == f"http://127.0.0.1:{metrics}/readyz"
    assert probe_url(main["livenessProbe"]["exec"]["command"]) == f"http://127.0.0.1:{metrics}/healthz"
    assert probe_url(main["startupProbe"]["exec"]["command"]) == f"http://127.0.0.1:{metrics}/healthz"
    assert pod["terminationGracePeriodSeconds"] >= SHUTDOWN_BUDGET_S
    assert main["resources"]["requests"]["memory"] and main["resources"]["limits"]["memory"]
    assert str(pod["securityContext"]["runAsUser"]) == containerfile().last("USER").split(":")[0]

    socat = k8s_argv(proxy, {})
    assert socat[:3] == ["/usr/bin/tini", "--", "socat"]
    assert socat[3].startswith(f"TCP-LISTEN:{named_ports['metrics']},") and socat[4] == f"TCP:127.0.0.1:{metrics}"
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(named_ports["metrics"])


def test_the_same_probe_command_everywhere():
    """The Containerfile, compose and k8s probe the endpoint with one command shape (what the slow tests run)."""
    _options, healthcheck = containerfile().healthcheck()
    pod = k8s_documents()[("StatefulSet", "pipeline")]["spec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "pipeline")
    front = compose()["services"]["pipeline"]["healthcheck"]["test"][1:]
    liveness = main["livenessProbe"]["exec"]["command"]
    assert healthcheck == liveness
    assert front == liveness[:2] + [liveness[2].replace("/healthz", "/readyz")]


# ------------------------------------------- the cluster examples (issue 24)


def broker_services(services: dict) -> dict[str, dict]:
    """compose.cluster.yaml's broker services, by name (broker-0, broker-1, ...)."""
    return {name: service for name, service in services.items() if name.startswith("broker-")}


def named_ports(pod: dict) -> dict[str, int]:
    """A pod spec's container ports by name."""
    return {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}


def one(values) -> object:
    """The one value every element of ``values`` has (the brokers of one cluster share it)."""
    values = list(values)
    assert values and all(v == values[0] for v in values[1:]), values
    return values[0]


def assert_pg_isready(cmd: list[str], port: int, user: str, database: str) -> None:
    """A PostgreSQL health check: ``pg_isready`` over TCP on the container's loopback, as that user and database."""
    assert cmd[0] == "pg_isready", cmd
    assert (flag(cmd, "--host"), int(flag(cmd, "--port")), flag(cmd, "--username"), flag(cmd, "--dbname")) == (
        "127.0.0.1", port, user, database)


def test_compose_cluster_brokers_run_todays_cli_as_one_cluster():
    """compose.cluster.yaml: PostgreSQL (the official image), one Connect server and three brokers whose
    commands ``pipeline serve`` accepts: distinct node ids, each listening on every interface and
    advertising its own service name, one metadata URL naming the postgres service (password through
    PGPASSWORD, the same as the server's), one data volume, one Connect URL, ``--ack-on spark`` with
    leadership through the database."""
    services = compose(file="compose.cluster.yaml")["services"]
    brokers = broker_services(services)
    assert set(services) == {"postgres", "spark-connect", *brokers} and len(brokers) == 3
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
        if name != "postgres":
            assert service["build"] == compose()["services"]["pipeline"]["build"], name

    configs = {name: serve_config(compose_argv(s), s["environment"]) for name, s in brokers.items()}
    assert sorted(c.node_id for c in configs.values()) == list(range(len(brokers)))
    for name, config in configs.items():
        service = brokers[name]
        assert name == f"broker-{config.node_id}"
        assert config.listen_host == "0.0.0.0"
        assert (config.advertised_host, config.advertised_port) == (name, config.listen_port)
        assert "ports" not in service  # clients reach the brokers by the service names, on the compose network
        assert probe_url(service["healthcheck"]["test"][1:]) == f"http://127.0.0.1:{config.metrics_port}/readyz"
        assert seconds(service["stop_grace_period"]) >= SHUTDOWN_BUDGET_S
        assert service["restart"] == "on-failure"  # a fenced broker ends (status 3); a new incarnation rejoins
        assert {k: v["condition"] for k, v in service["depends_on"].items()} == {
            "postgres": "service_healthy", "spark-connect": "service_healthy"}
    assert one(c.ack_on for c in configs.values()) == "spark"  # what leadership through the database needs
    assert one(c.cluster_leadership for c in configs.values()) == "database"
    assert one(c.cluster_brokers for c in configs.values()) is None  # membership is in the database
    data_dir = one(c.data_dir for c in configs.values())
    assert data_dir == DATA_DIR

    # the metadata URL names the postgres service, its user and database; the password comes from
    # the same variable on both sides, and the URL holds none
    from urllib.parse import urlsplit

    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:")  # the official image
    url = urlsplit(one(c.metadata_url for c in configs.values()))
    pg_env = postgres["environment"]
    assert (url.scheme, url.hostname, url.port, url.username, url.password, url.path) == (
        "postgresql", "postgres", 5432, pg_env["POSTGRES_USER"], None, f"/{pg_env['POSTGRES_DB']}")
    assert_pg_isready(postgres["healthcheck"]["test"][1:], url.port, pg_env["POSTGRES_USER"], pg_env["POSTGRES_DB"])
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    for secret in (None, "s3cret"):
        env = {} if secret is None else {"POSTGRES_PASSWORD": secret}
        chosen = compose(env, file="compose.cluster.yaml")["services"]
        password = chosen["postgres"]["environment"]["POSTGRES_PASSWORD"]
        assert password == (secret or "pipeline")
        assert {s["environment"]["PGPASSWORD"] for s in broker_services(chosen).values()} == {password}

    # one Connect server, the one compose.yaml runs, on Spark local[*], with the data directory's catalog
    connect = compose_argv(services["spark-connect"])
    assert connect[:3] == compose_argv(compose()["services"]["spark-connect"])[:3]
    assert flag(connect, "--class") == flag(compose_argv(compose()["services"]["spark-connect"]), "--class")
    assert flag(connect, "--master") == "local[*]"
    confs = spark_submit_confs(connect)
    connect_port = int(confs["spark.connect.grpc.binding.port"])
    assert confs["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert one(c.spark_remote for c in configs.values()) == f"sc://spark-connect:{connect_port}"
    assert tcp_probe(services["spark-connect"]["healthcheck"]["test"][1:]) == ("spark-connect", connect_port)
    from pipeline.table.catalog import catalog_conf

    for key, value in catalog_conf(data_dir).items():
        assert confs.get(key) == value, key

    # one data volume, at the brokers' --data-dir, wherever the table or a broker's state is touched
    for name in ("spark-connect", *brokers):
        assert f"pipeline-data:{data_dir}" in services[name]["volumes"], name
    assert set(compose(file="compose.cluster.yaml")["volumes"]) == {"pipeline-data", "postgres-data"}


def test_k8s_cluster_manifests_fit_together_and_run_todays_cli():
    """deploy/k8s/cluster: the brokers' StatefulSet runs ``pipeline serve`` with the pod's ordinal as node
    id and its headless name as advertised listener; every Service selects one workload and targets its
    named ports; the metadata URL and the Connect URL name those Services; PostgreSQL's password is one
    Secret key on both sides; the brokers and the Connect server mount one ReadWriteMany claim at the
    data directory; the probes are the single broker's."""
    docs = k8s_documents(DEPLOY / "k8s" / "cluster")
    workloads = {name: doc for (kind, name), doc in docs.items() if kind in ("StatefulSet", "Deployment")}
    assert set(workloads) == {"pipeline-broker", "pipeline-postgres", "pipeline-spark-connect"}
    for name, workload in workloads.items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    for (kind, name), service in docs.items():
        if kind != "Service":
            continue
        selected = [w for w in workloads.values()
                    if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, name
        ports = named_ports(selected[0]["spec"]["template"]["spec"])
        for port in service["spec"]["ports"]:
            assert ports.get(port["targetPort"]) == port["port"], (name, port)

    brokers = workloads["pipeline-broker"]
    spec = brokers["spec"]
    pod = spec["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "pipeline")
    ports = named_ports(pod)
    headless = docs[("Service", spec["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    assert spec["replicas"] == 3
    configs = []
    for ordinal in range(spec["replicas"]):
        fields = {"metadata.name": f"pipeline-broker-{ordinal}", "metadata.namespace": "default",
                  "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal)}
        argv = k8s_argv(main, fields)
        assert argv[:3] == ["/usr/bin/tini", "--", "pipeline"]
        config = serve_config(argv)
        assert config.node_id == ordinal
        assert (config.listen_host, config.listen_port) == ("0.0.0.0", ports["kafka"])
        assert (config.advertised_host, config.advertised_port) == (
            f"pipeline-broker-{ordinal}.{headless['metadata']['name']}.default.svc", ports["kafka"])
        configs.append(config)
    assert one(c.ack_on for c in configs) == "spark"
    assert one(c.cluster_leadership for c in configs) == "database"
    data_dir = one(c.data_dir for c in configs)
    assert data_dir == DATA_DIR

    # PostgreSQL: the URL names its Service, user and database; one Secret key is its password and the brokers' PGPASSWORD
    from urllib.parse import urlsplit

    postgres_pod = workloads["pipeline-postgres"]["spec"]["template"]["spec"]
    postgres = postgres_pod["containers"][0]
    assert postgres["image"].startswith("postgres:")
    pg_env = {e["name"]: e for e in postgres["env"]}
    url = urlsplit(one(c.metadata_url for c in configs))
    service = docs[("Service", url.hostname)]
    assert url.port == service["spec"]["ports"][0]["port"] == named_ports(postgres_pod)["postgres"]
    assert (url.scheme, url.username, url.password, url.path) == (
        "postgresql", pg_env["POSTGRES_USER"]["value"], None, f"/{pg_env['POSTGRES_DB']['value']}")
    broker_env = {e["name"]: e for e in main["env"]}
    secret_ref = broker_env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
    assert pg_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == secret_ref
    assert secret_ref["key"] in docs[("Secret", secret_ref["name"])]["stringData"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert_pg_isready(postgres[probe]["exec"]["command"], url.port, pg_env["POSTGRES_USER"]["value"],
                          pg_env["POSTGRES_DB"]["value"])
    pg_mount = next(m["mountPath"] for m in postgres["volumeMounts"])
    assert Path(pg_env["PGDATA"]["value"]).parent == Path(pg_mount)  # a subdirectory: lost+found
    assert workloads["pipeline-postgres"]["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]

    # the Connect server: compose.yaml's class, local[*], bound where its Service and the brokers' URL point
    connect_pod = workloads["pipeline-spark-connect"]["spec"]["template"]["spec"]
    connect_container = connect_pod["containers"][0]
    connect = k8s_argv(connect_container, {})
    assert connect[:3] == compose_argv(compose()["services"]["spark-connect"])[:3]
    assert flag(connect, "--class") == flag(compose_argv(compose()["services"]["spark-connect"]), "--class")
    assert flag(connect, "--master") == "local[*]"
    confs = spark_submit_confs(connect)
    assert confs["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert int(confs["spark.connect.grpc.binding.port"]) == named_ports(connect_pod)["connect"]
    remote = urlsplit(one(c.spark_remote for c in configs))
    assert remote.scheme == "sc" and remote.port == docs[("Service", remote.hostname)]["spec"]["ports"][0]["port"]
    assert docs[("Service", remote.hostname)]["spec"]["selector"].items() <= \
        workloads["pipeline-spark-connect"]["spec"]["template"]["metadata"]["labels"].items()
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert connect_container[probe]["tcpSocket"]["port"] == "connect"
    from pipeline.table.catalog import catalog_conf

    for key, value in catalog_conf(data_dir).items():
        assert confs.get(key) == value, key
    assert workloads["pipeline-spark-connect"]["spec"]["strategy"]["type"] == "Recreate"  # one Derby holder

    # one ReadWriteMany claim, at the data directory, in the brokers and the Connect server
    claim = one(next(v["persistentVolumeClaim"]["claimName"] for v in p["volumes"] if v["name"] == "data")
                for p in (pod, connect_pod))
    assert docs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"]
    for container in (main, connect_container):
        assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["data"] == str(data_dir)

    # probes, shutdown and user as the single broker's StatefulSet
    single = k8s_documents()[("StatefulSet", "pipeline")]["spec"]["template"]["spec"]
    single_main = next(c for c in single["containers"] if c["name"] == "pipeline")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert main[probe] == single_main[probe], probe
    assert probe_url(main["readinessProbe"]["exec"]["command"]) == f"http://127.0.0.1:{configs[0].metrics_port}/readyz"
    assert pod["terminationGracePeriodSeconds"] >= SHUTDOWN_BUDGET_S
    user = containerfile().last("USER").split(":")[0]
    assert str(pod["securityContext"]["runAsUser"]) == str(connect_pod["securityContext"]["runAsUser"]) == user

    # the image kustomize sets is the one every pipeline container names
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "cluster" / "kustomization.yaml").read_text())
    names = {i["name"] for i in kustomization["images"]}
    assert {c["image"].split(":")[0] for c in (main, connect_container)} <= names


# ------------------------------------------------- running the command lines




class Localizer:
    """Replaces the host-specific parts of deploy/ command lines by local ones.

    Each key is replaced by its value in one pass (a replacement is never
    rescanned): paths (keys starting with "/") wherever they occur, other keys
    (host names, addresses, ports) only as whole tokens. ``assert_all_used``
    fails if a key never matched, so a rule that stopped applying after an
    edit of deploy/ cannot leave a container-only value in a local run.
    """

    def __init__(self, rules: dict[str, str]) -> None:
        keys = sorted(rules, key=lambda k: (not k.startswith("/"), -len(k)))
        self.values = [rules[k] for k in keys]
        self.keys = keys
        alternatives = [re.escape(k) if k.startswith("/") else r"(?<![\w.-])" + re.escape(k) + r"(?![\w-])"
                        for k in keys]
        self.pattern = re.compile("|".join(f"(?P<r{i}>{a})" for i, a in enumerate(alternatives)))
        self.hits = dict.fromkeys(keys, 0)

    def _replace(self, m: re.Match) -> str:
        i = int(m.lastgroup[1:])
        self.hits[self.keys[i]] += 1
        return self.values[i]

    def __call__(self, argv: list[str]) -> list[str]:
        return [self.pattern.sub(self._replace, arg) for arg in argv]

    def assert_all_used(self) -> None:
        assert all(self.hits.values()), [k for k, n in self.hits.items() if not n]


def local_executable(argv: list[str]) -> list[str]:
    """The image's executables by their local counterparts (python, pipeline, socat, Spark's scripts)."""
    out = []
    for arg in argv:
        if arg == "python":
            arg = sys.executable
        elif arg == "pipeline":
            arg = str(VENV_BIN / "pipeline")
        elif arg == "socat":
            arg = shutil.which("socat") or arg  # see Unchecked
        elif arg.startswith("/opt/spark/"):
            arg = str(spark_home() / Path(arg).relative_to("/opt/spark"))
        out.append(arg)
    if out[:2] == ["/usr/bin/tini", "--"] and not Path("/usr/bin/tini").exists():
        out = out[2:]  # tini's forwarding is then not exercised; the command behind it is
    return out


def without_tini(argv: list[str]) -> list[str]:
    return argv[2:] if argv[:2] == ["/usr/bin/tini", "--"] else argv


class Unchecked:
    """Parts of a slow test that need a Debian tool the image installs (tini, socat) but this
    machine may lack (``apt-get install tini socat``). The rest of the test runs; ``report``
    then skips the test naming what was not checked, so a missing tool is visible, not a pass,
    and fails it under CI, where ``.ci/run`` installs both (``tests.missing``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def have(self, tool: str, part: str) -> bool:
        found = Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None
        if not found:
            self.parts.append(f"{part} (no {tool} here)")
        return found

    def report(self) -> None:
        if self.parts:
            missing("everything else passed; not checked: " + "; ".join(self.parts))


class Running:
    """A deploy/ command line running here, its output in ``log``; stdout is scanned for "listening on"."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.argv = argv
        self.log = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._log, cwd=cwd,
                                     env={**os.environ, **(env or {})}, process_group=0)
        self.stdout = b""

    def wait_listening(self, timeout_s: float = 180) -> tuple[str, int]:
        os.set_blocking(self.proc.stdout.fileno(), False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = self.proc.stdout.read()
            if chunk:
                self.stdout += chunk
                m = LISTENING.search(self.stdout.decode(errors="replace"))
                if m:
                    return m.group(1), int(m.group(2))
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.log_tail()}"
            time.sleep(0.2)
        raise AssertionError(f"not listening within {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def terminate_and_wait(self, timeout_s: float) -> tuple[int, float]:
        """SIGTERM to the process itself (as systemd's KillMode=mixed, docker stop, the kubelet); (exit code, seconds)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout_s)
        return code, time.monotonic() - start

    def kill(self) -> None:
        """Leave nothing running: SIGKILL the process and every descendant still there."""
        victims = self.tree()
        if self.proc.poll() is None:
            victims.append(psutil.Process(self.proc.pid))
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=10)
        self.proc.wait(10)
        self._log.close()


def run_check(argv: list[str], timeout_s: float = 10) -> int:
    """Run a health check or probe command once; its exit code (as the engine reads it)."""
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s).returncode


def wait_check(argv: list[str], timeout_s: float, alive: Running | None = None) -> float:
    """Poll a check until it passes; seconds it took."""
    start = time.monotonic()
    while run_check(argv) != 0:
        if alive is not None:
            assert alive.proc.poll() is None, f"exited with {alive.proc.returncode}:\n{alive.log_tail()}"
        assert time.monotonic() - start < timeout_s, f"{argv} did not pass within {timeout_s} s"
        time.sleep(0.5)
    return time.monotonic() - start


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metadata_brokers(host: str, port: int) -> list[tuple[str, int]]:
    """(host, port) of every broker a Metadata v9 request returns: what clients are told to connect to."""
    from kio.schema.metadata.v9.response import MetadataResponse
    from kio.serial import entity_reader

    from tests.e2e import raw_client as rc

    client = rc.RawClient(host, port, timeout_s=30)
    try:
        client.send(rc.frame(rc.metadata(), correlation_id=1))
        _correlation, body = client.read_response()
    finally:
        client.close()
    assert body[0] == 0  # response header v1: no tagged fields
    response, _ = entity_reader(MetadataResponse)(body, 1)
    return [(b.host, int(b.port)) for b in response.brokers]


def produce(host: str, port: int, topic: str, values: list[bytes]) -> None:
    """Metadata (creates the topic), then one acks=-1 Produce; asserts it was stored without error."""
    from tests.e2e import raw_client as rc

    client = rc.RawClient(host, port, timeout_s=60)
    try:
        client.send(rc.frame(rc.metadata(topic), correlation_id=1))
        client.read_response()
        client.send(rc.frame(rc.produce(topic, values), correlation_id=2))
        _correlation, body = client.read_response()
    finally:
        client.close()
    response = rc.decode_produce_response(body)
    assert [p.error_code for t in response.responses for p in t.partition_responses] == [0]


@pytest.mark.slow
def test_systemd_exec_start_serves_and_stops_on_sigterm(tmp_path):
    """ExecStart as systemd runs it: listening, ready, then KillSignal to the main process: exit 0, no child left."""
    service = systemd_unit()["Service"]
    kafka, metrics = free_port(), free_port()
    local = Localizer({
        f"{service['WorkingDirectory']}/.venv/bin/pipeline": str(VENV_BIN / "pipeline"),
        "9092": str(kafka),
        "9464": str(metrics),
        str(DATA_DIR): str(tmp_path / "data"),
    })
    # the default Spark Connect port (15002) may be taken by another server on this machine
    argv = local(shlex.split(service["ExecStart"])) + ["--spark-connect-port", str(free_port())]
    local.assert_all_used()
    server = Running(argv, tmp_path / "server.log", cwd=REPO)
    try:
        assert server.wait_listening() == ("127.0.0.1", kafka)
        assert http_get(f"http://127.0.0.1:{metrics}/readyz")[0] == 200
        children = server.tree()
        assert children  # Spark's JVM, the decode worker
        code, took = server.terminate_and_wait(float(service["TimeoutStopSec"]))
        assert code == 0, server.log_tail()
        _gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, alive
    finally:
        server.kill()


@pytest.mark.slow
def test_containerfile_cmd_under_tini_with_its_healthcheck(tmp_path):
    """ENTRYPOINT + CMD (tini -- pipeline serve ...), its HEALTHCHECK passing while it serves,
    then STOPSIGNAL to tini (docker stop): forwarded, exit 0, and the health check fails after."""
    image = containerfile()
    kafka, metrics = free_port(), free_port()
    local = Localizer({
        "0.0.0.0": "127.0.0.1",
        "9092": str(kafka),
        "9464": str(metrics),
        str(DATA_DIR): str(tmp_path / "data"),
    })
    argv = local(local_executable([*image.exec_form("ENTRYPOINT"), *image.exec_form("CMD")]))
    argv += ["--spark-connect-port", str(free_port())]
    _options, check = image.healthcheck()
    check = local(local_executable(check))
    local.assert_all_used()
    unchecked = Unchecked()
    unchecked.have("/usr/bin/tini", "tini as PID 1 forwarding SIGTERM")
    server = Running(argv, tmp_path / "server.log")
    try:
        assert server.wait_listening() == ("127.0.0.1", kafka)
        assert metadata_brokers("127.0.0.1", kafka) == [("localhost", kafka)]  # the advertised listener
        assert run_check(check) == 0
        code, _took = server.terminate_and_wait(SHUTDOWN_BUDGET_S + 30)
        assert code == 0, server.log_tail()
        assert run_check(check) != 0
    finally:
        server.kill()
    unchecked.report()


@pytest.mark.slow
def test_k8s_container_with_its_configmap_probes_and_sidecar(tmp_path):
    """The StatefulSet's container args with the ConfigMap's file: the startup probe passes within its
    budget, readiness only once listening, Metadata advertises the pod's headless name, the
    metrics-proxy sidecar's socat serves /metrics, and SIGTERM ends it within the grace period."""
    docs = k8s_documents()
    pod = docs[("StatefulSet", "pipeline")]["spec"]["template"]["spec"]
    main = next(c for c in pod["containers"] if c["name"] == "pipeline")
    sidecar = next(c for c in pod["containers"] if c["name"] == "metrics-proxy")
    config_map = next(doc for (kind, _), doc in docs.items() if kind == "ConfigMap")
    etc = tmp_path / "etc"
    etc.mkdir()
    for name, text in config_map["data"].items():
        (etc / name).write_text(text)

    kafka, metrics, proxy = free_port(), free_port(), free_port()
    local = Localizer({
        "0.0.0.0": "127.0.0.1",
        "9092": str(kafka),
        "9464": str(metrics),
        "9465": str(proxy),
        str(DATA_DIR): str(tmp_path / "data"),
        "/etc/pipeline": str(etc),
    })
    fields = {"metadata.name": "pipeline-0", "metadata.namespace": "default"}
    argv = local(local_executable(k8s_argv(main, fields))) + ["--spark-connect-port", str(free_port())]
    startup, liveness, readiness = (local(local_executable(main[p]["exec"]["command"]))
                                    for p in ("startupProbe", "livenessProbe", "readinessProbe"))
    socat = local(local_executable(without_tini(k8s_argv(sidecar, fields))))
    socat[1] += ",bind=127.0.0.1"  # in the pod it listens on the pod IP; here on loopback only
    local.assert_all_used()
    unchecked = Unchecked()
    unchecked.have("/usr/bin/tini", "tini as PID 1 forwarding SIGTERM")

    server = Running(argv, tmp_path / "server.log")
    proxy_proc = None
    try:
        budget = main["startupProbe"]["periodSeconds"] * main["startupProbe"]["failureThreshold"]
        wait_check(startup, budget, server)
        assert run_check(liveness) == 0
        assert server.wait_listening() == ("127.0.0.1", kafka)
        wait_check(readiness, 10, server)
        assert metadata_brokers("127.0.0.1", kafka) == [("pipeline-0.pipeline-headless.default.svc", kafka)]

        if unchecked.have("socat", "the metrics-proxy sidecar"):
            proxy_proc = Running(socat, tmp_path / "socat.log")
            wait_check([sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {proxy}), 3)"],
                       10, proxy_proc)
            status, text = http_get(f"http://127.0.0.1:{proxy}/metrics")
            assert status == 200 and "pipeline_ready 1.0" in text

        code, took = server.terminate_and_wait(pod["terminationGracePeriodSeconds"])
        assert code == 0, server.log_tail()
        assert run_check(readiness) != 0 and run_check(liveness) != 0
    finally:
        server.kill()
        if proxy_proc is not None:
            proxy_proc.kill()
    unchecked.report()


@pytest.mark.slow
def test_compose_services_as_local_processes(tmp_path):
    """spark-master, spark-worker, spark-connect and pipeline from compose.yaml, each waited for with
    its own healthcheck as depends_on does, on 127.0.0.1: records produced to the front end are
    written through the Connect server by an executor on the worker and read back by name over
    Spark Connect; the metrics-proxy's socat serves /metrics; SIGTERM stops the front end with 0."""
    from pipeline.persist.spark_cluster import SparkProcess

    services = compose()["services"]
    data = tmp_path / "data"
    ports = {p: free_port() for p in ("7077", "7078", "8080", "8081", "15002", "9092", "9464", "9465")}
    local = Localizer({
        **{f"spark-{name}": "127.0.0.1" for name in ("master", "worker", "connect")},
        "0.0.0.0": "127.0.0.1",
        **{port: str(local_port) for port, local_port in ports.items()},
        str(DATA_DIR): str(data),
        "/tmp/spark-worker": str(tmp_path / "spark-worker"),
    })
    local_env = {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "127.0.0.1"}
    # The Master's REST submission server, on by default at 6066 (server_process.DEFAULT_PORTS), on a picked
    # port as well: nothing of the machine's and no other test's Spark Master is in its way, nor it in theirs.
    master_env = {"SPARK_MASTER_OPTS": f"-Dspark.master.rest.port={free_port()}"}

    def argv(name: str) -> list[str]:
        return local(local_executable(without_tini(compose_argv(services[name]))))

    def check(name: str) -> list[str]:
        return local(local_executable(services[name]["healthcheck"]["test"][1:]))

    spark: list[SparkProcess] = []
    front = proxy = None
    unchecked = Unchecked()
    try:
        for name in ("spark-master", "spark-worker", "spark-connect"):
            env = {**os.environ, **services[name].get("environment", {}), **local_env,
                   **(master_env if name == "spark-master" else {})}
            process = SparkProcess(name, argv(name), tmp_path / f"{name}.log", env)
            process.start()
            spark.append(process)
            hc = services[name]["healthcheck"]
            start = time.monotonic()
            while run_check(check(name)) != 0:
                process.check_alive()
                assert time.monotonic() - start < seconds(hc["start_period"]) + 60, process.log_tail()
                time.sleep(0.5)

        front_env = dict(zip(services["pipeline"]["environment"], local(list(services["pipeline"]["environment"].values()))))
        front = Running(argv("pipeline"), tmp_path / "pipeline.log", env=front_env)
        socat = argv("metrics-proxy")
        socat[1] += ",bind=127.0.0.1"
        local.assert_all_used()
        assert front.wait_listening(seconds(services["pipeline"]["healthcheck"]["start_period"])) == (
            "127.0.0.1", ports["9092"])
        wait_check(check("pipeline"), 10, front)
        assert metadata_brokers("127.0.0.1", ports["9092"]) == [("localhost", ports["9092"])]

        values = [f"v{i}".encode() for i in range(100)]
        produce("127.0.0.1", ports["9092"], "deploy-compose", values)

        if unchecked.have("socat", "the metrics-proxy service"):
            proxy = Running(socat, tmp_path / "socat.log")
            wait_check(check("metrics-proxy"), 10, proxy)
            status, text = http_get(f"http://127.0.0.1:{ports['9465']}/metrics")
            assert status == 200 and \
                'kafka_server_brokertopicmetrics_messagesin_total{topic="deploy-compose"} 100.0' in text

        # Read back through the Connect server, by name: rows come at the next table commit (10 s)
        from pipeline.persist.spark_sink import build_spark_session

        reader = build_spark_session(remote=f"sc://127.0.0.1:{ports['15002']}")
        try:
            deadline = time.monotonic() + 120
            rows = []
            while time.monotonic() < deadline:
                rows = reader.sql("SELECT value FROM pipeline.records WHERE topic = 'deploy-compose' "
                                  "ORDER BY offset").collect()
                if len(rows) >= len(values):
                    break
                time.sleep(2)
            assert [bytes(r.value) for r in rows] == values
        finally:
            reader.stop()
        # the Connect server's jobs ran on the worker's executors, writing into the shared data directory
        assert list((tmp_path / "spark-worker").glob("app-*"))
        assert list((data / "tables" / "records").rglob("*.parquet"))
        assert (data / "_pipeline" / "metastore_db").is_dir()  # the Connect server's catalog, in the data volume

        code, _took = front.terminate_and_wait(seconds(services["pipeline"]["stop_grace_period"]))
        assert code == 0, front.log_tail()
    finally:
        for running in (front, proxy):
            if running is not None:
                running.kill()
        for process in reversed(spark):
            process.stop()
    unchecked.report()


@pytest.mark.slow
def test_compose_cluster_brokers_as_local_processes(tmp_path, postgres_server, connect_server):
    """compose.cluster.yaml's three broker commands run here as one cluster: each waited for with its
    healthcheck, Metadata names the three by their advertised addresses, a topic's partitions are led by
    the three, records produced by an idempotent confluent-kafka producer are read back in offset order,
    and SIGTERM ends every broker with 0 within its stop_grace_period.

    A start of three brokers of their own: the cluster example is a configuration no shared server
    has (three ``--node-id`` brokers with leadership through PostgreSQL). What the example's other
    services run is stood in for by the session's servers, which the static test compares with
    them: PostgreSQL is ``postgres_server`` (a fresh database; the official image's password goes
    through PGPASSWORD, which its trust authentication ignores), the Connect server is
    ``connect_server`` (its own catalog: the brokers get a catalog database of their own)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.conftest import unique_database

    services = compose(file="compose.cluster.yaml")["services"]
    brokers = broker_services(services)
    data = tmp_path / "data"
    example = serve_config(compose_argv(brokers["broker-0"]))  # the same on every broker (the static test)
    metadata_url, spark_remote = example.metadata_url, example.spark_remote
    database = postgres_server.create_database("deploy_cluster")
    table_database = unique_database()

    running: dict[str, Running] = {}
    ports: dict[str, int] = {}
    checks: dict[str, list[str]] = {}
    try:
        for name, service in brokers.items():
            ports[name] = free_port()
            local = Localizer({
                "0.0.0.0": "127.0.0.1",
                name: "127.0.0.1",
                "9092": str(ports[name]),
                "9464": str(free_port()),
                str(DATA_DIR): str(data),
                metadata_url: database,
                spark_remote: connect_server.url,
            })
            argv = local(local_executable(compose_argv(service))) + ["--table-database", table_database]
            checks[name] = local(local_executable(service["healthcheck"]["test"][1:]))
            local.assert_all_used()
            running[name] = Running(argv, tmp_path / f"{name}.log", env=service["environment"])
        for name, broker in running.items():
            start = seconds(brokers[name]["healthcheck"]["start_period"])
            assert broker.wait_listening(start) == ("127.0.0.1", ports[name])
            wait_check(checks[name], 30, broker)

        # one cluster: every broker's Metadata names the three (membership in PostgreSQL, within a heartbeat or two)
        advertised = {("127.0.0.1", port) for port in ports.values()}
        deadline = time.monotonic() + 60
        for port in ports.values():
            while set(metadata_brokers("127.0.0.1", port)) != advertised:
                assert time.monotonic() < deadline, metadata_brokers("127.0.0.1", port)
                time.sleep(0.5)

        bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports.values())
        topic, partitions, per_partition = "deploy-cluster", len(brokers), 10
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
        deadline = time.monotonic() + 60
        while True:  # the controller assigns the new topic's leaders over the live brokers
            leaders = {p: m.leader for p, m in admin.list_topics(topic, timeout=10).topics[topic].partitions.items()}
            if len(leaders) == partitions and min(leaders.values()) >= 0:
                break
            assert time.monotonic() < deadline, leaders
            time.sleep(0.5)
        assert set(leaders.values()) == set(range(len(brokers)))  # spread over the three

        failures: list = []

        def delivered(err, _message) -> None:
            if err is not None:
                failures.append(err)

        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 20})
        sent = {p: [f"p{p}-v{i}".encode() for i in range(per_partition)] for p in range(partitions)}
        for i in range(per_partition):
            for p in range(partitions):
                producer.produce(topic, sent[p][i], partition=p, on_delivery=delivered)
        assert producer.flush(120) == 0 and not failures, failures

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "deploy-cluster-reader",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 120
        try:
            while sum(map(len, read.values())) < partitions * per_partition:
                assert time.monotonic() < deadline, {p: len(r) for p, r in read.items()}
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    read[message.partition()].append((message.offset(), message.value()))
        finally:
            consumer.close()
        for p in range(partitions):
            assert read[p] == list(enumerate(sent[p])), p
        assert list((data / "tables").rglob("*.parquet"))  # the shared table, in the shared data directory

        for broker in running.values():
            broker.proc.send_signal(signal.SIGTERM)
        for name, broker in running.items():
            code = broker.proc.wait(seconds(brokers[name]["stop_grace_period"]))
            assert code == 0, broker.log_tail()
    finally:
        for broker in running.values():
            broker.kill()
