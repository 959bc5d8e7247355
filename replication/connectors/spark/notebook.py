"""A notebook that runs on Databricks and as a plain Python file: its parameters, the tables it shows, its charts.

On Databricks a notebook's globals hold ``dbutils`` (widgets) and ``display``.
Run locally (``python notebooks/replay.py``), it has neither: parameters come
from environment variables ``REPLICATION_<NAME>`` (else the default), tables
print as text, and charts are saved as PNG files in ``REPLICATION_OUTPUT_DIR``
(default: the working directory). The notebooks in ``notebooks/`` start with::

    nb = Notebook.of(globals())
    CONFIG = nb.param("config", "conf/amps-1.xml")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replication.connectors.spark.session import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Rows a table shows (Databricks' display pages through more itself).
SHOWN_ROWS = 50


@dataclass
class Notebook:
    """Where a notebook runs, and how it takes parameters, shows tables and keeps charts."""

    namespace: dict[str, Any]
    """The notebook's globals."""

    @classmethod
    def of(cls, namespace: dict[str, Any]) -> Notebook:
        return cls(namespace)

    @property
    def on_databricks(self) -> bool:
        return "dbutils" in self.namespace

    @property
    def spark(self) -> SparkSession:
        """The notebook's session (Databricks gives one), or a local one."""
        return self.namespace.get("spark") or session("replication-notebook")

    def param(self, name: str, default: str, *, label: str | None = None) -> str:
        """A text parameter: a widget on Databricks, else ``$REPLICATION_<NAME>``, else ``default``."""
        if self.on_databricks:
            widgets = self.namespace["dbutils"].widgets
            widgets.text(name, default, label or name)
            return widgets.get(name)
        return os.environ.get(f"REPLICATION_{name.upper()}", default)

    def display(self, table: Any, *, title: str | None = None) -> None:
        """Show a Spark or pandas DataFrame (or a list of dicts): Databricks' ``display``, else a printed table."""
        if self.on_databricks and "display" in self.namespace:
            if title:
                print(title)
            self.namespace["display"](table)
            return
        import pandas as pd  # only for printing tables locally

        if hasattr(table, "toPandas"):
            frame = table.limit(SHOWN_ROWS).toPandas()
        else:
            frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
        print(f"\n{title}" if title else "")
        print(frame.head(SHOWN_ROWS).to_string(index=False) if len(frame) else "(no rows)")

    def chart(self, figure: Any, name: str) -> Path | None:
        """Show a matplotlib figure: Databricks' ``display``, else saved as ``<output dir>/<name>`` (returned)."""
        if self.on_databricks and "display" in self.namespace:
            self.namespace["display"](figure)
            return None
        path = Path(os.environ.get("REPLICATION_OUTPUT_DIR", ".")) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100, bbox_inches="tight")
        print(f"chart saved to {path}")
        return path
