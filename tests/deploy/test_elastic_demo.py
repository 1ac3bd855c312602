"""The elastic demo without Docker: ``gradwire run gradwire.demo.elastic:job`` hosting a dynamic
group on loopback, and trainers (``python -m gradwire.demo.member``) joining and leaving mid-job."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

from .procs import PY, ROOT, free_port, worker_env

EPOCH = re.compile(r"epoch (\d+)/(\d+): (\d+) trainers took part: (\S.*?) \(loss")


class Lines:
    """A process whose output (stdout and stderr together) is collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, seconds: float) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while (m := re.search(pattern, self.text)) is None:
            if self.popen.poll() is not None:
                self._reader.join(10)
                if (m := re.search(pattern, self.text)) is not None:
                    return m
                raise AssertionError(f"exited without {pattern!r}:\n{self.text[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {seconds} s:\n{self.text[-4000:]}")
            time.sleep(0.1)
        return m

    def finish(self, seconds: float) -> int:
        try:
            code = self.popen.wait(seconds)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
            raise AssertionError(f"did not end within {seconds} s:\n{self.text[-4000:]}") from None
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)


def epochs(log: str) -> list[tuple[int, list[str]]]:
    return [(int(m[0]), m[3].split(", ")) for m in EPOCH.findall(log)]


def test_trainers_that_join_mid_job_take_part_from_the_next_epoch() -> None:
    port = free_port()
    common = dict(
        GRADWIRE_MASTER_ADDR="127.0.0.1",
        GRADWIRE_MASTER_PORT=str(port),
        GRADWIRE_TOKEN="elastic-test-token",
        GRADWIRE_ALLOW="gradwire.demo.*",
    )
    job = ["gradwire.demo.elastic:job", "--epochs", "14", "--min-trainers", "2"]
    host = Lines(
        [PY, "-m", "gradwire.cli", "run", *job, "--epoch-seconds", "0.5"],
        worker_env(GRADWIRE_NAME="ps", GRADWIRE_RANK="0", **common),
    )

    def member(name: str, **env: str) -> Lines:
        argv = [PY, "-m", "gradwire.demo.member"]
        return Lines(argv, worker_env(GRADWIRE_NAME=name, **common, **env))

    # The trainers have no rank: the group's host gives each the lowest free one at join.
    procs = [host, member("trainer-a"), member("trainer-b")]
    try:
        host.wait_for(r"epoch 2/14: 2 trainers", 60)
        joined_after = len(epochs(host.text))
        procs.append(member("trainer-c"))
        procs[-1].wait_for(r"trainer-c joined the group", 60)
        printed_at_join = len(epochs(host.text))
        host.wait_for(r"trainers took part: [^(]*trainer-c", 60)
        procs[1].popen.send_signal(signal.SIGTERM)  # trainer-a leaves mid-job
        assert procs[1].finish(60) == 0, procs[1].text[-3000:]
        gone_at = len(epochs(host.text))
        assert host.finish(120) == 0, host.text[-4000:]
        for p in procs[2:]:  # the host left: the trainers leave too
            assert p.finish(60) == 0, p.text[-3000:]
    finally:
        for p in procs:
            p.kill()
    log = host.text
    got = epochs(log)
    assert [e for e, _ in got] == list(range(1, 15)), log[-4000:]
    assert all(t == ["trainer-a", "trainer-b"] for _, t in got[:joined_after]), got
    # trainer-c took part from an epoch that started after it joined, and in every later one
    # (it did not leave); not in the epochs that had ended before it joined.
    with_c = [e for e, t in got if "trainer-c" in t]
    assert with_c and with_c[0] > printed_at_join, (printed_at_join, got)
    assert with_c == list(range(with_c[0], 15)), got
    # trainer-a left: it takes part in no epoch that started after it had gone.
    assert all("trainer-a" not in t for _, t in got[gone_at + 1 :]), (gone_at, got)
    assert got[-1][1] == ["trainer-b", "trainer-c"], got
    assert "trainers that took part: 3: trainer-a, trainer-b, trainer-c" in log, log[-3000:]
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", log)[1])  # type: ignore[index]
    assert accuracy > 0.8, log[-3000:]
    ranks = {
        p_name: int(re.search(rf"{p_name} joined the group with rank (\d+)", p.text)[1])  # type: ignore[index]
        for p_name, p in zip(("trainer-a", "trainer-b", "trainer-c"), procs[1:])
    }
    # a and b joined together (ranks 1 and 2 in either order); c later, while both were members.
    assert {ranks["trainer-a"], ranks["trainer-b"]} == {1, 2} and ranks["trainer-c"] == 3, ranks
