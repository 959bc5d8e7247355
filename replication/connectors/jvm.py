"""The JVM artifacts of ``jvm/pom.xml``, as the README's install command left them: classpaths and jar lists.

``mvn -q -f jvm/pom.xml generate-resources`` copies them from Maven Central (through Maven's own
cache) into three folders: ``jvm/lib/kafka/`` (the Apache Kafka broker, its tools and MirrorMaker 2,
with all their dependencies: one classpath), ``jvm/lib/spark/`` (delta-spark and Spark's Kafka
source: the jars a Spark session adds to pyspark's own) and ``jvm/lib/s3a/`` (Hadoop's S3A
filesystem, for sessions of instances on S3). ``REPLICATION_JVM_LIB`` names another folder holding
them (an installed copy of the package has no repository beside it).

Run as ``python -m replication.connectors.jvm``, it prints the spark-submit options that put the Spark
jars on a session started by ``spark-submit``; ``spark-submit.sh`` asks :mod:`replication.launch`, which
adds S3A for instances on S3.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from replication.errors import ConfigError

#: Names the folder holding ``kafka/`` and ``spark/`` (default: ``jvm/lib`` of the repository).
LIB_ENV = "REPLICATION_JVM_LIB"

#: Spark settings that make a session read and write Delta tables with delta-spark (SQL and catalog).
DELTA_SQL_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

INSTALL_FIX = "run the README's install command (its mvn -q -f jvm/pom.xml generate-resources step)"


class JvmArtifactsMissing(ConfigError):
    """The jars of ``jvm/pom.xml`` are not where they should be: the install command did not run."""


def lib_dir() -> Path:
    """The folder holding ``kafka/`` and ``spark/``."""
    given = os.environ.get(LIB_ENV)
    if given:
        return Path(given).expanduser()
    return Path(__file__).resolve().parents[2] / "jvm" / "lib"


def _jars(group: str) -> list[Path]:
    folder = lib_dir() / group
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        raise JvmArtifactsMissing(
            f"no JVM jars in {folder} (the {group} artifacts of jvm/pom.xml); {INSTALL_FIX}, "
            f"or set {LIB_ENV} to a folder that has them"
        )
    return jars


def kafka_classpath() -> str:
    """The classpath of the Kafka broker, its tools and MirrorMaker 2 (one folder of jars)."""
    return os.pathsep.join(str(jar) for jar in _jars("kafka"))


def spark_jars() -> list[str]:
    """The jars a Spark session adds: delta-spark and Spark's Kafka source (paths)."""
    return [str(jar) for jar in _jars("spark")]


def s3a_jars() -> list[str]:
    """Hadoop's S3A filesystem and the AWS SDK it needs (paths): added by a session only when an instance's
    storage is on S3 (its streaming checkpoints are written through ``s3a://``)."""
    return [str(jar) for jar in _jars("s3a")]


def spark_conf(*, object_storage: bool = False) -> dict[str, str]:
    """Settings of a session that reads Delta with delta-spark and Kafka with Spark's own source;
    ``object_storage``: also Hadoop's S3A filesystem, with this process's S3 endpoint and region (an
    instance's storage is on S3)."""
    jars, conf = spark_jars(), dict(DELTA_SQL_CONF)
    if object_storage:
        from replication.connectors.s3.access import environment_access

        jars += s3a_jars()
        conf.update(environment_access().hadoop_conf())
    return {"spark.jars": ",".join(jars), **conf}


def java() -> str:
    """The ``java`` to start JVMs with: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise JvmArtifactsMissing("java not found on PATH (and JAVA_HOME names none): install Java 17 or newer")
    return found


def spark_submit_args(*, object_storage: bool = False) -> list[str]:
    """:func:`spark_conf` as spark-submit options."""
    conf = spark_conf(object_storage=object_storage)
    args = ["--jars", conf.pop("spark.jars")]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


if __name__ == "__main__":
    try:
        print("\n".join(spark_submit_args()))
    except JvmArtifactsMissing as exc:
        print(f"spark-submit.sh: {exc}", file=sys.stderr)
        sys.exit(2)
