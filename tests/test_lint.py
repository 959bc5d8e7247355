"""The linters CI runs, as tests: ruff over every Python folder of the project, mypy over the package.

They run inside the README's test command, so a fresh clone checks them with nothing else to remember."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_in_the_package_tests_benches_jobs_and_notebooks():
    done = run(str(BIN / "ruff"), "check", "--no-cache", "replication", "tests", "bench", "jobs", "notebooks")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_package(tmp_path):
    done = run(str(BIN / "mypy"), "--cache-dir", str(tmp_path / "mypy"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
