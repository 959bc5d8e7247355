"""Following an append-only Delta table's newest commits by reading its commit files directly.

delta-rs brings a table up to date by replaying its log into a snapshot and
listing its files again: 7-10 ms on an idle machine for a small txlog, several
times that on a busy one, and a replicator following the txlog would do it
every time it looks. For a table that only gets appends, the commits after
a known version say everything needed: each is one small JSON file naming the
data files it added, with their statistics. Anything other than plain appends
(a removed file, a metadata or protocol change, a file without statistics)
answers None, and the caller refreshes its snapshot the usual way. A table on
object storage is followed the same way when its caller names it by URI: each
commit is then one GET of an object that is whole or absent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from replication.connectors.delta.tables import COMMIT_METADATA_KEY
from replication.errors import StorageError

#: Past this many new commits, a snapshot refresh is as cheap: let the caller do it.
MAX_COMMITS = 200


@dataclass
class Appends:
    """The plain appends of versions ``(since, version]``."""

    version: int
    paths: list[str] = field(default_factory=list)
    """``add.path`` of each data file added, as the log has it (relative to the table, or a URI)."""
    versions: list[int] = field(default_factory=list)
    """The version that added each file."""
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    """Each added file's minimum and maximum of the statistics column."""
    last_seq: int = 0
    """The highest ``last_seq`` the ingest writer recorded in these commits (0: none)."""


def local_log_dir(table_uri: str) -> Path | None:
    """The ``_delta_log`` directory of a table on the local filesystem; None for other storage."""
    parsed = urlparse(table_uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path) if parsed.scheme else table_uri) / "_delta_log"


def appends_after(log_dir: Path | str, since: int, *, column: str | None = "seq",
                  through: int | None = None, removals: bool = False) -> Appends | None:
    """The files that versions after ``since`` (through ``through``, default: the newest) appended,
    from their commit files; None when they are not all plain appends.

    ``log_dir``: the local ``_delta_log`` directory, or the URI of a table on object storage (its
    commit objects are read whole; one that cannot be read answers None, as on disk). ``column``: the
    statistics column whose minimum and maximum each file must carry (None: statistics are not needed).
    ``removals``: a commit that only removes files (inbox cleanup) counts, as appending nothing.
    """
    out = Appends(since)
    while through is None or out.version < through:
        if out.version - since >= MAX_COMMITS:
            return None  # (before reading the next one)
        if isinstance(log_dir, str):
            try:
                text = commit_text(log_dir, out.version + 1)  # (a put: an object is whole or absent)
            except StorageError:
                return None  # (the caller's snapshot refresh says what is wrong)
            if text is None:
                return out if through is None else None
        else:
            try:
                text = (log_dir / f"{out.version + 1:020d}.json").read_text(encoding="utf-8")
            except FileNotFoundError:
                # delta-rs renames a complete commit file into place: none yet means none
                return out if through is None else None
            except (OSError, UnicodeDecodeError):
                return None
        if not _apply(text, column, out.version + 1, out, removals):
            return None
        out.version += 1
    return out


def newest_version(log_dir: Path | str, known: int) -> int:
    """The newest version, probing the commit files after ``known`` (a version known to exist).

    ``log_dir``: the local ``_delta_log`` directory, or the URI of a table on object storage (one HEAD
    per version probed)."""
    version = known
    while _commit_exists(log_dir, version + 1):
        version += 1
    return version


def _commit_exists(log_dir: Path | str, version: int) -> bool:
    if isinstance(log_dir, Path):
        return (log_dir / f"{version:020d}.json").exists()
    from pyarrow import fs

    from replication.connectors.s3.access import arrow_location

    path, filesystem = arrow_location(f"{log_dir.rstrip('/')}/_delta_log/{version:020d}.json")
    if filesystem is None:
        filesystem, path = fs.FileSystem.from_uri(path)
    try:  # (opening asks one HEAD; get_file_info follows a missing object with a LIST, as for a folder)
        filesystem.open_input_file(path).close()
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:  # (not "no newer version": the caller asks delta-rs instead)
        raise StorageError(f"{log_dir}: commit {version} cannot be probed ({exc})") from None


def _apply(text: str, column: str | None, version: int, out: Appends, removals: bool = False) -> bool:
    """Fold one commit file into ``out``; False when it is anything but a plain append (or, with
    ``removals``, a commit that only removes files)."""
    added, removed = len(out.paths), False
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return False
        if "commitInfo" in action:
            raw = action["commitInfo"].get(COMMIT_METADATA_KEY)
            if raw:
                try:
                    out.last_seq = max(out.last_seq, int(json.loads(raw).get("last_seq", 0)))
                except (ValueError, TypeError, AttributeError):
                    return False
        elif "add" in action:
            add = action["add"]
            if not add.get("dataChange", True):
                return False
            if column is not None:
                try:
                    stats = json.loads(add.get("stats") or "{}")
                    out.lo.append(int(stats["minValues"][column]))
                    out.hi.append(int(stats["maxValues"][column]))
                except (ValueError, TypeError, KeyError):
                    return False  # no statistics: the caller's snapshot knows how to place the file
            out.paths.append(add["path"])
            out.versions.append(version)
        elif removals and action.keys() <= {"remove", "cdc"}:
            removed = True
        elif not action.keys() <= {"txn"}:
            return False  # remove, metaData, protocol, cdc, domainMetadata...: not a plain append
    return not (removed and len(out.paths) > added)  # (a removal that rewrote files re-adds rows seen before)


def commit_text(table_uri: str, version: int) -> str | None:
    """The commit file of ``version`` of the table at ``table_uri`` (local or object storage); None when gone
    (or not written yet). One that cannot be read raises :class:`StorageError`."""
    from pyarrow import fs

    from replication.connectors.s3.access import arrow_location

    try:
        uri = f"{table_uri.rstrip('/')}/_delta_log/{version:020d}.json"
        path, filesystem = arrow_location(uri)
        if filesystem is None:  # (a local path or file:// URI)
            filesystem, path = fs.FileSystem.from_uri(uri)
        with filesystem.open_input_stream(path) as stream:
            return stream.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:  # (not "gone": a caller must not take it for a missing commit)
        raise StorageError(f"{table_uri}: commit {version} cannot be read ({exc})") from None


def commit_info(table_uri: str, version: int) -> dict | None:
    """The ``commitInfo`` of commit ``version`` of the table at ``table_uri`` (local or object storage);
    None when the commit file is gone or has none."""
    text = commit_text(table_uri, version)
    if text is None:
        return None
    for line in text.splitlines():
        if '"commitInfo"' in line:
            info = json.loads(line).get("commitInfo")
            if isinstance(info, dict):
                return info
    return None
