#!/usr/bin/env bash
# Install nox (version $NOX_VERSION, set by the workflow) into a venv of its own and put it
# on the job's PATH. Uses the runner's python3: self-hosted runners may have no Python
# tool cache, and nothing is installed into the system Python. The venv lives in the
# runner's tool cache ($RUNNER_TOOL_CACHE, kept between jobs on a self-hosted runner) when
# there is one, so a machine installs each nox version once; else under $RUNNER_TEMP.
set -euo pipefail
: "${NOX_VERSION:?is set by the workflow}"
if [ -n "${RUNNER_TOOL_CACHE:-}" ]; then
  venv="$RUNNER_TOOL_CACHE/distci-nox/$NOX_VERSION"
else
  venv="${RUNNER_TEMP:?not in a GitHub Actions job}/nox"
fi
mkdir -p "$(dirname "$venv")"
(
  flock 9  # two jobs of one machine may start at once
  if ! "$venv/bin/nox" --version >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "nox==${NOX_VERSION}"
  fi
) 9>"$venv.lock"
echo "$venv/bin" >> "${GITHUB_PATH:?not in a GitHub Actions job}"
"$venv/bin/nox" --version
