#!/usr/bin/env bash
# Entry point of the Tidemark image (PID 1 is tini, which forwards SIGTERM to what this execs):
#
#   job SCRIPT [ARGS...]    a Spark driver: python3 SCRIPT ARGS (the chart's job Deployments)
#   exporter [ARGS...]      tidemark exporter ARGS (the chart's exporter Deployment)
#   executor                a Spark executor: Spark's Kubernetes scheduler starts its executor
#                           pods with this argument and describes them in SPARK_* variables
#   tidemark [ARGS...]      the tidemark CLI
#   COMMAND [ARGS...]       anything else runs as it is
set -euo pipefail

usage() {
    echo "usage: tidemark-entrypoint job SCRIPT [ARGS...] | exporter [ARGS...] | executor | tidemark [ARGS...] | COMMAND [ARGS...]" >&2
    exit 2
}

fail() {
    echo "tidemark-entrypoint: error: $*" >&2
    exit 2
}

run_executor() {
    local name
    for name in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_APPLICATION_ID \
                SPARK_EXECUTOR_POD_IP SPARK_EXECUTOR_POD_NAME SPARK_EXECUTOR_MEMORY SPARK_RESOURCE_PROFILE_ID; do
        [ -n "${!name:-}" ] || fail "$name is not set: 'executor' is for the pods Spark's Kubernetes scheduler creates"
    done
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
    local java_options=() index=0
    while name="SPARK_JAVA_OPT_$index" && [ -n "${!name+set}" ]; do
        java_options+=("${!name}")
        index=$((index + 1))
    done
    # Spark's configuration, then spark.executor.extraClassPath (SPARK_CLASSPATH: Iceberg's runtime,
    # iceberg-aws-bundle and the JDBC drivers), then Spark's jars, as Spark's own images order them.
    local classpath="${SPARK_CONF_DIR:-$SPARK_HOME/conf}"
    [ -z "${SPARK_CLASSPATH:-}" ] || classpath="$classpath:$SPARK_CLASSPATH"
    classpath="$classpath:$SPARK_HOME/jars/*:$PWD"
    exec "${JAVA_HOME:+$JAVA_HOME/bin/}java" "${java_options[@]}" \
        "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" -cp "$classpath" \
        org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" \
        --cores "$SPARK_EXECUTOR_CORES" --app-id "$SPARK_APPLICATION_ID" \
        --hostname "$SPARK_EXECUTOR_POD_IP" --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
        --podName "$SPARK_EXECUTOR_POD_NAME"
}

[ $# -gt 0 ] || usage
command=$1
shift
case "$command" in
    job)
        [ $# -gt 0 ] || usage
        [ -f "$1" ] || fail "no job script at $1: mount one (the chart's jobs.<name>.script) or add it to the image (jobs.<name>.scriptPath)"
        exec python3 "$@"
        ;;
    exporter)
        exec tidemark exporter "$@"
        ;;
    executor)
        run_executor
        ;;
    tidemark)
        exec tidemark "$@"
        ;;
    *)
        exec "$command" "$@"
        ;;
esac
