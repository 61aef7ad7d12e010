"""`.ci/find_python`, which finds each CI leg's interpreter, and `.ci/run`'s rule for a missing one.

The finder runs on fake trees: a pyenv shim on PATH that is not the active version (it exits 127,
as pyenv's does), pyenv's versions directory holding the real one, and nothing at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINDER = ROOT / ".ci" / "find_python"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _fake_python(path: Path, exit_code: int) -> Path:
    """An executable that answers any version check with ``exit_code`` (0: it is the version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


def _find(version: str, tmp_path: Path, *, pyenv_root: Path | None = None):
    """Run the finder with PATH = tmp_path/bin plus the system's tools, HOME = tmp_path/home."""
    system = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{system}", "HOME": str(tmp_path / "home")}
    if pyenv_root is not None:
        env["PYENV_ROOT"] = str(pyenv_root)
    return subprocess.run(["bash", str(FINDER), version], env=env, capture_output=True,
                          text=True)


def test_a_pyenv_shim_that_fails_is_passed_over_for_pyenvs_installed_version(tmp_path):
    # 3.99: a version no real machine has, so /usr/bin cannot answer for it.
    _fake_python(tmp_path / "bin" / "python3.99", 127)          # the shim: not active
    root = tmp_path / "pyenv"
    _fake_python(root / "versions" / "3.99.2" / "bin" / "python3.99", 0)
    newest = _fake_python(root / "versions" / "3.99.13" / "bin" / "python3.99", 0)
    _fake_python(root / "versions" / "3.990.1" / "bin" / "python3.99", 0)   # not 3.99.*
    done = _find("3.99", tmp_path, pyenv_root=root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(newest)       # newest patch first: 3.99.13, not 3.99.2


def test_pyenv_under_home_is_found_without_pyenv_root(tmp_path):
    found = _fake_python(tmp_path / "home" / ".pyenv" / "versions" / "3.99.0" / "bin"
                         / "python3.99", 0)
    done = _find("3.99", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(found)


def test_a_working_interpreter_on_path_comes_first(tmp_path):
    on_path = _fake_python(tmp_path / "bin" / "python3.99", 0)
    _fake_python(tmp_path / "pyenv" / "versions" / "3.99.1" / "bin" / "python3.99", 0)
    done = _find("3.99", tmp_path, pyenv_root=tmp_path / "pyenv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(on_path)


def test_none_found_fails_and_names_where_it_looked(tmp_path):
    _fake_python(tmp_path / "bin" / "python3.99", 127)
    _fake_python(tmp_path / "pyenv" / "versions" / "3.99.1" / "bin" / "python3.99", 1)  # broken
    done = _find("3.99", tmp_path, pyenv_root=tmp_path / "pyenv")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "no working Python 3.99" in done.stderr
    assert str(tmp_path / "pyenv" / "versions" / "3.99.1" / "bin" / "python3.99") in done.stderr


def test_a_malformed_version_is_refused(tmp_path):
    done = _find("3", tmp_path)
    assert done.returncode == 2
    assert "expected a version" in done.stderr


def test_the_running_interpreter_s_version_is_found_and_is_that_version(tmp_path):
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    done = subprocess.run(["bash", str(FINDER), version], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this Python ({sys.executable}) is not where the finder looks: "
                    f"{done.stderr.strip()}")
    out = subprocess.run([done.stdout.strip(), "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tuple(sys.version_info[:2]))


def _run_ci_without_pythons(tmp_path: Path, allow: str | None):
    """``.ci/run`` copied into a tree whose finder finds nothing: what it does first."""
    tree = tmp_path / "tree"
    (tree / ".ci").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / ".ci" / "run", tree / ".ci" / "run")
    _fake_python(tree / ".ci" / "find_python", 1)          # no interpreter anywhere
    # python3 itself is a stub that fails: the run must stop before it, or at it.
    _fake_python(tmp_path / "bin" / "python3", 3)
    system = os.pathsep.join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{system}", "HOME": str(tmp_path)}
    if allow is not None:
        env["SIMSCHED_CI_ALLOW_MISSING_PYTHON"] = allow
    return subprocess.run(["bash", str(tree / ".ci" / "run")], env=env, capture_output=True,
                          text=True, cwd=tree)


def test_ci_fails_when_the_oldest_python_is_missing(tmp_path):
    done = _run_ci_without_pythons(tmp_path, None)
    assert done.returncode == 1
    assert "FAILED: no Python 3.10" in done.stderr
    assert "skipped" not in done.stdout


def test_ci_skips_a_missing_python_only_when_told(tmp_path):
    done = _run_ci_without_pythons(tmp_path, "3.10")
    assert "python3.10 not found: leg skipped" in done.stdout
    assert "FAILED: no Python 3.13" in done.stderr       # 3.13 was not allowed to be missing
    assert done.returncode == 1
    done = _run_ci_without_pythons(tmp_path, "3.10,3.13")
    assert "python3.13 not found: leg skipped" in done.stdout
    assert "FAILED" not in done.stderr
    assert done.returncode != 0                          # it went on, to the failing python3 stub
