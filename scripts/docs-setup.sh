#!/usr/bin/env bash
# `make docs`'s environment: .venv-docs with the tools of pyproject.toml's `docs` extra, nothing else (not the
# package, not .venv): seconds once, nothing when pyproject.toml's list is what it was installed from.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-docs
STAMP=$VENV/.installed
read -r -a WANTED <<< "$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${WANTED[*]}" ]; then
    exit 0
fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    printf 'docs: error: python3 has no venv module: apt-get update && apt-get install -y python3-venv\n' >&2
    exit 1
fi
printf 'docs: installing %s into %s\n' "${WANTED[*]}" "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${WANTED[@]}"
printf '%s' "${WANTED[*]}" > "$STAMP"
