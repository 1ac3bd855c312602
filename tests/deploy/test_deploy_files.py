"""docker-compose.yml, deploy/Dockerfile and deploy/k8s checked against the CLI they drive."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from typing import Any

import pytest
from gradwire.cli import build_parser as gradwire_parser
from gradwire.server.cli.tls_settings import TLS_SETTINGS
from gradwire.server.cli.worker import build_parser as worker_parser
from gradwire.server.cli.worker_config import WORKER_SETTINGS

from .procs import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Every variable a gradwire process reads (the CLI's table, plus the tool timeout).
KNOWN_ENV = {s.env for s in (*WORKER_SETTINGS, *TLS_SETTINGS)} | {"GRADWIRE_TOOL_TIMEOUT"}
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def parses(argv: list[str]) -> argparse.Namespace:
    """Parse a command line the way the console script named by argv[0] would."""
    assert argv[0] in SCRIPTS, f"{argv[0]} is not a console script of the project"
    parser = worker_parser() if argv[0] == "gradwire-worker" else gradwire_parser()
    try:
        return parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"{argv} does not parse: exit {exc.code}") from None


def check_env(env: dict[str, Any], where: str) -> None:
    unknown = {k for k in env if k.startswith("GRADWIRE_")} - KNOWN_ENV
    assert not unknown, f"{where}: variables no gradwire command reads: {sorted(unknown)}"


# -- docker-compose.yml --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def fixed(compose: dict[str, Any]) -> dict[str, Any]:
    """The services a plain ``docker compose up`` starts (no profile)."""
    return {n: s for n, s in compose["services"].items() if not s.get("profiles")}


def test_compose_services_form_one_cluster(compose: dict[str, Any]) -> None:
    services = fixed(compose)
    assert set(services) == {"ps", "trainer0", "trainer1", "worker3"}
    envs = {name: s["environment"] for name, s in services.items()}
    world = {int(e["GRADWIRE_WORLD_SIZE"]) for e in envs.values()}
    assert world == {len(services)}
    assert sorted(int(e["GRADWIRE_RANK"]) for e in envs.values()) == list(range(len(services)))
    assert all(e["GRADWIRE_NAME"] == name for name, e in envs.items())
    rank0 = next(n for n, e in envs.items() if e["GRADWIRE_RANK"] == "0")
    assert {e["GRADWIRE_MASTER_ADDR"] for e in envs.values()} == {rank0}
    ports = {e["GRADWIRE_LISTEN"].rpartition(":")[2] for e in envs.values()}
    assert ports == {envs[rank0]["GRADWIRE_MASTER_PORT"]}
    for name, e in envs.items():
        check_env(e, f"service {name}")


def test_compose_same_image_private_network_ps_publishes_on_loopback(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assert {s["image"] for s in services.values()} == {"gradwire:latest"}
    assert [n for n, s in services.items() if "build" in s] == ["ps"]
    assert services["ps"]["build"]["dockerfile"] == "deploy/Dockerfile"
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    assert list(published) == ["ps"]
    env = services["ps"]["environment"]
    ports = {}
    for spec in published["ps"]:
        host_ip, host_port, container_port = spec.split(":")
        assert host_ip == "127.0.0.1", spec  # inspection and scraping from the host only
        ports[container_port] = host_port
    # the gRPC port for inspection and the metrics port for a scraper, nothing else
    assert set(ports) == {env["GRADWIRE_LISTEN"].rpartition(":")[2], env["GRADWIRE_METRICS_PORT"]}
    assert all(s["networks"] == ["gradwire"] for s in services.values())
    assert compose["networks"]["gradwire"]["driver"] == "bridge"


def test_compose_token_comes_from_an_env_file(compose: dict[str, Any]) -> None:
    for name, s in compose["services"].items():
        assert s["env_file"] == ["deploy/cluster.env"], name
        assert "GRADWIRE_TOKEN" not in s["environment"], name
    example = (ROOT / "deploy" / "cluster.env.example").read_text()
    keys = dict(
        line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#")
    )
    assert "GRADWIRE_TOKEN" in keys
    check_env(keys, "deploy/cluster.env.example")
    assert "cluster.env" in (ROOT / "deploy" / ".gitignore").read_text().split()


def test_compose_start_is_gated_on_health(compose: dict[str, Any]) -> None:
    for name, s in compose["services"].items():
        test = s["healthcheck"]["test"]
        assert test[0] == "CMD"
        args = parses(test[1:])
        # healthy once joined; rank 0 also while it hosts the rendezvous (server/cli/health.py)
        assert args.command == "health" and args.rendezvous and not args.live
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in compose["services"], name
            # only a rendezvous host can be healthy before the cluster formed
            rank0 = compose["services"][dep]["environment"].get("GRADWIRE_RANK") == "0"
            wanted = "service_healthy" if rank0 else "service_started"
            assert cond == {"condition": wanted}, (name, dep)
        # the image is built here, never pulled (no registry copy of gradwire:latest)
        assert s["pull_policy"] == ("build" if "build" in s else "never"), name
    services = fixed(compose)
    assert set(services["trainer0"]["depends_on"]) == set(services) - {"trainer0"}
    assert "ps" in services["trainer1"]["depends_on"] and "ps" in services["worker3"]["depends_on"]


def test_compose_driver_runs_the_demo_and_the_others_leave_with_it(
    compose: dict[str, Any],
) -> None:
    services = fixed(compose)
    driver = services["trainer0"]
    (command,) = driver["command"]
    var, default = re.fullmatch(r"\$\{(\w+):-(.+)\}", command).groups()  # type: ignore[union-attr]
    assert var == "GRADWIRE_JOB"  # selectable, like the netns script's --job
    args = parses([*driver["entrypoint"], default])
    assert args.command == "run" and args.target == "gradwire.demo:job"
    # the demo's cluster job needs a "ps" and trainers named trainer0, trainer1, ...
    assert {"ps", "trainer0", "trainer1"} <= set(services)
    for name, s in services.items():
        if name != "trainer0":
            assert "entrypoint" not in s and "command" not in s  # the image's gradwire-worker
            assert s["environment"].get("GRADWIRE_UNTIL", "job") == "job"


def test_compose_elastic_profile_a_dynamic_group_and_a_scalable_trainer(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    elastic = {n: s for n, s in services.items() if s.get("profiles")}
    assert set(elastic) == {"elastic", "trainer"}
    assert all(s["profiles"] == ["elastic"] for s in elastic.values())
    host, trainer = elastic["elastic"], elastic["trainer"]
    envs = {n: s["environment"] for n, s in elastic.items()}
    for name, e in envs.items():
        check_env(e, f"service {name}")
        assert "GRADWIRE_WORLD_SIZE" not in e, name  # a dynamic group
        assert e["GRADWIRE_MASTER_ADDR"] == "elastic", name
        assert "GRADWIRE_ALLOW" in e and e["GRADWIRE_LISTEN"].endswith(e["GRADWIRE_MASTER_PORT"])
    assert envs["elastic"]["GRADWIRE_NAME"] == "elastic" and envs["elastic"]["GRADWIRE_RANK"] == "0"
    # replicas: no fixed name, rank, container name or published port
    assert not {"GRADWIRE_NAME", "GRADWIRE_RANK"} & set(envs["trainer"])
    assert not {"container_name", "ports", "hostname"} & set(trainer)
    assert trainer["depends_on"] == {"elastic": {"condition": "service_healthy"}}
    # the host runs the elastic job with gradwire run; the trainers are demo members
    command = [re.sub(r"\$\{\w+:-([^}]+)\}", r"\1", c) for c in host["command"]]
    args = parses([*host["entrypoint"], *command])
    assert args.command == "run" and args.target == "gradwire.demo.elastic:job"
    from gradwire.demo import elastic as elastic_job

    job_args = elastic_job._parser().parse_args(args.job_args)
    assert job_args.epochs > 0 and job_args.epoch_seconds >= 0
    assert trainer["entrypoint"] == ["python", "-m", "gradwire.demo.member"]
    assert "ps" not in (trainer.get("depends_on") or {})  # not the fixed cluster's host
    # a trainer's settings leave its rank to the group's host (assigned at join)
    from gradwire.server.cli.worker_config import worker_config

    env = {**envs["trainer"], "GRADWIRE_NAME": "trainer-c0ffee", "GRADWIRE_TOKEN": "t"}
    cfg = worker_config(worker_parser().parse_args([]), env)
    assert cfg.rank is None and cfg.world_size is None, cfg
    assert cfg.init_method == "tcp://elastic:29500"


# -- deploy/Dockerfile ---------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_slim_non_root_package_only() -> None:
    steps = dockerfile()
    froms = [rest for word, rest in steps if word == "FROM"]
    assert all(re.fullmatch(r"\$\{BASE_IMAGE\}( AS \w+)?", f) for f in froms), froms
    args = [rest for word, rest in steps if word == "ARG"]
    assert any(re.fullmatch(r"BASE_IMAGE=python:3\.\d+-slim", a) for a in args), args
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    copied = [rest.split()[0] for word, rest in steps if word == "COPY" and "--from" not in rest]
    assert set(copied) <= {"pyproject.toml", "client", "server", "deploy/jobs"}, copied
    installs = [rest for word, rest in final if word == "RUN" and "pip install" in rest]
    assert installs and all("--no-index" in r for r in installs)  # only the built wheels
    for name in (
        "deploy/Dockerfile.dockerignore",
        ".dockerignore",
    ):  # buildx and the classic builder
        ignore = [
            ln.strip()
            for ln in (ROOT / name).read_text().splitlines()
            if ln.strip() and not ln.startswith("#")
        ]
        assert ignore[0] == "*" and "!client/" in ignore and "!server/" in ignore, name
        assert not any("cluster.env" in ln or ".venv" in ln for ln in ignore[1:]), name


def test_dockerfile_entrypoint_env_and_healthcheck_match_the_cli() -> None:
    steps = dict((w, r) for w, r in dockerfile() if w in ("ENTRYPOINT", "HEALTHCHECK", "EXPOSE"))
    entry = yaml.safe_load(steps["ENTRYPOINT"])
    assert entry == ["gradwire-worker"] and "gradwire-worker" in SCRIPTS
    env_lines = [r for w, r in dockerfile() if w == "ENV"]
    env = dict(pair.split("=", 1) for r in env_lines for pair in shlex.split(r))
    check_env(env, "deploy/Dockerfile")
    assert steps["EXPOSE"].split() == [env["GRADWIRE_LISTEN"].rpartition(":")[2], METRICS_PORT]
    cmd = steps["HEALTHCHECK"].split("CMD", 1)[1].strip()
    args = parses(yaml.safe_load(cmd))
    assert args.command == "health" and args.rendezvous and not args.live
    assert float(args.timeout) < 4


# -- metrics (docs/observability.md) -------------------------------------------------------------

#: The port every deployment serves Prometheus metrics on.
METRICS_PORT = "9400"
SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/port": METRICS_PORT}


def test_the_image_has_the_observability_extra() -> None:
    steps = dockerfile()
    wheels = [r for w, r in steps if w == "RUN" and "pip wheel" in r]
    installs = [r for w, r in steps if w == "RUN" and "pip install" in r]
    assert wheels and all('".[observability]"' in r for r in wheels), wheels
    assert installs and all('"gradwire[observability]"' in r for r in installs), installs
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "observability" in extras["optional-dependencies"]


def _metrics_env(env: dict[str, Any], where: str) -> None:
    assert str(env.get("GRADWIRE_METRICS_PORT")) == METRICS_PORT, where
    assert env.get("GRADWIRE_METRICS_HOST") == "0.0.0.0", where  # reachable by a scraper
    # the worker reads them as it would from this environment (a port, an address)
    settings = {s.env: s for s in WORKER_SETTINGS}
    assert settings["GRADWIRE_METRICS_PORT"].convert(METRICS_PORT) == int(METRICS_PORT)
    assert settings["GRADWIRE_METRICS_HOST"].convert(env["GRADWIRE_METRICS_HOST"])


def test_every_compose_and_stack_worker_serves_metrics_and_says_where(
    compose: dict[str, Any], stack: dict[str, Any]
) -> None:
    for name, s in compose["services"].items():
        _metrics_env(s["environment"], f"compose {name}")
        assert SCRAPE.items() <= s["labels"].items(), name
        assert s["labels"]["prometheus.io/path"] == "/metrics", name
    for name, s in stack["services"].items():
        _metrics_env(s["environment"], f"stack {name}")
        # swarm service labels (deploy.labels) are what dockerswarm_sd_configs sees
        assert SCRAPE.items() <= s["deploy"]["labels"].items(), name


def test_every_k8s_pod_serves_metrics_with_scrape_annotations(
    k8s: dict[str, dict[str, Any]],
) -> None:
    for kind in ("StatefulSet/gradwire", "Job/gradwire-driver"):
        template = k8s[kind]["spec"]["template"]
        assert SCRAPE.items() <= template["metadata"]["annotations"].items(), kind
        (c,) = template["spec"]["containers"]
        _metrics_env(container_env(c), kind)
        ports = {p["name"]: str(p["containerPort"]) for p in c["ports"]}
        assert ports["metrics"] == METRICS_PORT, kind


# -- deploy/k8s ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    docs = {}
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc:
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def container_env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_k8s_statefulset_behind_a_headless_service(k8s: dict[str, dict[str, Any]]) -> None:
    svc, sts = k8s["Service/gradwire"], k8s["StatefulSet/gradwire"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert sts["spec"]["serviceName"] == "gradwire"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"] == labels
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    env = container_env(c)
    check_env(env, "statefulset")
    assert "GRADWIRE_NAME" not in env  # from GRADWIRE_NAMES by rank
    names = env["GRADWIRE_NAMES"].split(",")
    assert len(names) == int(env["GRADWIRE_WORLD_SIZE"]) == len(set(names))
    assert names[0] == "ps" and "trainer0" in names and "trainer1" in names  # the demo's roles
    assert "pod-index" in env["GRADWIRE_RANK"]["fieldRef"]["fieldPath"]
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["GRADWIRE_ADVERTISE"] == f"$(POD_NAME).{svc['metadata']['name']}:29500"
    # rank 0 is pod gradwire-0, reached through the headless Service's stable name
    assert env["GRADWIRE_MASTER_ADDR"] == f"{sts['metadata']['name']}-0.{svc['metadata']['name']}"
    port = int(env["GRADWIRE_LISTEN"].rpartition(":")[2])
    assert svc["spec"]["ports"][0]["port"] == port == c["ports"][0]["containerPort"]
    assert int(env["GRADWIRE_WORLD_SIZE"]) == sts["spec"]["replicas"] + 1  # + the driver Job


def test_k8s_probes_speak_grpc_health(k8s: dict[str, dict[str, Any]]) -> None:
    (c,) = k8s["StatefulSet/gradwire"]["spec"]["template"]["spec"]["containers"]
    port = int(container_env(c)["GRADWIRE_LISTEN"].rpartition(":")[2])
    assert c["readinessProbe"]["grpc"]["port"] == port  # SERVING = joined a session
    live = parses(c["livenessProbe"]["exec"]["command"])
    assert live.command == "health" and live.live


def test_k8s_token_comes_from_a_secret(k8s: dict[str, dict[str, Any]]) -> None:
    secret = k8s["Secret/gradwire-token"]
    for key in ("StatefulSet/gradwire", "Job/gradwire-driver"):
        pod = k8s[key]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = container_env(c)
        assert "GRADWIRE_TOKEN" not in env
        mount = next(m for m in c["volumeMounts"] if m["name"] == "token")
        assert env["GRADWIRE_TOKEN_FILE"] == f"{mount['mountPath']}/token"
        vol = next(v for v in pod["volumes"] if v["name"] == "token")
        assert vol["secret"]["secretName"] == secret["metadata"]["name"]
        assert "token" in secret["stringData"]
        assert pod["securityContext"]["runAsNonRoot"] is True


def test_k8s_driver_job_joins_as_the_last_rank(k8s: dict[str, dict[str, Any]]) -> None:
    sts, job = k8s["StatefulSet/gradwire"], k8s["Job/gradwire-driver"]
    (c,) = job["spec"]["template"]["spec"]["containers"]
    args = parses([*c["command"], *c["args"]])
    assert args.command == "run" and args.target == "gradwire.demo:job"
    env = container_env(c)
    check_env(env, "driver job")
    assert int(env["GRADWIRE_RANK"]) == sts["spec"]["replicas"]
    (w,) = sts["spec"]["template"]["spec"]["containers"]
    names = container_env(w)["GRADWIRE_NAMES"].split(",")
    assert names[int(env["GRADWIRE_RANK"])] == env["GRADWIRE_NAME"]
    assert env["GRADWIRE_MASTER_ADDR"] == container_env(w)["GRADWIRE_MASTER_ADDR"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] != "worker"  # not one of the Service's pods


#: The Kubernetes release whose API schemas the manifests are checked against.
K8S_VERSION = "1.33"


def _k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's own file, not an API resource
            continue
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_k8s_manifests_validate_against_the_kubernetes_api_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = _k8s_documents()
    assert {d["kind"] for _, d in docs} >= {"StatefulSet", "Service", "Job", "Secret"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {doc['kind']} is not valid: {exc}") from exc
    # the check can fail: a wrongly typed field and an unknown one are both refused
    statefulset = next(d for _, d in docs if d["kind"] == "StatefulSet")
    for broken in (
        {**statefulset, "spec": {**statefulset["spec"], "replicas": "three"}},
        {**statefulset, "spec": {**statefulset["spec"], "replica": 3}},
    ):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    kustomization = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (ROOT / "deploy" / "k8s" / resource).exists(), resource


# -- deploy/stack.yml (Docker Swarm) -------------------------------------------------------------

#: Keys of a compose file that `docker stack deploy` refuses or silently ignores.
SWARM_REFUSED = {"build", "restart", "security_opt", "tmpfs", "depends_on", "profiles"}
SWARM_IGNORED = {"container_name", "pull_policy", "env_file", "ports"}


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "deploy" / "stack.yml").read_text())


def _defaults(value: str) -> str:
    """A value with its ${VAR:-default} references replaced by the defaults."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_stack_is_the_compose_cluster_with_the_same_settings(
    stack: dict[str, Any], compose: dict[str, Any]
) -> None:
    assert str(stack["version"]).startswith("3.")  # the format docker stack deploy reads
    assert "name" not in stack  # refused by swarm: the stack's name is the deploy argument
    assert set(stack["services"]) == set(compose["services"])
    for name, s in stack["services"].items():
        env = {k: _defaults(str(v)) for k, v in s["environment"].items()}
        check_env(env, f"stack service {name}")
        wanted = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        assert wanted.items() <= env.items(), name  # the compose file's own settings
        assert s.get("entrypoint") == compose["services"][name].get("entrypoint"), name
        assert s.get("command") == compose["services"][name].get("command"), name
        if "entrypoint" in s and s["entrypoint"][0] in SCRIPTS:
            parses([*s["entrypoint"], *(_defaults(c) for c in s["command"])])
        assert not (SWARM_REFUSED | SWARM_IGNORED) & set(s), name


def test_stack_swarm_networking_jobs_once_elastic_trainers_replaced(stack: dict[str, Any]) -> None:
    assert stack["networks"] == {"gradwire": {"driver": "overlay"}}
    for name, s in stack["services"].items():
        assert s["image"] == "gradwire:latest" and s["networks"] == ["gradwire"], name
        deploy = s["deploy"]
        # DNS round robin: a name resolves to the tasks themselves, no virtual IP (IPVS)
        assert deploy["endpoint_mode"] == "dnsrr", name
        restart = deploy["restart_policy"]["condition"]
        if name == "trainer":  # a killed replica is replaced and joins the group again
            assert restart == "on-failure" and deploy["restart_policy"]["max_attempts"] > 0
            assert int(_defaults(str(deploy["replicas"]))) >= 1
        else:  # the job and its workers run once
            assert restart == "none", name
            assert "replicas" not in deploy, name
        test = s["healthcheck"]["test"]
        args = parses(test[1:])
        assert test[0] == "CMD" and args.command == "health" and args.rendezvous, name


def test_stack_keeps_the_security_settings_swarm_allows(stack: dict[str, Any]) -> None:
    for name, s in stack["services"].items():
        assert s["read_only"] is True and s["cap_drop"] == ["ALL"], name
        assert s["user"].split(":")[0] not in ("root", "0"), name
        # /tmp as a tmpfs volume (swarm drops the tmpfs key; the workers need a /tmp)
        assert {"type": "tmpfs", "target": "/tmp"} in s["volumes"], name
        assert not [v for v in s["volumes"] if v.get("type") != "tmpfs"], name  # no host path
        # inspection stays private: nothing published (docs/deploy.md: docker exec)
        assert "ports" not in s, name


def test_stack_token_is_a_docker_secret_never_an_env_file(stack: dict[str, Any]) -> None:
    assert stack["secrets"] == {"gradwire-token": {"external": True}}
    for name, s in stack["services"].items():
        (secret,) = s["secrets"]
        assert secret["source"] == "gradwire-token" and secret["mode"] == 0o400, name
        assert secret["uid"] == s["user"].split(":")[0], name  # readable by the worker only
        env = s["environment"]
        assert env["GRADWIRE_TOKEN_FILE"] == f"/run/secrets/{secret['target']}", name
        assert "GRADWIRE_TOKEN" not in env and "env_file" not in s, name
    assert "GRADWIRE_TOKEN=" not in (ROOT / "deploy" / "stack.yml").read_text()


def test_long_job_override_runs_a_deploy_job_with_its_arguments(compose: dict[str, Any]) -> None:
    override = yaml.safe_load((ROOT / "deploy" / "long-job.yml").read_text())
    assert set(override["services"]) == {"trainer0"}  # the driver only
    command = override["services"]["trainer0"]["command"]
    args = parses([*compose["services"]["trainer0"]["entrypoint"], *command])
    assert args.command == "run" and args.job_args  # arguments GRADWIRE_JOB cannot pass
    script = args.target.removeprefix("/opt/gradwire/jobs/")
    assert (ROOT / "deploy" / "jobs" / script).is_file()  # the image copies deploy/jobs there
