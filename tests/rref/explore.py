"""Exhaustive exploration of every interleaving of a small scripted scenario on ``SimNet``.

A scenario gives each worker a script: steps run in order, each when its guard holds (e.g.
"drop the RRef once it has arrived"). At every point the explorer may run any worker's next
step or deliver any message in flight in any fault mode the net allows (normal, lost and
retried, processed with a stale copy left behind). It walks the whole tree of choices
depth-first by re-executing prefixes from scratch (the protocol objects hold locks, so they are
rebuilt rather than copied), pruning states already seen. Every reachable state is checked for
safety by the net itself; every final state must be leak-free with all scripts finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gradwire._compat import add_note

from .simnet import Faults, Mode, SafetyViolation, SimNet

__all__ = ["Step", "Scenario", "ExploreStats", "explore"]


@dataclass(frozen=True)
class Step:
    """One step of a worker's script."""

    action: Callable[[SimNet], None]
    guard: Callable[[SimNet], bool] = lambda net: True
    label: str = ""


@dataclass
class Scenario:
    """A net plus one script per worker and how far each has run."""

    net: SimNet
    scripts: dict[int, list[Step]]
    progress: dict[int, int] = field(default_factory=dict)

    def choices(self) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for w, script in self.scripts.items():
            i = self.progress.get(w, 0)
            if i < len(script) and script[i].guard(self.net):
                out.append(("step", w))
        out.extend(("deliver", i, mode) for i, mode in self.net.choices())
        return out

    def apply(self, choice: tuple[object, ...]) -> None:
        if choice[0] == "step":
            w = choice[1]
            assert isinstance(w, int)
            i = self.progress.get(w, 0)
            self.scripts[w][i].action(self.net)
            self.progress[w] = i + 1
        else:
            index, mode = choice[1], choice[2]
            assert isinstance(index, int) and isinstance(mode, Mode)
            self.net.deliver(index, mode)
        self.net.raise_failures()

    def finished(self) -> bool:
        return all(self.progress.get(w, 0) == len(s) for w, s in self.scripts.items())

    def key(self) -> tuple[object, ...]:
        return (self.net.state_key(), tuple(sorted(self.progress.items())))


@dataclass
class ExploreStats:
    states: int = 0
    final_states: int = 0
    edges: int = 0
    max_depth: int = 0


def explore(
    build: Callable[[Faults], Scenario], faults: Faults, max_states: int = 200_000
) -> ExploreStats:
    """Visit every state reachable by ``build(faults)``'s scenario; raise on any violation."""
    stats = ExploreStats()
    seen: set[tuple[object, ...]] = set()
    path: list[tuple[object, ...]] = []

    def replay() -> Scenario:
        scenario = build(faults)
        for choice in path:
            scenario.apply(choice)
        return scenario

    def visit(scenario: Scenario) -> None:
        key = scenario.key()
        if key in seen:
            return
        seen.add(key)
        stats.states += 1
        stats.max_depth = max(stats.max_depth, len(path))
        if stats.states > max_states:
            raise AssertionError(f"more than {max_states} states")
        choices = scenario.choices()
        if not choices:
            if not scenario.finished():
                raise SafetyViolation(f"stuck before the scripts finished after {path}")
            stats.final_states += 1
            scenario.net.check_no_leak()
            return
        stats.edges += len(choices)
        for i, choice in enumerate(choices):
            # The first child continues on this scenario; the others are rebuilt by replay.
            child = scenario if i == 0 else replay()
            path.append(choice)
            try:
                child.apply(choice)
                visit(child)
            except Exception as exc:
                if not getattr(exc, "schedule_noted", False):
                    add_note(exc, f"schedule: {path}")
                    exc.schedule_noted = True  # type: ignore[attr-defined]
                raise
            finally:
                path.pop()

    visit(build(faults))
    return stats
