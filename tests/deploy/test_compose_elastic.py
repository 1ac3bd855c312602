"""docker compose for real, elastic: the scalable ``trainer`` service joins and leaves a job.

Marked ``docker`` like test_compose_real.py, whose image fixture and compose Project this
reuses (the image is built once per module; skipped with the reason where no engine answers).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from .test_compose_real import Project, image  # noqa: F401 - image is a fixture

pytestmark = pytest.mark.docker

#: Trainers at the peak of the job (issue 38: the elastic profile scaled to 16 and back).
PEAK = 16
EPOCHS = 120
EPOCH = re.compile(r"epoch (\d+)/(\d+): (\d+) trainers took part: (\S.*?) \(loss")


def _epochs(log: str) -> list[tuple[int, list[str]]]:
    """(epoch, trainers that took part) from the job's log, in order."""
    return [(int(m[0]), m[3].split(", ")) for m in EPOCH.findall(log)]


def _job_log(project: Project) -> str:
    return project.run("logs", "--no-color", "elastic", timeout=60).stdout


def _wait_for(project: Project, check: Callable[[str], bool], seconds: float, what: str) -> str:
    deadline = time.monotonic() + seconds
    while True:
        log = _job_log(project)
        if check(log):
            return log
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds:.0f} s:\n{log[-4000:]}")
        time.sleep(2)


def _scale(project: Project, n: int) -> None:
    args = ["up", "-d", "--no-deps", "--scale", f"trainer={n}", "trainer"]
    done = project.run(*args, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(1500)  # the image build (first test of the module) and 120 paced epochs
def test_trainers_scaled_2_16_2_mid_job_take_part_and_the_job_completes(image: str) -> None:  # noqa: F811
    project = Project(GRADWIRE_EPOCHS=str(EPOCHS), GRADWIRE_EPOCH_SECONDS="1.5")
    started = time.monotonic()
    try:
        up = project.run("up", "-d", "--scale", "trainer=2", "trainer", timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        # Only the elastic services: the fixed cluster is not started by naming the trainer.
        assert {
            c["Config"]["Labels"]["com.docker.compose.service"] for c in project.containers()
        } == {
            "elastic",
            "trainer",
        }

        def with_n(n: int, after: int = 0) -> Callable[[str], bool]:
            return lambda log: any(e > after and len(t) == n for e, t in _epochs(log))

        log = _wait_for(project, with_n(2), 240, "epoch with 2 trainers")
        _scale(project, PEAK)
        log = _wait_for(project, with_n(PEAK), 300, f"epoch with {PEAK} trainers")
        peak_at = max(e for e, t in _epochs(log) if len(t) == PEAK)
        _scale(project, 2)
        log = _wait_for(project, with_n(2, after=peak_at), 240, "epoch with 2 trainers again")

        def job_exited() -> bool:
            states = {
                c["Config"]["Labels"]["com.docker.compose.service"]: c["State"]
                for c in project.containers()
                if c["Config"]["Labels"]["com.docker.compose.service"] == "elastic"
            }
            return states["elastic"]["Status"] == "exited"

        deadline = time.monotonic() + 300
        while not job_exited():
            assert time.monotonic() < deadline, _job_log(project)[-4000:]
            time.sleep(2)
        log = _job_log(project)
        epochs = _epochs(log)
        assert [e for e, _ in epochs] == list(range(1, EPOCHS + 1)), log[-4000:]
        counts = [len(t) for _, t in epochs]
        first, last = counts.index(PEAK), len(counts) - 1 - counts[::-1].index(PEAK)
        assert 2 in counts[:first] and counts[-1] == 2 and 2 in counts[last + 1 :], counts
        names = {n for _, t in epochs for n in t}
        assert len(names) == PEAK, names  # that many distinct containers took part
        assert all(re.fullmatch(r"trainer-[0-9a-f]{12}", n) for n in names), names
        assert f"trainers that took part: {PEAK}:" in log, log[-4000:]
        assert "elastic job: test accuracy" in log, log[-4000:]
        # The job ended: the trainers left with it, every container exited cleanly.
        deadline = time.monotonic() + 60
        while {c["State"]["Status"] for c in project.containers()} != {"exited"}:
            assert time.monotonic() < deadline, [c["State"] for c in project.containers()]
            time.sleep(2)
        codes = {c["Name"]: c["State"]["ExitCode"] for c in project.containers()}
        assert set(codes.values()) == {0} and len(codes) == 3, codes
        print(
            f"elastic compose job: {time.monotonic() - started:.1f} s; trainers per epoch {counts}"
        )
    finally:
        project.run("--profile", "elastic", "down", "-v", "-t", "5", timeout=120)
        project.down()
