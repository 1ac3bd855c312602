"""The docker-compose cluster for real, through the Docker SDK for Python, where an engine runs.

Skips with its reason where the SDK is missing or no Docker engine answers (as on the CI machine
of this project, which has only the docker client). It builds deploy/Dockerfile, starts the
services of docker-compose.yml in dependency order on a private network with the compose file's
environment and health checks, waits for health, runs the driver and expects exit code 0 from
every container. The driver runs $GRADWIRE_JOB or the compose default (the demo), or the
image's ping_all job when ``gradwire.demo`` is not in this version.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import time
from typing import Any

import pytest

from .procs import ROOT

pytestmark = pytest.mark.slow


def _engine() -> Any:
    docker = pytest.importorskip("docker", reason="the Docker SDK for Python is not installed")
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        pytest.skip(f"no Docker engine reachable: {type(exc).__name__}: {exc}")
    return client


def _nanos(text: str) -> int:
    return int(float(text.rstrip("s")) * 1e9)


def test_compose_cluster_runs_the_job_to_exit_code_0() -> None:
    client = _engine()
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    image, _ = client.images.build(
        path=str(ROOT), dockerfile="deploy/Dockerfile", tag="gradwire:test", rm=True
    )
    tag = secrets.token_hex(4)
    network = client.networks.create(f"gradwire-test-{tag}", driver="bridge")
    env_common = {"GRADWIRE_TOKEN": secrets.token_hex(16), "GRADWIRE_LOG_LEVEL": "INFO"}
    containers: dict[str, Any] = {}
    try:
        order = sorted(services, key=lambda n: len(services[n].get("depends_on") or {}))
        for name in order:
            s = services[name]
            for dep, cond in (s.get("depends_on") or {}).items():
                if cond.get("condition") != "service_healthy":
                    continue  # started is enough (a worker is healthy only once joined)
                deadline = time.monotonic() + 120
                while containers[dep].attrs["State"].get("Health", {}).get("Status") != "healthy":
                    assert time.monotonic() < deadline, f"{dep} never became healthy"
                    time.sleep(1)
                    containers[dep].reload()
            command = s.get("command")
            if command:  # "${GRADWIRE_JOB:-default}", interpolated as compose would
                command = [os.environ.get("GRADWIRE_JOB") or command[0][2:-1].split(":-", 1)[1]]
                demo_missing = importlib.util.find_spec("gradwire.demo") is None
                if command[0].startswith("gradwire.demo") and demo_missing:
                    command = ["/opt/gradwire/jobs/ping_all.py"]  # no demo in this version
            hc = s["healthcheck"]
            c = client.containers.create(
                image.id,
                name=f"{name}-{tag}",
                entrypoint=s.get("entrypoint"),
                command=command,
                environment={**env_common, **s["environment"]},
                network=network.name,
                healthcheck={
                    "test": hc["test"],
                    "interval": _nanos(hc["interval"]),
                    "timeout": _nanos(hc["timeout"]),
                    "retries": hc["retries"],
                    "start_period": _nanos(hc["start_period"]),
                },
            )
            # compose makes each service name a DNS alias on the network (GRADWIRE_MASTER_ADDR)
            network.disconnect(c)
            network.connect(c, aliases=[name])
            c.start()
            containers[name] = c
        codes = {n: c.wait(timeout=300)["StatusCode"] for n, c in containers.items()}
        logs = {n: c.logs().decode(errors="replace")[-2000:] for n, c in containers.items()}
        assert codes == dict.fromkeys(containers, 0), logs
    finally:
        for c in containers.values():
            c.remove(force=True)
        network.remove()
