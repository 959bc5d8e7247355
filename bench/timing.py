"""Where the benchmarks' time goes: wall time of chosen engine functions, CPU seconds by process, py-spy."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Names the call of a timed function from its arguments: ``labeler(*args, **kwargs) -> label``.
Labeler = Callable[..., str]


class PhaseTimer:
    """Wall time spent in chosen functions, by label, while :meth:`patched` is active.

    The wrapped functions keep their behaviour; the timer only adds up
    ``perf_counter`` differences (thread-safe) and counts calls.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.seconds.clear()
            self.calls.clear()

    def snapshot(self) -> tuple[dict[str, float], dict[str, int]]:
        with self._lock:
            return dict(self.seconds), dict(self.calls)

    @contextlib.contextmanager
    def patched(
        self, targets: dict[str, tuple[object, str]] | Sequence[tuple[object, str, Labeler]]
    ) -> Iterator[PhaseTimer]:
        """Time ``owner.attr`` for each target; restore on exit.

        Targets: ``{label: (owner, attr)}``, or ``(owner, attr, labeler)`` when
        the label depends on the call (which instance made it, say).
        """
        if isinstance(targets, dict):
            targets = [(owner, attr, _constant(label)) for label, (owner, attr) in targets.items()]
        originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]
        try:
            for owner, attr, labeler in targets:
                setattr(owner, attr, self._wrap(getattr(owner, attr), labeler))
            yield self
        finally:
            for owner, attr, original in originals:
                setattr(owner, attr, original)

    def _wrap(self, fn: Callable, labeler: Labeler) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                label = labeler(*args, **kwargs)
                with self._lock:
                    self.seconds[label] += spent
                    self.calls[label] += 1

        return timed


def _constant(label: str) -> Labeler:
    return lambda *_args, **_kwargs: label


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU seconds so far (user + system), from ``/proc``."""

    command: str
    """Its command line (empty unless asked for)."""
    own: float
    ended: float
    """Of its children that ended and were waited for (``cutime``/``cstime``)."""


def process_tree(root: int | None = None, *, commands: bool = False) -> dict[int, ProcessCpu]:
    """``root`` (default: this process) and all its descendants, by pid, with their CPU seconds."""
    import os

    root = root or os.getpid()
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = defaultdict(list)
    found: dict[int, ProcessCpu] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            command = ""
            if commands:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        children[int(fields[1])].append(int(entry))
        own, ended = (sum(int(v) for v in fields[i:i + 2]) / ticks for i in (11, 13))  # utime stime, cutime cstime
        found[int(entry)] = ProcessCpu(command, own, ended)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        if pid in found:
            tree[pid] = found[pid]
    return tree


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of ``root`` (default: this process) and all its descendants.

    Children that ended and were waited for are included (in their parent's
    ``cutime``/``cstime``): Spark's Python workers, the JVM, the broker. CPU
    time is much less disturbed than wall time by other work on the machine.
    """
    return sum(p.own + p.ended for p in process_tree(root).values())


class PySpy:
    """``py-spy record`` of this process and its children (Spark's Python workers) while active."""

    def __init__(self, output: str | None) -> None:
        self.output = output
        self._proc = None

    def __enter__(self) -> PySpy:
        import os
        import shutil
        import subprocess
        import sys

        if not self.output:
            return self
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(Path(self.output).suffix, "raw")  # raw: collapsed
        self._proc = subprocess.Popen(
            [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--nonblocking", "--rate", "100",
             "--format", fmt, "--output", self.output],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # let it attach before the measured work starts
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self._proc is not None:
            self._proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            self._proc.wait(timeout=60)
