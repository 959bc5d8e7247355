"""The README's first command: ./spark-submit.sh with no config runs the local demo."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_demo_runs_and_persists_every_message(tmp_path):
    done = subprocess.run(
        [str(REPO / "spark-submit.sh"), "--messages", "500", "--rate", "1000", "--home", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo: publishing demo-amps-1" in done.stdout
    assert "demo: demo-amps-1 persisted through 500" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
