"""The one way tests run the ``replication`` command: in this process, or in a process of its own.

In this process by default (fast); in a process of its own (``python -m replication.cli``) where a test needs
one: environment variables, a failpoint's kill -9, a command's own imports or a new process's timing."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from typing import NamedTuple

from support.repo import REPO


class CliResult(NamedTuple):
    """What a ``replication`` command did: its exit code, what it printed on stdout and on stderr."""

    code: int
    out: str
    err: str

    def jsonl(self) -> list[dict]:
        """stdout read as JSON lines (``replay``, ``sow``)."""
        return [json.loads(line) for line in self.out.splitlines()]


def argv(*args: object) -> list[str]:
    """The command line of ``replication <args>`` in a process of its own."""
    return [sys.executable, "-m", "replication.cli", *map(str, args)]


def run_cli(*args: object, env: dict[str, str | None] | None = None, process: bool = False,
            timeout: float = 600) -> CliResult:
    """Run ``replication <args>`` (paths are taken as they are) and wait for it.

    In this process by default: stdout (and ``stdout.buffer``, which ``replay`` and ``sow`` write) and stderr
    captured, a ``SystemExit`` (argparse's bad arguments) giving its code. In a process of its own when
    ``process`` is true or ``env`` is given: ``env`` is added to this process's environment (a ``None`` value
    removes the variable), the process gets a session of its own (a failpoint kills its whole process group,
    which must not be pytest's), and ``timeout`` bounds it.
    """
    if process or env is not None:
        environment = {**os.environ, **(env or {})}
        environment = {k: v for k, v in environment.items() if v is not None}
        done = subprocess.run(argv(*args), capture_output=True, text=True, timeout=timeout, env=environment,
                              cwd=REPO, start_new_session=True)
        return CliResult(done.returncode, done.stdout, done.stderr)

    from replication.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    # text streams with a .buffer, as a process's are: print() and .buffer.write() land in order
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse: bad arguments (2), --help (0)
            code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
        finally:
            stdout.flush()
            stderr.flush()
    return CliResult(code, out.getvalue().decode("utf-8", errors="replace"),
                     err.getvalue().decode("utf-8", errors="replace"))


def start_cli(*args: object) -> subprocess.Popen[str]:
    """``replication <args>`` started in a process of its own, its stdout and stderr piped (``--follow``)."""
    return subprocess.Popen(argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
