"""Spark's ``file:`` filesystem without a forked ``chmod`` per file it creates.

Hadoop's local filesystem sets the mode of every file it creates; without
Hadoop's native library (never there in a pip-installed PySpark) it does so by
starting ``chmod`` as a child process. Spark writes two checkpoint files per
micro-batch of every query (the offset log entry and the commit), each with a
checksum side file: four ``chmod`` processes forked from a multi-GB JVM per
batch, ~23 ms of a ~250 ms micro-batch here (walCommit 15 -> 4 ms,
commitOffsets 15 -> 3 ms, bench/ingest.py latency run).

:data:`JAVA_SOURCE` is Hadoop's ``LocalFileSystem`` with one method changed:
``setPermission`` sets the same mode bits through ``java.nio`` in-process. It
is compiled once with the JDK's ``javac`` into the user's cache directory and
put on the driver's class path, for ``local`` masters only (a cluster's
executors would not have the jar). Without ``javac`` (a JRE) Spark keeps its
own filesystem: correct, only slower.

Run ``python -m replication.connectors.spark.local_fs`` to print the spark-submit options
(``spark-submit.sh`` does).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from replication.connectors.spark.worker_python import cache_dir

log = logging.getLogger(__name__)

#: Hadoop filesystem class for the ``file:`` scheme (``fs.file.impl``).
CLASS_NAME = "replication.LocalFileSystem"

JAVA_SOURCE = """\
package replication;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;

/** Hadoop's checksummed local filesystem; modes are set in-process (see replication/local_fs.py). */
public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new Raw());
  }

  public static class Raw extends org.apache.hadoop.fs.RawLocalFileSystem {
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      if ((mode & ~0777) != 0) {  // sticky and other special bits: only chmod can set them
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          set.add(BITS[bit]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
      } catch (UnsupportedOperationException e) {  // not a POSIX filesystem
        super.setPermission(p, permission);
      }
    }
  }
}
"""


def hadoop_api_jar() -> Path | None:
    """The Hadoop client API jar of the installed PySpark (what the class compiles against)."""
    try:
        import pyspark
    except ImportError:
        return None
    jars = sorted((Path(pyspark.__file__).resolve().parent / "jars").glob("hadoop-client-api-*.jar"))
    return jars[-1] if jars else None


def javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "javac", os.X_OK):
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def jar() -> Path | None:
    """The compiled filesystem's jar (built on first use), or None where it cannot be built."""
    api = hadoop_api_jar()
    compiler = javac()
    if api is None or compiler is None:
        return None
    digest = hashlib.sha256(f"{JAVA_SOURCE}\0{api.name}".encode()).hexdigest()[:16]
    try:
        target = cache_dir() / f"local-fs-{digest}.jar"
        if not target.is_file():
            _build(compiler, api, target)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot build the in-process chmod filesystem (%s); Spark forks chmod per checkpoint file", exc)
        return None
    return target


def _build(compiler: str, api: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="replication-local-fs-") as work:
        source = Path(work) / "replication" / "LocalFileSystem.java"
        source.parent.mkdir()
        source.write_text(JAVA_SOURCE)
        classes = Path(work) / "classes"
        done = subprocess.run(
            [compiler, "--release", "17", "-nowarn", "-cp", str(api), "-d", str(classes), str(source)],
            capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            raise OSError(f"javac failed: {done.stderr.strip()[:500]}")
        # Write then rename: instances starting at once never load a half-written jar.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for path in sorted(classes.rglob("*.class")):
                    out.write(path, path.relative_to(classes).as_posix())
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def spark_conf(master: str, extra_class_path: str | None = None) -> dict[str, str]:
    """Settings that put the filesystem in place for a driver on ``master``; empty when they do not apply."""
    if not master.startswith("local"):
        return {}
    built = jar()
    if built is None:
        return {}
    class_path = str(built) if not extra_class_path else f"{built}{os.pathsep}{extra_class_path}"
    return {"spark.driver.extraClassPath": class_path, "spark.hadoop.fs.file.impl": CLASS_NAME}


if __name__ == "__main__":
    # spark-submit options, one per line (empty when the jar cannot be built).
    built = jar()
    if built is not None:
        print(f"--driver-class-path\n{built}\n--conf\nspark.hadoop.fs.file.impl={CLASS_NAME}")
