#!/usr/bin/env bash
# Run instances through spark-submit, installing the project on first use.
#
#   ./spark-submit.sh                          local demo (embedded broker, conf/ instances, a publisher)
#   ./spark-submit.sh conf/amps-1.xml          one instance
#   ./spark-submit.sh --master local[4] --conf spark.driver.memory=8g conf/a.xml conf/b.xml
#   ./spark-submit.sh --bootstrap conf/c.xml  bootstrap an instance from another, then exit
#
# spark-submit's own options go to spark-submit; everything else (configs, or demo options
# such as --rate 2000 --messages 10000) goes to the job.
# REPLICATION_VENV chooses the virtual environment (default: .venv beside this script).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${REPLICATION_VENV:-$here/.venv}"

if ! command -v java >/dev/null 2>&1; then
  echo "spark-submit.sh: Java 17 or newer is required (java not found on PATH)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import replication, pyspark" >/dev/null 2>&1; then
  echo "installing the project into $venv ..." >&2
  "$venv/bin/pip" install -q -e "$here"
fi
if ! ls "${REPLICATION_JVM_LIB:-$here/jvm/lib}"/spark/*.jar >/dev/null 2>&1; then
  echo "fetching the JVM artifacts of jvm/pom.xml (Kafka broker, delta-spark) with mvn ..." >&2
  mvn -q -f "$here/jvm/pom.xml" generate-resources
fi

spark_args=()
job_args=()
configs=0
config_files=()
bootstrap=0
while [ $# -gt 0 ]; do
  case "$1" in
    --master|--conf|-c|--name|--driver-memory|--driver-cores|--driver-java-options|--executor-memory|\
    --executor-cores|--num-executors|--total-executor-cores|--deploy-mode|--py-files|--files|--jars|\
    --properties-file|--queue)
      spark_args+=("$1" "$2"); shift ;;
    --verbose|--supervise) spark_args+=("$1") ;;
    --bootstrap) bootstrap=1 ;;
    *.xml) job_args+=("$1"); configs=1; config_files+=("$1") ;;
    *) job_args+=("$1") ;;
  esac
  shift
done

# Spark's Python processes run the venv's interpreter through a launcher that
# skips PySpark's zip (replication/worker_python.py: they start ~0.5 CPU-s faster).
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$("$venv/bin/python" -m replication.connectors.spark.worker_python)}"
export PYSPARK_DRIVER_PYTHON="$venv/bin/python"
has_master=0
for a in "${spark_args[@]+"${spark_args[@]}"}"; do [ "$a" = "--master" ] && has_master=1; done
[ "$has_master" = 1 ] || spark_args=(--master "local[2]" "${spark_args[@]+"${spark_args[@]}"}")

case " ${spark_args[*]+"${spark_args[*]}"} " in *" --driver-memory "*) ;; *) spark_args+=(--driver-memory 4g) ;; esac
# Checkpoint files written without forking chmod each (replication/local_fs.py);
# local masters only, and only where the JDK's javac can build it.
case " ${spark_args[*]} " in
  *" --master local"*)
    case " ${spark_args[*]} " in *"fs.file.impl"*|*" --driver-class-path "*) ;; *)
      while IFS= read -r line; do spark_args+=("$line"); done < <("$venv/bin/python" -m replication.connectors.spark.local_fs) ;;
    esac ;;
esac
# One --driver-java-options (spark-submit keeps only the last given): the log4j file and, on a local master,
# the class-data sharing archive the install built (the driver JVM starts ~3 s sooner), then the user's own.
master="" class_path=""
for ((i = 0; i + 1 < ${#spark_args[@]}; i++)); do
  case "${spark_args[i]}" in
    --master) master="${spark_args[i + 1]}" ;;
    --driver-class-path) class_path="${spark_args[i + 1]}" ;;
  esac
done
archive="$("$venv/bin/python" -m replication.connectors.spark.class_archive --java-options "$master $class_path")" \
  || archive=""
java_options="-Dlog4j2.configurationFile=file:$here/conf/log4j2.properties $archive"
kept=()
while [ ${#spark_args[@]} -gt 0 ]; do
  if [ "${spark_args[0]}" = "--driver-java-options" ]; then
    java_options="$java_options ${spark_args[1]}"; spark_args=("${spark_args[@]:2}")
  else
    kept+=("${spark_args[0]}"); spark_args=("${spark_args[@]:1}")
  fi
done
spark_args=("${kept[@]+"${kept[@]}"}" --driver-java-options "$java_options")
# delta-spark (with its SQL extension and catalog) and Spark's Kafka source, from jvm/pom.xml's jars; with
# Hadoop's S3A filesystem when an instance's storage is on S3.
jvm_args="$("$venv/bin/python" -m replication.launch "${config_files[@]+"${config_files[@]}"}")" || exit 2
while IFS= read -r line; do spark_args+=("$line"); done <<< "$jvm_args"

job="$here/jobs/demo.py"
[ "$configs" = 1 ] && job="$here/jobs/instance.py"
[ "$bootstrap" = 1 ] && job="$here/jobs/bootstrap.py"
# SIGTERM to the whole process group (systemd, a supervisor) must stop the Python driver's queries
# before the JVM goes: spark-submit's JVM inherits SIGTERM ignored and keeps it so; the driver it
# starts installs its own handler (replication.runner) and the JVM exits when the driver has.
trap '' TERM
exec "$venv/bin/spark-submit" "${spark_args[@]}" "$job" "${job_args[@]+"${job_args[@]}"}"
