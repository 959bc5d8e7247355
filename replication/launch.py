"""``python -m replication.launch [CONFIG...]``: the spark-submit options ``spark-submit.sh`` adds for the
instances of those config files, one per line.

The JVM jars and settings come from :func:`replication.connectors.jvm.spark_submit_args`; what depends on the
instances is decided here: Hadoop's S3A filesystem when one of them keeps its storage on S3.
"""

from __future__ import annotations

import sys

from replication import config
from replication.connectors.jvm import JvmArtifactsMissing, spark_submit_args
from replication.errors import ReplicationError


def on_object_storage(configs: list[str]) -> bool:
    """Whether an instance of these config files keeps its storage on S3 (a config that does not load is
    left to the job, which says what is wrong with it)."""
    for path in configs:
        try:
            if config.load(path).on_object_storage:
                return True
        except (ReplicationError, OSError):
            continue
    return False


def main(argv: list[str]) -> int:
    try:
        print("\n".join(spark_submit_args(object_storage=on_object_storage(argv))))
    except JvmArtifactsMissing as exc:
        print(f"spark-submit.sh: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
