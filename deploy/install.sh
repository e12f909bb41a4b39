#!/bin/sh
# Install devshim (with its drivers, devshim_adapters) into a fresh virtual environment:
# build a wheel of the source tree, then install that wheel (never an editable install).
# The Dockerfile runs this in its build stage; tests/deploy/test_dockerfile.py runs the same
# script into a temporary venv, so the image's install steps are tested without a container.
#
#   deploy/install.sh VENV [SOURCE]     (SOURCE: the project root, default: this script's parent's parent)
#   PYTHON=/path/to/python3 picks the interpreter that creates VENV (default: python3).
set -eu

venv=${1:?usage: install.sh VENV [SOURCE]}
src=${2:-$(dirname "$0")/..}
python=${PYTHON:-python3}

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT

"$python" -m venv "$venv"
# The project alone as a wheel; its dependencies are resolved at install time below.
"$venv/bin/python" -m pip wheel --quiet --no-cache-dir --disable-pip-version-check --no-deps \
    --wheel-dir "$wheels" "$src"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check "$wheels"/devshim-*.whl
