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
