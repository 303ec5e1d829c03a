#!/usr/bin/env bash
# Install nox (version $NOX_VERSION, set by the workflow) into its own venv under
# $RUNNER_TEMP and put it on the job's PATH. Uses the runner's python3: self-hosted
# runners may have no Python tool cache, and nothing is installed into the system Python.
set -euo pipefail
: "${NOX_VERSION:?is set by the workflow}"
venv="${RUNNER_TEMP:?not in a GitHub Actions job}/nox"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "nox==${NOX_VERSION}"
echo "$venv/bin" >> "${GITHUB_PATH:?not in a GitHub Actions job}"
"$venv/bin/nox" --version
