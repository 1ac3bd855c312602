"""gradwire-worker and gradwire run as real processes: join, serve, leave, signals, exit codes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from .procs import ROOT, free_port, run, start, wait_until, worker_env

JOB = str(ROOT / "deploy" / "jobs" / "ping_all.py")


def _cluster_env(port: int, world: int, **extra: str) -> dict[str, str]:
    return worker_env(
        GRADWIRE_WORLD_SIZE=str(world),
        GRADWIRE_MASTER_ADDR="127.0.0.1",
        GRADWIRE_MASTER_PORT=str(port),
        GRADWIRE_TOKEN="deploy-test-token",
        GRADWIRE_INIT_TIMEOUT="30",
        GRADWIRE_SHUTDOWN_TIMEOUT="20",
        **extra,
    )


def test_workers_serve_a_driver_job_and_leave_with_it() -> None:
    port = free_port()
    workers = [
        start("worker", env=_cluster_env(port, 3, GRADWIRE_NAME=f"w{r}", GRADWIRE_RANK=str(r)))
        for r in (1, 2)
    ]
    try:
        driver = run(
            "run",
            JOB,
            env=_cluster_env(port, 3, GRADWIRE_NAME="driver", GRADWIRE_RANK="0"),
            timeout=60,
        )
        assert driver.popen.returncode == 0, driver.output
        assert "ping_all: 2 workers answered: w1, w2" in driver.out
        # One host: the fast lane's Unix socket; the 1 MiB tensors went by shared memory.
        assert "fast lane to 2 of 2 workers, bulk lane sent 0 and took 0" in driver.out
        for w in workers:
            # --until job (the default): they leave once the driver reached the barrier.
            assert w.finish(30) == 0, w.output
            assert "joined session" in w.err and "leaving with the job: done" in w.err
    finally:
        for w in workers:
            w.kill()


def test_sigterm_shuts_a_signal_worker_down_gracefully_with_its_job_peer() -> None:
    port = free_port()
    server = start(
        "worker",
        env=_cluster_env(port, 2, GRADWIRE_NAME="ps", GRADWIRE_RANK="0", GRADWIRE_UNTIL="signal"),
    )
    other = start("worker", env=_cluster_env(port, 2, GRADWIRE_NAME="w1", GRADWIRE_RANK="1"))
    try:
        env = _cluster_env(port, 2)

        def serving() -> bool:
            return run("health", f"127.0.0.1:{port}", env=env, timeout=20).popen.returncode == 0

        wait_until(serving, 30, "ps to report SERVING")
        assert other.popen.poll() is None  # waits at the barrier for ps
        started = time.monotonic()
        server.signal(signal.SIGTERM)
        assert server.finish(30) == 0, server.output
        assert other.finish(30) == 0, other.output
        assert time.monotonic() - started < 20
        assert "graceful shutdown: done" in server.err
        gone = run("health", f"127.0.0.1:{port}", "--timeout", "2", env=env, timeout=20)
        assert gone.popen.returncode == 1 and "UNAVAILABLE" in gone.err
    finally:
        server.kill()
        other.kill()


def _wait_live(port: int, env: dict[str, str]) -> None:
    """Until the worker on ``port`` answers health checks (SERVING or not)."""
    wait_until(
        lambda: run("health", "--live", f"127.0.0.1:{port}", env=env).popen.returncode == 0,
        30,
        f"the worker on port {port} to answer health checks",
    )


def test_health_is_not_serving_while_joining_but_live() -> None:
    port = free_port()
    lonely = start("worker", env=_cluster_env(port, 2, GRADWIRE_NAME="ps", GRADWIRE_RANK="0"))
    try:
        env = _cluster_env(port, 2)
        _wait_live(port, env)
        strict = run("health", f"127.0.0.1:{port}", env=env)
        assert strict.popen.returncode == 1 and "NOT_SERVING" in strict.out
        # The address also comes from $GRADWIRE_LISTEN (the Docker HEALTHCHECK form).
        local = run("health", "--live", env={**env, "GRADWIRE_LISTEN": f"0.0.0.0:{port}"})
        assert local.popen.returncode == 0 and f"127.0.0.1:{port}: NOT_SERVING" in local.out
        # --rendezvous (the container health check): rank 0 hosting its rendezvous is healthy
        hosting = run("health", "--rendezvous", f"127.0.0.1:{port}", env=env)
        assert hosting.popen.returncode == 0, hosting.output
        assert "NOT_SERVING (hosting the rendezvous)" in hosting.out
        lonely.signal(signal.SIGINT)  # stopped before the cluster formed
        assert lonely.finish(30) == 128 + signal.SIGINT, lonely.output
    finally:
        lonely.kill()


def test_health_rendezvous_is_healthy_for_a_waiting_rank_0_only() -> None:
    port, other = free_port(), free_port()
    env = _cluster_env(port, 3)
    host = start("worker", env=_cluster_env(port, 3, GRADWIRE_NAME="ps", GRADWIRE_RANK="0"))
    member = start(
        "worker",
        env=_cluster_env(
            port, 3, GRADWIRE_NAME="w1", GRADWIRE_RANK="1", GRADWIRE_LISTEN=f"127.0.0.1:{other}"
        ),
    )
    try:
        _wait_live(other, env)
        joined = run("health", "--rendezvous", f"127.0.0.1:{other}", env=env)  # waits for rank 2
        assert joined.popen.returncode == 1 and joined.out.strip().endswith(": NOT_SERVING")
        last = run(
            "run",
            str(JOB),
            env=_cluster_env(port, 3, GRADWIRE_NAME="driver", GRADWIRE_RANK="2"),
            timeout=60,
        )
        assert last.popen.returncode == 0, last.output
        for w in (host, member):
            assert w.finish(30) == 0, w.output
    finally:
        host.kill()
        member.kill()


def test_bad_configuration_exits_2_with_the_variable_named() -> None:
    p = run("worker", env=worker_env(GRADWIRE_NAME="w", GRADWIRE_RANK="x", GRADWIRE_WORLD_SIZE="2"))
    assert p.popen.returncode == 2
    assert "GRADWIRE_RANK='x': not an integer" in p.err
    p = run("worker", "--name", "bad name!", "--rank", "0", "--world-size", "1", env=worker_env())
    assert p.popen.returncode == 2 and "--name='bad name!'" in p.err


def test_a_rendezvous_that_never_completes_exits_3() -> None:
    env = _cluster_env(free_port(), 2, GRADWIRE_NAME="w1", GRADWIRE_RANK="1")
    p = run("worker", "--init-timeout", "2", env=env, timeout=30)
    assert p.popen.returncode == 3, p.output
    assert "cannot join the cluster" in p.err and "rendezvous" in p.err


def _solo(**extra: str) -> dict[str, str]:
    return _cluster_env(free_port(), 1, GRADWIRE_NAME="driver", GRADWIRE_RANK="0", **extra)


def test_run_targets_and_exit_codes(tmp_path: Path) -> None:
    ok = tmp_path / "job_ok.py"
    ok.write_text(
        "import sys\nfrom gradwire.distributed import rpc\n"
        "def main():\n    print('job on', rpc.get_worker_info().name, sys.argv[1:])\n    return 0\n"
    )
    p = run("run", str(ok), "a", "--b", env=_solo())
    assert p.popen.returncode == 0, p.output
    assert "job on driver ['a', '--b']" in p.out

    script = tmp_path / "plain.py"
    script.write_text(
        "if __name__ == '__main__':\n    print('ran as main')\n    raise SystemExit(4)\n"
    )
    p = run("run", str(script), env=_solo())
    assert p.popen.returncode == 4 and "ran as main" in p.out, p.output

    boom = tmp_path / "boom.py"
    boom.write_text("def main():\n    raise ValueError('job failed here')\n")
    p = run("run", str(boom), env=_solo())
    assert p.popen.returncode == 1 and "ValueError: job failed here" in p.err, p.output

    p = run("run", "gradwire.distributed.rpc:get_worker_info", env=_solo())
    assert p.popen.returncode == 0, p.output  # a module:function target (returns no int)

    p = run("run", str(tmp_path / "missing.py"), env=_solo())
    assert p.popen.returncode == 2 and "no such script" in p.err
    p = run("run", "gradwire.nope:main", env=_solo())
    assert p.popen.returncode == 2 and "cannot import 'gradwire.nope'" in p.err


def test_rref_rounds_job_forks_fetches_and_trains_across_three_workers() -> None:
    # The job behind the RRef output in docs/inspect.md, end to end with the real CLI.
    port = free_port()
    workers = [
        start("worker", env=_cluster_env(port, 3, GRADWIRE_NAME=f"w{r}", GRADWIRE_RANK=str(r)))
        for r in (1, 2)
    ]
    try:
        driver = run(
            "run",
            str(ROOT / "deploy" / "jobs" / "rref_rounds.py"),
            "3",
            "0",
            env=_cluster_env(port, 3, GRADWIRE_NAME="driver", GRADWIRE_RANK="0"),
            timeout=90,
        )
        assert driver.popen.returncode == 0, driver.output
        for i in (1, 2, 3):
            assert f"rref_rounds: round {i}: UserRRef(" in driver.out, driver.out
        assert "owned by w1, fetched by w2" in driver.out
        for w in workers:
            assert w.finish(30) == 0, w.output
    finally:
        for w in workers:
            w.kill()


def _compose_cluster_env() -> dict[str, str]:
    """The x-cluster environment of docker-compose.yml (what every container gets)."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return {k: str(v) for k, v in compose["x-cluster"].items() if k.startswith("GRADWIRE_")}


def test_the_demo_job_runs_on_cli_workers_with_the_compose_environment() -> None:
    # The compose cluster runs gradwire.demo:job on gradwire-worker processes: their policy
    # must allow the demo's functions (an installed package, so not "the program's own code").
    allow = _compose_cluster_env()["GRADWIRE_ALLOW"]
    assert "gradwire.demo.*" in allow.split(",")
    port = free_port()
    names = ["ps", "trainer1"]
    workers = [
        start(
            "worker",
            env=_cluster_env(port, 3, GRADWIRE_NAME=n, GRADWIRE_RANK=str(r), GRADWIRE_ALLOW=allow),
        )
        for n, r in zip(names, (0, 2))
    ]
    try:
        driver = run(
            "run",
            "gradwire.demo:job",
            env=_cluster_env(
                port, 3, GRADWIRE_NAME="trainer0", GRADWIRE_RANK="1", GRADWIRE_ALLOW=allow
            ),
            timeout=180,
        )
        assert driver.popen.returncode == 0, driver.output
        assert "test accuracy" in driver.out, driver.output
        for w in workers:
            assert w.finish(60) == 0, w.output
    finally:
        for w in workers:
            w.kill()


def test_a_worker_serving_until_the_job_ends_reports_serving_meanwhile() -> None:
    # gradwire-worker --until job enters the shutdown barrier at once and serves from there:
    # health checks (a Kubernetes readiness probe, `gradwire health`) must see SERVING until
    # the job ends, not NOT_SERVING for the whole job (found by running compose for real).
    port = free_port()
    worker = start("worker", env=_cluster_env(port, 2, GRADWIRE_NAME="ps", GRADWIRE_RANK="0"))
    rounds = str(ROOT / "deploy" / "jobs" / "autograd_rounds.py")
    driver = start(
        "run",
        rounds,
        "140",
        "0.05",
        env=_cluster_env(port, 2, GRADWIRE_NAME="driver", GRADWIRE_RANK="1"),
    )
    try:
        env = _cluster_env(port, 2)

        def status() -> str:
            return run("health", f"127.0.0.1:{port}", env=env).out.strip()

        wait_until(lambda: status().endswith(": SERVING"), 30, "ps to join and serve")
        statuses = [status() for _ in range(3)]  # inside the ~8 s job: each sees SERVING
        assert driver.popen.poll() is None  # the job is still running
        assert all(s.endswith(": SERVING") for s in statuses), statuses
        assert driver.finish(120) == 0, driver.output
        assert worker.finish(30) == 0, worker.output
    finally:
        driver.kill()
        worker.kill()
