"""Installing vigil is quiet, and the wheel carries its data (issue 26, part 6).

The README's first command installs vigil editable (scripts/bootstrap.sh); the Docker image
installs it as a wheel. setuptools warns, at length, about every importable directory that
``packages`` leaves out (``streams.samples``, ``streams.console.static``): a newcomer's first
screen was a hundred lines of them. These tests build the way the scripts and the image do,
with pip, and hold the output to nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
#: what a build touches besides pip's own network: a pip run may take a while on a cold cache
PIP_TIMEOUT_S = 300


def _package_dir(package: str) -> Path:
    mapped = SETUPTOOLS.get("package-dir", {})
    for prefix in sorted(mapped, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            rest = package[len(prefix) :].lstrip(".").split(".") if package != prefix else []
            return ROOT / mapped[prefix] / Path(*rest) if rest else ROOT / mapped[prefix]
    return ROOT / Path(*package.split("."))


def _importable_dirs(top: str) -> set[str]:
    """Every directory under ``top`` Python could import as a package (a valid identifier
    holding files), by dotted name: what setuptools checks ``packages`` against."""
    out = set()
    for path in (ROOT / top).rglob("*"):
        rel = path.relative_to(ROOT)
        if (
            path.is_dir()
            and all(part.isidentifier() for part in rel.parts)
            and any(p.is_file() and p.suffix != ".pyc" for p in path.iterdir())
        ):
            out.add(".".join(rel.parts))
    return out | {top}


def test_every_importable_directory_is_a_declared_package() -> None:
    declared = set(SETUPTOOLS["packages"])
    for top in ("streams", "vigil_worker"):
        missing = sorted(_importable_dirs(top) - declared)
        assert not missing, f"importable but absent from pyproject's packages: {missing}"
    for package in declared:
        assert _package_dir(package).is_dir(), package


def test_every_data_file_of_a_package_is_package_data() -> None:
    """A file that is not Python in a declared package is matched by its package-data
    patterns, or the wheel (and the image) would silently lack it."""
    data = SETUPTOOLS.get("package-data", {})
    for package in SETUPTOOLS["packages"]:
        patterns = data.get(package, [])
        for path in _package_dir(package).iterdir():
            if path.is_file() and path.suffix not in (".py", ".pyc", ".typed"):
                assert any(path.match(p) for p in patterns), f"{package}: {path.name}"


def _source_copy(tmp: Path) -> Path:
    """The files a build reads, copied: a build writes ``build/`` and ``*.egg-info`` into the
    tree it builds, and scripts/test-pythons.sh runs these tests on two Pythons at once."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("streams", "schemas", "vigil_worker"):
        shutil.copytree(
            ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    return src


def _pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        check=False,
        cwd=ROOT,
        env=os.environ | (env or {}),
    )


def test_the_wheel_builds_quietly_with_schemas_samples_and_static_files(tmp_path: Path) -> None:
    """As the Dockerfile builds it: ``pip wheel --no-deps`` of the project, nothing printed,
    and the files the runtime reads through importlib.resources inside."""
    src = _source_copy(tmp_path)
    proc = _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path), str(src))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).strip() == ""
    (wheel,) = tmp_path.glob("vigil-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for directory, source in (
        ("streams/contracts/schemas", ROOT / "schemas"),
        ("streams/samples", ROOT / "streams" / "samples"),
        ("streams/console/static", ROOT / "streams" / "console" / "static"),
    ):
        files = {p.name for p in source.iterdir() if p.is_file() and p.suffix != ".py"}
        assert files, directory
        assert {f"{directory}/{name}" for name in files} <= names, directory


def _bootstrap_filter() -> str:
    """The warning filter scripts/bootstrap.sh sets for its editable install."""
    found = re.search(r'PYTHONWARNINGS="([^"]+)"', (ROOT / "scripts" / "bootstrap.sh").read_text())
    assert found, "scripts/bootstrap.sh sets no PYTHONWARNINGS for its pip install"
    return found.group(1)


def test_both_install_scripts_filter_the_same_notice_only() -> None:
    """The filter names one message, not a category: any other warning still shows."""
    value = _bootstrap_filter()
    action, message, category = value.split(":")
    assert (action, category) == ("ignore", "UserWarning") and message.strip()
    assert f'PYTHONWARNINGS="{value}"' in (ROOT / "scripts" / "test-pythons.sh").read_text()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="pip --python needs a venv python")
def test_the_editable_install_of_bootstrap_prints_nothing(tmp_path: Path) -> None:
    """bootstrap.sh's editable install, into a throwaway venv (without dependencies: their
    wheels print nothing), with the warning filter the script sets."""
    src = _source_copy(tmp_path)
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    proc = _pip(
        "--python",
        str(python),
        "install",
        "--quiet",
        "--no-deps",
        "-e",
        str(src),
        env={"PYTHONWARNINGS": _bootstrap_filter()},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).strip() == ""
    check = subprocess.run(
        [str(python), "-c", "import streams.contracts.schemas as s; print(s.__path__[0])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert Path(check.stdout.strip()).resolve() == src.resolve() / "schemas", check.stderr
