"""The ``file:`` filesystem that sets modes in-process (replication/local_fs.py), in the test session's Spark."""

import os
import stat

import pytest

from replication.connectors.spark import local_fs


def _file_system(spark):
    jvm = spark._jvm
    return jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration())


@pytest.fixture(scope="module")
def built():
    if local_fs.javac() is None:
        pytest.skip("no javac on this machine: sessions keep Hadoop's own local filesystem")
    jar = local_fs.jar()
    assert jar is not None and jar.is_file()
    return jar


def test_the_session_writes_local_files_through_it(spark, built):
    fs = _file_system(spark)
    assert fs.getClass().getName() == local_fs.CLASS_NAME
    assert str(built) in spark.sparkContext.getConf().get("spark.driver.extraClassPath")


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o755, 0o700, 0o1777])
def test_modes_are_set_exactly(spark, built, tmp_path, mode):
    target = tmp_path / "file"
    target.write_text("x")
    jvm = spark._jvm
    _file_system(spark).setPermission(
        jvm.org.apache.hadoop.fs.Path(target.as_uri()), jvm.org.apache.hadoop.fs.permission.FsPermission(mode)
    )
    assert stat.S_IMODE(os.stat(target).st_mode) == mode


def test_files_it_creates_get_the_default_mode_and_content(spark, built, tmp_path):
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path((tmp_path / "made").as_uri())
    out = _file_system(spark).create(path, True)
    out.write(bytearray(b"hello"))
    out.close()
    made = tmp_path / "made"
    assert made.read_bytes() == b"hello"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o666 & ~umask


def test_only_local_masters_get_it(built):
    assert local_fs.spark_conf("yarn") == {}
    assert local_fs.spark_conf("spark://host:7077") == {}
    conf = local_fs.spark_conf("local[2]", "/opt/mine.jar")
    assert conf["spark.hadoop.fs.file.impl"] == local_fs.CLASS_NAME
    assert conf["spark.driver.extraClassPath"] == f"{built}{os.pathsep}/opt/mine.jar"


def test_spark_submit_options(built):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "replication.connectors.spark.local_fs"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split("\n")[:4] == [
        "--driver-class-path", str(built), "--conf", f"spark.hadoop.fs.file.impl={local_fs.CLASS_NAME}"
    ]
