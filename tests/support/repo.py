"""The repository's own files the tests read: its root, the shipped mesh configs, an edited copy of the mesh."""

from __future__ import annotations

import shutil
from pathlib import Path

#: The repository's root (``tests/`` is below it).
REPO = Path(__file__).resolve().parents[2]
#: conf/mesh: the eight configs of the cascading mesh (4 tiers x 2) as shipped.
MESH = REPO / "conf" / "mesh"


def mesh_copy(tmp_path: Path, edits: dict[str, list[tuple[str, str]]] | None = None) -> list[str]:
    """A copy of the shipped mesh under ``tmp_path``, each named instance's config edited (every ``old`` there,
    which must be there, replaced by ``new``): the copies' paths, sorted."""
    out = tmp_path / "mesh"
    shutil.copytree(MESH, out)
    for name, pairs in (edits or {}).items():
        p = out / f"{name}.xml"
        text = p.read_text()
        for old, new in pairs:
            assert old in text
            text = text.replace(old, new)
        p.write_text(text)
    return sorted(str(p) for p in out.glob("*.xml"))
