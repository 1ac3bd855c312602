"""docker compose for real: the real compose CLI on the real docker-compose.yml and Dockerfile.

Marked ``docker``: they run where a Docker engine and the compose v2 plugin answer (on a bare
Linux host, ``eval "$(deploy/local-engine.sh up)"`` first; ``.ci/run`` does that as root) and skip
with the reason otherwise. The image is built once per module (from ``$GRADWIRE_BASE_IMAGE``
where set, the local base image of deploy/local-engine.sh); each test runs the cluster under
its own compose project and removes it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .procs import ROOT

pytestmark = pytest.mark.docker

ENV_FILE = ROOT / "deploy" / "cluster.env"


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _engine_or_skip() -> None:
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}", timeout=20)
        compose = _docker("compose", "version", "--short", timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no docker client or engine here: {exc}")
    if info.returncode != 0:
        pytest.skip(f"no Docker engine answers (deploy/local-engine.sh up): {info.stderr.strip()}")
    if compose.returncode != 0:
        pytest.skip(f"no compose v2 plugin: {compose.stderr.strip()}")


class Project:
    """One compose project of the repository's docker-compose.yml."""

    def __init__(self, override: str = "", **env: str) -> None:
        self.name = f"gwtest-{secrets.token_hex(3)}"
        self.env = {**os.environ, **env}
        self.files = ["-f", "docker-compose.yml"]
        if override:  # a compose override file, as a user would layer one
            path = ROOT / "deploy" / f".{self.name}.override.yml"
            path.write_text(override)
            self.files += ["-f", str(path)]
            self.override: Path | None = path
        else:
            self.override = None

    def _cmd(self, *args: str) -> list[str]:
        return ["docker", "compose", "-p", self.name, *self.files, *args]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._cmd(*args),
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._cmd(*args),
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def containers(self) -> list[dict[str, Any]]:
        ids = self.run("ps", "-a", "-q").stdout.split()
        if not ids:
            return []
        return list(json.loads(_docker("inspect", *ids).stdout))

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "-t", "5", timeout=120)
        if self.override is not None:
            self.override.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The cluster env file and the image, built once with compose (as a user would)."""
    _engine_or_skip()
    made = not ENV_FILE.exists()
    if made:
        subprocess.run([str(ROOT / "deploy" / "make-secrets.sh")], check=True, timeout=30)
    started = time.monotonic()
    built = Project().run("build", timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    print(f"compose build: {time.monotonic() - started:.1f} s")
    try:
        yield "gradwire:latest"
    finally:
        if made:
            ENV_FILE.unlink(missing_ok=True)


def _accuracies(log: str) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(r"(trainer\d): test accuracy ([0-9.]+)", log)}


def test_compose_up_runs_the_demo_to_exit_0_with_hardened_containers(image: str) -> None:
    project = Project()
    try:
        started = time.monotonic()
        up = project.run("up", "--exit-code-from", "trainer0", timeout=600)
        elapsed = time.monotonic() - started
        log = up.stdout + up.stderr
        assert up.returncode == 0, log[-4000:]
        acc = _accuracies(log)
        assert set(acc) == {"trainer0", "trainer1"} and min(acc.values()) >= 0.90, acc
        print(f"compose up, demo job: {elapsed:.1f} s, accuracies {acc}")
        # start order gated by health: the driver starts after ps answered its health check
        healthy = log.find(f"{project.name}-ps-1 Healthy")
        driver_started = log.find(f"{project.name}-trainer0-1 Started")
        assert 0 <= healthy < driver_started, log[:3000]
        containers = project.containers()
        assert len(containers) == 4
        token = _env_file_token()
        for c in containers:
            name = c["Name"]
            assert c["State"]["Status"] == "exited" and c["State"]["ExitCode"] == 0, name
            host = c["HostConfig"]
            assert host["ReadonlyRootfs"] is True, name
            assert host["CapDrop"] in (["ALL"], ["all"]), (name, host["CapDrop"])
            assert any("no-new-privileges" in o for o in host["SecurityOpt"] or []), name
            assert c["Config"]["User"] == "10001:10001", name
        # the token is in the running containers' environment, never in the image
        history = _docker("history", "--no-trunc", image).stdout
        config = _docker("image", "inspect", image).stdout
        assert token not in history and token not in config
    finally:
        project.down()


@pytest.mark.parametrize(
    "job,expected",
    [
        ("ping_all.py", "ping_all: 3 workers answered"),
        ("autograd_rounds.py", "autograd_rounds: round 3:"),
        ("rref_rounds.py", "rref_rounds: round 3:"),
    ],
)
def test_the_deploy_jobs_run_through_gradwire_job(image: str, job: str, expected: str) -> None:
    project = Project(GRADWIRE_JOB=f"/opt/gradwire/jobs/{job}")
    try:
        up = project.run("up", "--exit-code-from", "trainer0", timeout=300)
        log = up.stdout + up.stderr
        assert up.returncode == 0, log[-4000:]
        assert expected in log, log[-4000:]
        if job == "ping_all.py":  # between containers: both second ports carry the round
            assert "fast lane to 3 of 3 workers, bulk lane sent 3 and took 3" in log, log[-4000:]
    finally:
        project.down()


#: The driver runs 300 distributed-autograd rounds through every worker, 0.2 s apart.
LONG_JOB = """
services:
  trainer0:
    command: ["/opt/gradwire/jobs/autograd_rounds.py", "300", "0.2"]
"""


def _up_until_round(project: Project, rounds: int) -> tuple[subprocess.Popen[str], list[str]]:
    """``compose up`` of the long job, read until it printed round ``rounds`` (every worker
    joined and the rounds run) or 180 s passed; the process and the lines read."""
    up = project.popen("up", "--exit-code-from", "trainer0")
    assert up.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 180
    for line in up.stdout:
        lines.append(line)
        if f"round {rounds}:" in line or time.monotonic() > deadline:
            break
    assert any(f"round {rounds}:" in line for line in lines), "".join(lines)[-4000:]
    return up, lines


def test_a_worker_killed_mid_job_fails_the_job_and_nothing_hangs(image: str) -> None:
    project = Project(override=LONG_JOB)
    try:
        up, lines = _up_until_round(project, 3)
        killed_at = time.monotonic()
        kill = project.run("kill", "trainer1", timeout=60)
        assert kill.returncode == 0, kill.stderr
        try:
            rest, _ = up.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            up.kill()
            raise AssertionError("compose up did not end after a worker was killed") from None
        detected = time.monotonic() - killed_at
        log = "".join(lines) + rest
        assert up.returncode != 0, log[-4000:]
        assert re.search(r"trainer1.*(unavailable|lost|timed out)", log), log[-4000:]
        assert "round 300:" not in log
        print(f"killed trainer1: the job failed after {detected:.1f} s")
        states = {c["Name"]: c["State"]["Status"] for c in project.containers()}
        assert set(states.values()) == {"exited"}, states
    finally:
        project.down()


def _gradwire(*args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADWIRE_")}
    if token is not None:
        env["GRADWIRE_TOKEN"] = token
    return subprocess.run(
        [str(Path(sys.executable).with_name("gradwire")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_published_port_answers_health_inspect_and_reflection(image: str) -> None:
    project = Project(override=LONG_JOB)
    try:
        up, _ = _up_until_round(project, 2)  # the job is running: every worker joined
        token = _env_file_token()
        address = "127.0.0.1:29500"  # ps publishes it on the host's loopback only
        health = _gradwire("health", address, "--timeout", "10", token=None)
        assert health.returncode == 0 and "SERVING" in health.stdout, health.stdout + health.stderr
        inspected = _gradwire("inspect", address, "--json", "--timeout", "10", token=token)
        assert inspected.returncode == 0, inspected.stderr
        info = json.loads(inspected.stdout)
        assert info["worker"] == "ps" and {p["name"] for p in info["peers"]} >= {
            "trainer0",
            "trainer1",
            "worker3",
        }
        refused = _gradwire("inspect", address, "--json", "--timeout", "10", token="wrong")
        assert refused.returncode != 0
        assert re.search(r"(?i)unauthenticated|token", refused.stdout + refused.stderr)
        # reflection is open, like health: it shows the schema, never state
        import grpc
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        with grpc.insecure_channel(address) as channel:
            services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
        assert {"gradwire.v1.Worker", "grpc.health.v1.Health"} <= services
        up.kill()
        up.communicate(timeout=60)
    finally:
        project.down()


def _scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus' text format as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _worker_info(samples: dict[Any, float]) -> dict[str, str]:
    """The labels of the gradwire_worker sample (value 1: the worker's name, rank, state)."""
    (labels,) = [dict(k[1]) for k, v in samples.items() if k[0] == "gradwire_worker" and v == 1]
    return labels


#: Scrapes a worker's metrics from inside the network (by its service name), as a scraper
#: that discovered the container by its prometheus.io labels would.
SCRAPE_INSIDE = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen(f'http://{sys.argv[1]}:9400/metrics', "
    "timeout=10).read().decode())"
)


def test_every_worker_serves_metrics_that_count_the_jobs_calls(image: str) -> None:
    import urllib.request

    project = Project(override=LONG_JOB)
    try:
        up, _ = _up_until_round(project, 5)
        # ps publishes its metrics port on the host's loopback
        url = "http://127.0.0.1:9400/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200
            assert reply.headers["Content-Type"].startswith("text/plain")
            first = _scrape(reply.read().decode())
        info = _worker_info(first)
        # the workers that serve until the job ends wait in their shutdown meanwhile
        assert info["worker"] == "ps" and info["rank"] == "0", info
        assert info["state"] in ("RUNNING", "SHUTTING_DOWN"), info
        assert _sample(first, "gradwire_peers", state="alive") == 3
        # trainer0 called ps in each of at least 5 rounds: ps ran those calls for it
        served = _sample(
            first, "gradwire_rpc_server_calls_started_total", verb="rpc", peer="trainer0"
        )
        assert served >= 5, sorted(k for k in first if "server" in k[0])
        assert (
            _sample(first, "gradwire_rpc_server_calls_failed_total", verb="rpc", peer="trainer0")
            == 0
        )
        assert (
            _sample(first, "gradwire_bytes_received_total", route="grpc")
            + _sample(first, "gradwire_bytes_received_total", route="fast_lane")
            > 0
        )
        # the driver and a trainer, scraped from inside the network by name
        scraped = {}
        for name in ("trainer0", "trainer1"):
            got = project.run("exec", "-T", "ps", "python", "-c", SCRAPE_INSIDE, name, timeout=60)
            assert got.returncode == 0, got.stdout + got.stderr
            scraped[name] = _scrape(got.stdout)
        driver = scraped["trainer0"]
        for peer in ("ps", "trainer1", "worker3"):  # one rpc_sync to each per round
            made = _sample(
                driver, "gradwire_rpc_client_calls_started_total", verb="rpc_sync", peer=peer
            )
            done = _sample(
                driver, "gradwire_rpc_client_calls_finished_total", verb="rpc_sync", peer=peer
            )
            assert made >= served - 1 and made >= 5, (peer, made, served)
            assert done >= made - 1, (peer, made, done)  # at most the call in flight
            count = _sample(
                driver, "gradwire_rpc_client_call_seconds_count", verb="rpc_sync", peer=peer
            )
            assert count == done, (peer, count, done)
        trainer1 = scraped["trainer1"]
        assert _worker_info(trainer1)["worker"] == "trainer1"
        assert (
            _sample(
                trainer1, "gradwire_rpc_server_calls_started_total", verb="rpc", peer="trainer0"
            )
            >= 5
        )
        # counters move with the job: a later scrape of ps counts more calls
        time.sleep(2)
        with urllib.request.urlopen(url, timeout=10) as reply:
            later = _scrape(reply.read().decode())
        assert (
            _sample(later, "gradwire_rpc_server_calls_started_total", verb="rpc", peer="trainer0")
            > served
        )
        up.kill()
        up.communicate(timeout=60)
    finally:
        project.down()


def _env_file_token() -> str:
    for line in Path(ENV_FILE).read_text().splitlines():
        if line.startswith("GRADWIRE_TOKEN="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"no GRADWIRE_TOKEN in {ENV_FILE}")
