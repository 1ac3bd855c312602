"""Docker Swarm for real: deploy/stack.yml on a single-node swarm of the test engine.

Marked ``docker`` like test_compose_real.py, whose image fixture this reuses (skipped with the
reason where no engine answers, and where the engine is already part of a swarm: this test
makes its own and leaves it). One deployment runs both clusters of the stack: the fixed demo
(its job's outcome read with deploy/stack-job.sh, every trainer's accuracy checked) and the
elastic job, whose trainers are scaled with ``docker service scale`` mid-job and one of which
is killed and replaced by swarm while the job goes on. ``stack rm`` and ``swarm leave`` must
leave no container, network or bridge behind.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .procs import ROOT
from .test_compose_real import _accuracies, image  # noqa: F401 - image is a fixture

pytestmark = pytest.mark.docker

STACK_FILE = ROOT / "deploy" / "stack.yml"
EPOCHS = 30
EPOCH = re.compile(r"epoch (\d+)/(\d+): (\d+) trainers took part: (\S.*?) \(loss")


def _docker(
    *args: str, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, input=input
    )


def _ok(*args: str, timeout: float = 60) -> str:
    done = _docker(*args, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _bridges() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10
    ).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
    return {n for n in names if n.startswith(("docker", "br-", "vx-"))}


def _networks() -> set[str]:
    return set(_ok("network", "ls", "--format", "{{.Name}}").split())


class Stack:
    """A deployment of deploy/stack.yml under its own name."""

    def __init__(self, **env: str) -> None:
        self.name = f"gwt{secrets.token_hex(2)}"
        self.env = {**os.environ, **env}

    def deploy(self) -> None:
        done = subprocess.run(
            ["docker", "stack", "deploy", "--resolve-image", "never"]
            + ["-c", str(STACK_FILE), self.name],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def service(self, name: str) -> str:
        return f"{self.name}_{name}"

    def logs(self, name: str) -> str:
        done = _docker("service", "logs", "--raw", "--no-trunc", self.service(name), timeout=60)
        return done.stdout + done.stderr

    def job(self, name: str, seconds: int) -> subprocess.CompletedProcess[str]:
        """deploy/stack-job.sh: waits for the service's task, exits with its code."""
        return subprocess.run(
            ["bash", str(ROOT / "deploy" / "stack-job.sh"), "--timeout", str(seconds)]
            + [self.service(name)],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )

    def containers(self, name: str) -> list[dict[str, Any]]:
        label = f"label=com.docker.swarm.service.name={self.service(name)}"
        ids = _ok("ps", "-a", "-q", "--filter", label).split()
        return list(json.loads(_ok("inspect", *ids))) if ids else []

    def remove(self) -> None:
        _docker("stack", "rm", self.name, timeout=120)
        deadline = time.monotonic() + 90
        label = f"label=com.docker.stack.namespace={self.name}"
        while time.monotonic() < deadline:
            left = _docker("ps", "-a", "-q", "--filter", label, timeout=30).stdout.split()
            nets = [n for n in _networks() if n.startswith(f"{self.name}_")]
            if not left and not nets:
                return
            time.sleep(1)
        raise AssertionError(f"stack {self.name} left containers or networks behind")


@pytest.fixture(scope="module")
def swarm(image: str) -> Iterator[str]:  # noqa: F811
    """A single-node swarm on the test engine and the token secret; left with nothing behind."""
    state = _ok("info", "--format", "{{.Swarm.LocalNodeState}}").strip()
    if state != "inactive":
        pytest.skip(f"the engine is already in a swarm ({state}): this test makes its own")
    bridges, networks = _bridges(), _networks()
    _ok("swarm", "init", "--advertise-addr", "127.0.0.1")
    try:
        done = _docker("secret", "create", "gradwire-token", "-", input=secrets.token_hex(16))
        assert done.returncode == 0, done.stderr
        yield image
    finally:
        _docker("secret", "rm", "gradwire-token", timeout=60)
        left = _docker("swarm", "leave", "--force", timeout=120)
        # swarm's own bridge outlives the swarm: remove it when this test's swarm made it
        if "docker_gwbridge" not in networks:
            _docker("network", "rm", "docker_gwbridge", timeout=60)
    assert left.returncode == 0, left.stderr
    assert _networks() == networks, (networks, _networks())
    assert _bridges() == bridges, (bridges, _bridges())


def _running(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [c for c in stack.containers(name) if c["State"]["Running"]]


def _epochs(log: str) -> list[tuple[int, list[str]]]:
    return [(int(m[0]), m[3].split(", ")) for m in EPOCH.findall(log)]


def _wait(what: str, seconds: float, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {seconds:.0f} s"
        time.sleep(1)


@pytest.mark.timeout(900)
def test_stack_runs_the_demo_scales_replaces_a_killed_trainer_and_leaves_nothing(
    swarm: str,
) -> None:
    stack = Stack(
        GRADWIRE_EPOCHS=str(EPOCHS), GRADWIRE_EPOCH_SECONDS="1.5", GRADWIRE_SHUTDOWN_TIMEOUT="20"
    )
    started = time.monotonic()
    stack.deploy()
    try:
        # -- the fixed cluster: the demo's job, its outcome read from the stack ------------------
        job = stack.job("trainer0", 300)
        log = stack.logs("trainer0")
        assert job.returncode == 0, job.stdout + job.stderr + log[-4000:]
        assert f"{stack.service('trainer0')}: complete, exit code 0" in job.stdout
        acc = _accuracies(log)
        assert set(acc) == {"trainer0", "trainer1"} and min(acc.values()) >= 0.90, acc
        demo_s = time.monotonic() - started
        for name in ("ps", "trainer1", "worker3"):  # the workers left with the job
            assert stack.job(name, 60).returncode == 0, stack.logs(name)[-3000:]
        for c in stack.containers("ps"):
            host, config = c["HostConfig"], c["Config"]
            assert host["ReadonlyRootfs"] is True and host["CapDrop"] in (["ALL"], ["all"])
            assert config["User"] == "10001:10001"
            assert not host["PortBindings"]  # inspection stays private
            assert not [e for e in config["Env"] if e.startswith("GRADWIRE_TOKEN=")]

        # -- the elastic job: inspect inside, scale 2 -> 3, kill one, swarm replaces it ----------
        def epochs_with(n: int, after: int = 0) -> Callable[[], bool]:
            return lambda: any(e > after and len(t) == n for e, t in _epochs(stack.logs("elastic")))

        _wait("epoch with 2 trainers", 120, epochs_with(2))
        (host,) = _running(stack, "elastic")
        inspected = _ok("exec", str(host["Id"]), "gradwire", "inspect", "--json")
        info = json.loads(inspected)
        assert info["worker"] == "elastic" and len(info["peers"]) >= 2, info
        _ok("service", "scale", "--detach", f"{stack.service('trainer')}=3", timeout=120)
        _wait("epoch with 3 trainers", 120, epochs_with(3))
        victim = _running(stack, "trainer")[0]
        victim_name = f"trainer-{victim['Config']['Hostname']}"
        _ok("kill", str(victim["Id"]))
        killed_at = time.monotonic()

        def replaced() -> bool:
            ids = {c["Id"] for c in _running(stack, "trainer")}
            return len(ids) == 3 and victim["Id"] not in ids

        _wait("replacement of the killed trainer", 90, replaced)
        replaced_s = time.monotonic() - killed_at
        elastic = stack.job("elastic", 300)
        log = stack.logs("elastic")
        assert elastic.returncode == 0, elastic.stdout + log[-4000:]
        # the job went on: every epoch ran, the killed trainer is named, a new one joined
        assert [e for e, _ in _epochs(log)] == list(range(1, EPOCHS + 1)), log[-4000:]
        assert re.search(rf"worker '{victim_name}' is lost", log), log[-4000:]
        names = {n for _, t in _epochs(log) for n in t}
        joined = set(re.findall(r"worker '(trainer-[0-9a-f]{12})' \(rank \d+\) joined", log))
        assert victim_name in names and len(joined - {victim_name}) >= 3, (names, joined)
        assert "elastic job: test accuracy" in log, log[-4000:]
        # the trainers left with the job (the killed one failed with 137, SIGKILL)
        _wait("the trainers' exit", 60, lambda: not any(_running(stack, "trainer")))
        codes = [c["State"]["ExitCode"] for c in stack.containers("trainer")]
        assert sorted(codes) == [0, 0, 0, 137], codes
        print(
            f"swarm stack: demo job {demo_s:.1f} s, killed trainer replaced in {replaced_s:.1f} s, "
            f"elastic job done at {time.monotonic() - started:.1f} s; "
            f"trainers per epoch {[len(t) for _, t in _epochs(log)]}"
        )
    finally:
        stack.remove()
