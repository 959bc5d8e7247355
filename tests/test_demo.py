"""The README's first command: ./spark-submit.sh with no config runs the local demo."""

from __future__ import annotations

import subprocess

import pytest
from support.repo import REPO

pytestmark = pytest.mark.e2e  # a demo of two instances, in spark-submit.sh's processes


def test_demo_runs_and_persists_every_message(tmp_path):
    done = subprocess.run(
        [str(REPO / "spark-submit.sh"), "--messages", "500", "--rate", "1000", "--home", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo: publishing demo-amps-1, demo-amps-2" in done.stdout
    assert "[->amps-2 connected" in done.stdout and "[->amps-1 connected" in done.stdout
    for side in ("amps-1", "amps-2"):  # sync pair: persisted means both sides have it
        assert f"demo: demo-{side} persisted through 500" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
