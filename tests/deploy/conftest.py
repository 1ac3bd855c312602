"""tests/deploy: the CLI commands as real processes, the deployment files, the netns cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .procs import TOKEN, free_port, run, start, wait_until, worker_env


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """driver (rank 0, running producer_job) and w1 (gradwire-worker); yields driver's address."""
    port = free_port()
    stop = tmp_path_factory.mktemp("inspect") / "stop"
    common = dict(
        GRADWIRE_WORLD_SIZE="2",
        GRADWIRE_MASTER_ADDR="127.0.0.1",
        GRADWIRE_MASTER_PORT=str(port),
        GRADWIRE_TOKEN=TOKEN,
        GRADWIRE_LOG_LEVEL="WARNING",
    )
    w1 = start("worker", env=worker_env(GRADWIRE_NAME="w1", GRADWIRE_RANK="1", **common))
    job = str(Path(__file__).with_name("producer_job.py"))
    driver = start(
        "run", job, str(stop), env=worker_env(GRADWIRE_NAME="driver", GRADWIRE_RANK="0", **common)
    )
    try:
        wait_until(
            lambda: run("health", f"127.0.0.1:{port}", env=worker_env()).popen.returncode == 0,
            30,
            "the cluster to form",
        )
        yield f"127.0.0.1:{port}"
    finally:
        stop.touch()
        codes = (driver.finish(30), w1.finish(30))
        driver.kill()
        w1.kill()
    assert codes == (0, 0), driver.output + w1.output
