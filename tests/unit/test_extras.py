"""Each optional command runs with what its extra installs: ``pip install '.[mcp]'`` or
``'.[gateway]'``, as the README says, and nothing of the server extra.

Found by review (2026-11-30): both commands imported services.common.settings and tokens
(pydantic-settings, PyJWT, cryptography), which only the server extra installed, and stopped
with a ModuleNotFoundError traceback. The test imports each command's modules in a fresh
interpreter that refuses every installed distribution the extra and the base do not bring.
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _needed(extra: str) -> set[str]:
    """Distributions ``engram[extra]`` installs (as pyproject.toml says, not the metadata an
    earlier install left), the base and everything they require (installed metadata)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    wanted: list[tuple[str, frozenset[str]]] = [
        (Requirement(line).name, frozenset(Requirement(line).extras))
        for line in [*project["dependencies"], *project["optional-dependencies"][extra]]]
    seen: set[str] = {"engram"}
    while wanted:
        name, extras = wanted.pop()
        key = canonicalize_name(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a platform-specific requirement not installed here
        seen.add(key)
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            wanted_here = marker is None or any(marker.evaluate({"extra": e})
                                                for e in extras | {""})
            if wanted_here and canonicalize_name(requirement.name) not in seen:
                wanted.append((requirement.name, frozenset(requirement.extras)))
    return seen


def _refused_modules(extra: str) -> list[str]:
    """Top-level modules that only distributions outside ``engram[extra]`` provide."""
    needed = _needed(extra)
    return sorted(module for module, dists in metadata.packages_distributions().items()
                  if module.isidentifier()
                  and not any(canonicalize_name(d) in needed for d in dists))


@pytest.mark.parametrize(("extra", "modules"), [
    ("mcp", ["engram.cli.mcp", "engram.mcp_server"]),
    ("gateway", ["engram.cli.gateway", "engram.gateway"]),
])
def test_each_optional_command_imports_with_its_extra_alone(extra: str,
                                                           modules: list[str]) -> None:
    refused = _refused_modules(extra)
    if "sqlalchemy" in metadata.packages_distributions():  # the server extra is installed:
        assert "sqlalchemy" in refused  # the test does refuse what the extra does not bring
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, sys
        REFUSED = set({refused!r})
        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in REFUSED:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Refuse())
        for module in {modules!r}:
            importlib.import_module(module)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (f"engram[{extra}] lacks what its command imports:\n"
                                  + done.stderr[-2000:])
