"""The distribution maps gradwire -> client/ and gradwire.server -> server/ completely."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def _import_names() -> set[str]:
    names = set()
    for folder, prefix in (("client", "gradwire"), ("server", "gradwire.server")):
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            names.add(".".join([prefix, *rel.parts]) if rel.parts else prefix)
    return names


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = _import_names() - listed
    assert not missing, (
        f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    )
    stale = listed - _import_names()
    assert not stale, f"listed in pyproject.toml but no folder with __init__.py: {sorted(stale)}"


def test_no_top_level_client_or_server_module_is_importable_from_site_packages() -> None:
    import gradwire
    import gradwire.server

    assert Path(gradwire.__file__).parent.name == "client"
    assert Path(gradwire.server.__file__).parent.name == "server"
    assert "client" not in sys.modules and "server" not in sys.modules


def test_the_claimed_pythons_start_at_the_floor_and_ci_tests_each() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: 3."
    minors = sorted(int(c[len(prefix) :]) for c in config["classifiers"] if c.startswith(prefix))
    floor = config["requires-python"]
    assert floor.startswith(">=3.") and minors, (floor, minors)
    assert minors[0] == int(floor[len(">=3.") :]), "the first classifier is requires-python's"
    assert minors == list(range(minors[0], minors[-1] + 1)), f"a gap in the claimed: {minors}"
    assert sys.version_info[:2] >= (3, minors[0])
    # CI runs every claimed Python through scripts/each_python.sh, which reads the classifiers.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/each_python.sh" in ci
    script = (ROOT / "scripts" / "each_python.sh").read_text()
    assert "Programming Language :: Python ::" in script
    # The README states the same floor.
    assert f"Python >= 3.{minors[0]}" in (ROOT / "README.md").read_text()
