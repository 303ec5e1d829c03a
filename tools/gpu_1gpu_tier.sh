#!/usr/bin/env bash
# The one-GPU tier through the product path, on a machine that has its own python3 + torch
# and no network (docs/installed-stack.md):
#   python3 -m distci run --cell cuda-cu130-torch_installed-ao_0.17.0-ws1-fix_on --tier nightly --python python3
# What the interpreter lacks comes from carried wheels in .whl/ (torchao for the cell's
# overlay through DISTCI_FIND_LINKS; setuptools/packaging for the controller, installed
# only when missing or too old). Into $OUT (a remote runner brings back a few files, not
# a tree: two per selection): NAME.log (the printed summary) and NAME.tgz (the run directory:
# results.jsonl, junit.xml, stack.json, run.json, rank logs with each row's numbers, and
# machine.txt: the GPU, and what is left running afterwards).
# Usage: [NAME=tier] [CELL=...] [TIER=nightly] [BUDGET_S=530] [DISTCI_TEST_TIMEOUT_CAP=150]
#        tools/gpu_1gpu_tier.sh [-k EXPR]
# Two calls with disjoint -k selections may run at once on one GPU (compiles are CPU-bound):
# start the second once the first printed "environment ready" (they share the overlay).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cell=${CELL:-cuda-cu130-torch_installed-ao_0.17.0-ws1-fix_on}
py=$(command -v python3)
wheels="$PWD/.whl"
name=${NAME:-tier}
out=${OUT:-.distci/gpu-out}
runs=$(mktemp -d)
mkdir -p "$out"
export DISTCI_FIND_LINKS="$wheels"

# The controller's own dependencies (pyproject.toml): name those missing or too old.
need=$("$py" - <<'EOF'
import importlib.metadata as md
least = {"packaging": (23,), "rich": (13,), "jinja2": (3, 1), "setuptools": (70, 1),
         "urllib3": (2,), "filelock": (3, 12), "orjson": (3, 9), "regex": (2023,)}
for name, version in least.items():
    try:
        have = tuple(int(x) for x in md.version(name).split(".")[:len(version)] if x.isdigit())
    except md.PackageNotFoundError:
        have = ()
    if have < version:
        print(name)
EOF
)
if [ -n "$need" ]; then
  echo "gpu_1gpu_tier: installing from $wheels: $need"
  # shellcheck disable=SC2086  # one argument per package name
  "$py" -m pip install -q --no-index --find-links "$wheels" $need || { echo "gpu_1gpu_tier: controller deps missing"; exit 90; }
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; "$py" -V; } > "$out/$name-machine.txt" 2>&1
start=$(date +%s)
export DISTCI_TEST_TIMEOUT_CAP=${DISTCI_TEST_TIMEOUT_CAP:-150}
# SIGINT at the end of the budget: distci stops its workers and records what finished.
timeout --signal=INT --kill-after=30 "${BUDGET_S:-530}" \
  "$py" -m distci run --cell "$cell" --tier "${TIER:-nightly}" --python "$py" --runs-root "$runs" "$@" 2>&1 | tee "$out/$name.log"
code=${PIPESTATUS[0]}
echo "gpu_1gpu_tier: distci run exit $code in $(( $(date +%s) - start ))s" | tee -a "$out/$name.log"

# Nothing may be left running: the harness's workers and the GPU's compute processes.
{ echo "after the run:"; nvidia-smi --query-compute-apps=pid,name --format=csv,noheader 2>&1
  # Rank workers are forks of `python -u -m distci.harness.zygote` (a fresh spawn: `-m distci.harness.worker`;
  # torchrun: `-m distci.harness.torchrun_entry`);
  # the pattern names the interpreter flag so it never matches a shell whose text merely mentions it.
  pgrep -af -- "-m distci[.]harness[.](zygote|worker|torchrun_entry)" || echo "no distci.harness worker"; } >> "$out/$name-machine.txt"
# One archive per selection (the device returns a few files a call): the run directory with
# the machine file in it; NAME.log stays beside it to be read at once.
run=$(find "$runs" -mindepth 1 -maxdepth 1 -type d | sort | tail -n 1)
if [ -n "$run" ]; then
  mv "$out/$name-machine.txt" "$run/machine.txt"
  tar czf "$out/$name.tgz" -C "$run" .
fi
exit "$code"
