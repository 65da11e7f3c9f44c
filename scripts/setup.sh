#!/usr/bin/env bash
# Idempotent set-up for a Debian machine: system packages, the venv, Iceberg's Spark jars from Maven Central.
# Fast when everything is already in place (a stamp keyed on pyproject.toml and the Spark pin guards the venv).
#
#   TIDEMARK_VENV=.venv-spark4 TIDEMARK_PYSPARK='4.1.*' bash scripts/setup.sh    # what `make test-spark4` runs
set -euo pipefail
cd "$(dirname "$0")/.."

# iproute2: tests/test_quickstart.py runs the README's quickstart in a network namespace of its own (ip, unshare),
# and the fault suite's partitions run drivers in namespaces (tests/helpers/network.py); socat: the servers there
# listen on loopback, and socat forwards the test network's addresses to them.
# gcc, libc6-dev: tests/helpers/skewclock.c, the wrong wall clock the clock tests give a driver process.
# haproxy: tests/test_serve_replicas.py balances tidemark serve's replicas with it, request by request.
DEBIAN_PACKAGES=(openjdk-17-jre-headless zookeeper postgresql iproute2 socat gcc libc6-dev curl haproxy)
VENV=${TIDEMARK_VENV:-.venv}
# The Spark the venv runs: `make test` on 3.5, `make test-spark4` on 4.1 (README, "Spark versions").
PYSPARK=${TIDEMARK_PYSPARK:-3.5.*}

say() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

missing_packages() {
    local pkg
    for pkg in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then echo python3-venv; fi
}

install_debian_packages() {
    if ! command -v dpkg-query >/dev/null; then
        say "not a Debian machine: make sure Java 17, ZooKeeper 3.8 jars (TIDEMARK_ZK_CLASSPATH) and PostgreSQL"
        say "are present"
        return
    fi
    local missing
    missing=$(missing_packages | tr '\n' ' ')
    [ -z "${missing// }" ] && return
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        fail "missing Debian packages: $missing; run as root: apt-get update && apt-get install -y $missing"
    fi
    say "installing Debian packages: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

install_venv() {
    local stamp="$VENV/.tidemark-$( (cat pyproject.toml; echo "$PYSPARK") | sha256sum | cut -c1-16)"
    [ -f "$stamp" ] && return
    command -v python3 >/dev/null || fail "python3 not found: install Python 3.9+ (apt-get install python3 python3-venv)"
    say "creating $VENV and installing tidemark (editable) with its dev extras and pyspark $PYSPARK"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # The distribution was called "tidemark" before 0.1.0 shipped (a name another PyPI project holds):
    # a venv made then has this checkout installed under that name too, with the same packages and command.
    "$VENV/bin/python" -m pip uninstall -q -y tidemark 2>/dev/null || true
    "$VENV/bin/python" -m pip install -q -e '.[dev]' "pyspark==$PYSPARK"
    rm -f "$VENV"/.tidemark-*
    touch "$stamp"
}

[ -n "${TIDEMARK_SKIP_APT:-}" ] || install_debian_packages
install_venv
if [ -z "${TIDEMARK_SPARK_JARS:-}" ]; then
    # Iceberg's Spark runtime for this venv's Spark, iceberg-aws-bundle and the JDBC drivers, from Maven Central.
    "$VENV/bin/python" -m tools.jars install
fi
# Trino and Iceberg's REST catalog server, which the tests read and write the lakehouse with (about 750 MB, once).
"$VENV/bin/python" -m tools.jars test-servers
say "ready"
