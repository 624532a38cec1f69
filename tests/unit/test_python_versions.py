"""Where the tool installs: Python 3.11-3.13 (3.12 by default), with pip (requirements.lock, the truth for
exact versions) or uv (uv.lock, made from it by scripts/sync-uv-lock): the three agree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
FIND_PYTHON = REPO / "scripts" / "find-python"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins() -> dict[str, str]:
    """Each pin's version, its environment marker (``; python_version >= '3.12'``) aside."""
    lines = (REPO / "requirements.lock").read_text().splitlines()
    return dict(
        (normalized(name), version.split(";")[0].strip())
        for name, version in (line.split("==") for line in lines if line[:1].isalnum())
    )


def test_requires_python_admits_311_to_313_and_312_is_the_default() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    admitted = SpecifierSet(project["project"]["requires-python"])
    assert [version for version in ("3.10", "3.11", "3.12", "3.13", "3.14") if version in admitted] == [
        "3.11",
        "3.12",
        "3.13",
    ]
    assert (REPO / ".python-version").read_text().strip() == "3.12"
    assert re.search(r"^PYTHON_VERSION \?= 3\.12$", (REPO / "Makefile").read_text(), re.M)


def test_uv_lock_holds_the_versions_of_requirements_lock() -> None:
    pins = lock_pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    constraints = project["tool"]["uv"]["constraint-dependencies"]
    pinned = {normalized(pin.split("==")[0]): pin.split("==")[1].split(";")[0].strip() for pin in constraints}
    assert pinned == pins
    locked = {
        normalized(package["name"]): package.get("version")
        for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]
    }
    assert {name: locked.get(name) for name in pins} == pins
    assert tomllib.loads((REPO / "uv.lock").read_text())["requires-python"].replace(" ", "") == ">=3.11,<3.14"


def find_python(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FIND_PYTHON), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


def test_find_python_finds_a_working_interpreter_of_the_version() -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = find_python(version)
    assert found.returncode == 0, found.stderr
    path = found.stdout.strip()
    ran = subprocess.run(
        [path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert ran.stdout.strip() == str(sys.version_info[:2])


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("3.9999",), {}, "no working Python 3.9999 found"),
        (("3.12",), {"PYTHON": "/bin/false"}, "PYTHON=/bin/false is not a working Python 3.12"),
    ],
)
def test_find_python_says_what_to_install(args, env, message) -> None:
    found = find_python(*args, **env)
    assert found.returncode == 1 and found.stdout == ""
    assert message in found.stderr
    if "PYTHON=" not in message:
        assert "pyenv install 3.9999" in found.stderr and "make setup PYTHON=" in found.stderr


@pytest.mark.skipif(shutil.which("uv") is None, reason="uv not on PATH (CI puts it there)")
def test_uv_lock_is_up_to_date_with_pyproject() -> None:
    """`uv lock --check`: uv.lock is what pyproject.toml (dependencies and the pins) resolves to."""
    checked = subprocess.run(
        ["uv", "lock", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_OFFLINE": "1"},
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
