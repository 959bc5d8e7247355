"""The JVM options of the sessions ``replication.connectors.spark.session`` builds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replication.connectors.spark import class_archive
from replication.connectors.spark.session import DEFAULT_CONF, SHORT_LIVED_JAVA_OPTIONS, session


def vm_option(spark, name: str) -> str:
    jvm = spark._jvm
    bean_class = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean_class)
    return bean.getVMOption(name).getValue()


def tiered_stop_at(spark) -> str:
    """The highest JIT tier the session's JVM compiles to (4: C2, the JVM's default; 1: C1 alone)."""
    return vm_option(spark, "TieredStopAtLevel")


def test_an_instances_session_keeps_the_jvms_c2_compiler(spark):
    # the test session is built as the instances' is (replication run, notebooks)
    assert tiered_stop_at(spark) == "4"


def test_an_instances_session_maps_its_classes_from_the_archive_the_install_built(spark, monkeypatch):
    archive = class_archive.archive_path(class_archive.local_driver_class_path())
    assert archive is not None and archive.is_file(), "the README's install command builds it"
    assert vm_option(spark, "SharedArchiveFile") == str(archive)
    # the JVM took it: a class path or JVM that no longer matches starts without sharing
    assert "sharing" in spark._jvm.java.lang.System.getProperty("java.vm.info")
    # not for a driver on another machine, nor for a class path it was not built for
    assert class_archive.java_options("spark://elsewhere:7077", class_archive.local_driver_class_path()) == ""
    assert class_archive.java_options("local[2]", "/another/extra.jar") == ""
    assert class_archive.java_options("local[2]", class_archive.local_driver_class_path()) == \
        f"-XX:SharedArchiveFile={archive}"
    monkeypatch.setenv(class_archive.SWITCH_ENV, "off")
    assert class_archive.java_options("local[2]", class_archive.local_driver_class_path()) == ""


@pytest.mark.e2e  # a Spark session of its own, in a process of its own
def test_a_short_lived_commands_jvm_compiles_with_c1_alone_and_keeps_the_users_options():
    assert SHORT_LIVED_JAVA_OPTIONS == "-XX:TieredStopAtLevel=1"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": "-Dprobe.kept=yes", "REPLICATION_SPARK_LOG_LEVEL": "ERROR"}
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # C1 alone, the user's own option too, and SPARK_SUBMIT_OPTS as the user set it once the JVM is up
    assert seen == {"tiered_stop_at": "1", "property": "yes", "env_after": "-Dprobe.kept=yes"}


@pytest.mark.e2e  # spark-submit's own JVM
def test_under_spark_submit_the_users_master_and_conf_win_over_the_sessions_defaults():
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "REPLICATION_SPARK_LOG_LEVEL": "ERROR"}
    out = subprocess.run([str(venv_bin / "spark-submit"), "--master", "local[1]",
                          "--conf", "spark.sql.shuffle.partitions=7",
                          "--conf", "spark.databricks.delta.snapshotPartitions=50", __file__, "--settings"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # what the user gave, and the defaults where the user gave nothing
    assert seen == {"master": "local[1]", "spark.sql.shuffle.partitions": "7",
                    "spark.databricks.delta.snapshotPartitions": "50",
                    "spark.sql.streaming.pollingDelay": DEFAULT_CONF["spark.sql.streaming.pollingDelay"]}


if __name__ == "__main__" and sys.argv[1:] == ["--settings"]:  # the probe spark-submit runs just above
    probe = session("settings probe")
    keys = ("spark.sql.shuffle.partitions", "spark.databricks.delta.snapshotPartitions",
            "spark.sql.streaming.pollingDelay")
    print(json.dumps({"master": probe.sparkContext.master, **{key: probe.conf.get(key) for key in keys}}))
    probe.stop()
elif __name__ == "__main__":  # the probe the short-lived test runs in a process of its own (its own JVM)
    probe = session("short-lived probe", short_lived=True)
    print(json.dumps({"tiered_stop_at": tiered_stop_at(probe),
                      "property": probe._jvm.java.lang.System.getProperty("probe.kept"),
                      "env_after": os.environ.get("SPARK_SUBMIT_OPTS")}))
    probe.stop()
