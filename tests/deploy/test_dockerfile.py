"""The Dockerfile, checked without a Docker engine: what it installs, copies and runs as."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.conftest import ROOT, SERVICES

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    rows = [line.strip() for line in joined.splitlines()]
    return [(r.split(None, 1)[0].upper(), r.split(None, 1)[1]) for r in rows
            if r and not r.startswith("#")]


def _final_stage() -> list[tuple[str, str]]:
    rows = _instructions()
    last_from = max(i for i, (op, _) in enumerate(rows) if op == "FROM")
    return rows[last_from:]


def _copied_sources() -> list[str]:
    sources: list[str] = []
    for op, args in _instructions():
        if op == "COPY" and not args.startswith("--from"):
            sources.extend(args.split()[:-1])
    return sources


def test_final_stage_runs_a_service_module_as_a_numeric_non_root_user() -> None:
    stage = _final_stage()
    users = [args for op, args in stage if op == "USER"]
    assert users, "the runtime stage must switch to a non-root USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    assert uid == "10001", "the Kubernetes manifests and compose run as uid 10001"
    cmd = [args for op, args in stage if op == "CMD"][-1]
    assert re.fullmatch(r'\["python", "-m", "services\.(\w+)"\]', cmd)
    assert re.search(r'"services\.(\w+)"', cmd).group(1) in SERVICES  # type: ignore[union-attr]
    assert not any(op == "HEALTHCHECK" for op, _ in stage), "Kubernetes probes over gRPC instead"


def test_dependencies_come_from_the_lockfile() -> None:
    installs = [args for op, args in _instructions() if op == "RUN" and "pip install" in args]
    assert any("-c requirements.lock" in args for args in installs)
    assert any(re.search(r"pip install --no-deps \.", args) for args in installs)
    pinned = {Requirement(line.split(";")[0]).name.lower().replace("_", "-")
              for line in (ROOT / "requirements.lock").read_text().splitlines()
              if line and not line.startswith((" ", "#", "-"))}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in project["dependencies"]:
        name = Requirement(dependency).name.lower().replace("_", "-")
        assert name in pinned, f"{name} is a runtime dependency with no pin in requirements.lock"


def _ignored(path: str, patterns: list[str]) -> bool:
    top = Path(path).parts[0]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(top, p.removeprefix("**/"))
               for p in patterns)


def test_copied_paths_exist_and_are_not_dockerignored() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for must_skip in (".git", ".venv", ".engram", "tests"):
        assert must_skip in patterns
    for source in _copied_sources():
        assert (ROOT / source).exists(), f"COPY {source}: no such path"
        assert not _ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"


@pytest.mark.slow
def test_the_copied_sources_build_a_wheel_with_every_service_and_its_migrations(
        tmp_path: Path) -> None:
    context = tmp_path / "context"
    for source in _copied_sources():
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, context / source)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                             "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
                             str(context)], capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    wheel, = (tmp_path / "dist").glob("engram-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for service in SERVICES:
        assert f"services/{service}/__main__.py" in names
        assert f"services/{service}/migrations/env.py" in names
        shipped = {n for n in names if n.startswith(f"services/{service}/migrations/versions/")}
        in_tree = {f"services/{service}/migrations/versions/{p.name}"
                   for p in (ROOT / "services" / service / "migrations" / "versions").glob("*.py")}
        assert in_tree <= shipped, f"{service}: migrations missing from the image"
        assert f"engram/{service}/v1/{service}_service_pb2.py" in names
    assert any(n.endswith("entry_points.txt") for n in names), "the engram CLI entry point"
