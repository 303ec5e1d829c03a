#!/usr/bin/env bash
# Run every cell of matrix.toml's multinode tier (nodes > 1), one after another, into RUNS.
# DISTCI_HOSTS=slurm: each cell is one batch job (`distci sbatch-script`, `sbatch --wait`) on
# the cluster this login node submits to; the checkout must be on its shared filesystem.
# Otherwise (netns): the nodes are simulated on this machine, which needs root (sudo -E).
set -euo pipefail
runs="${1:?usage: tools/ci/multinode.sh RUNS_DIR}"
mkdir -p "$runs"
cells=$(nox -s matrix -- --json --tier multinode | python3 -c \
  'import json,sys; print(" ".join(e["cell"] for e in json.loads(sys.stdin.read().strip().splitlines()[-1])["include"]))')
status=0
for cell in $cells; do
  if [ "${DISTCI_HOSTS:-netns}" = slurm ]; then
    nox -s matrix >/dev/null  # the controller venv exists before the job needs it
    .nox/_controller/bin/python -m distci sbatch-script --cell "$cell" --workdir "$PWD" > "$runs/$cell.sbatch"
    sbatch --wait "$runs/$cell.sbatch" || status=$?
  else
    sudo -E env "PATH=$PATH" nox -s dist_tests -- --cell "$cell" --runs-root "$runs" || status=$?
  fi
done
exit "$status"
