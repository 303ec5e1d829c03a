#!/usr/bin/env bash
# Run one multi-node cell (matrix.toml `nodes` > 1) into RUNS: tools/ci/multinode.sh CELL RUNS
# DISTCI_HOSTS=slurm: the cell is one batch job (`distci sbatch-script`, `sbatch --wait`) on
# the cluster this login node submits to; the checkout must be on its shared filesystem.
# Otherwise (netns): the nodes are simulated on this machine; the runner runs as root.
set -euo pipefail
cell="${1:?usage: tools/ci/multinode.sh CELL RUNS_DIR}"
runs="${2:?usage: tools/ci/multinode.sh CELL RUNS_DIR}"
mkdir -p "$runs"
if [ "${DISTCI_HOSTS:-netns}" = slurm ]; then
  nox -s matrix >/dev/null  # the controller venv exists before the batch job needs it
  .nox/_controller/bin/python -m distci sbatch-script --cell "$cell" --workdir "$PWD" > "$runs/$cell.sbatch"
  exec sbatch --wait "$runs/$cell.sbatch"
fi
exec nox -s dist_tests -- --cell "$cell" --runs-root "$runs"
