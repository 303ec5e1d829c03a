#!/usr/bin/env bash
# Runs distci's suites on a lent GPU machine that has its own python3 + torch and no
# network. Carried wheels (torchao, torchtitan and their pure-Python deps) live in .whl/.
# Usage: tools/gpu_run.sh RUN_NAME CELL_ID [pytest args...]; results go to $OUT/RUN_NAME.
set -uo pipefail
name=$1; cell=$2; shift 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
site="$PWD/.distci/gpu-site"  # the device copy of the working tree; .distci/ is git-ignored
mkdir -p "$(dirname "$site")"
exec 9>"$site.lock"; flock 9  # parallel gpu_run.sh calls in one device call install once
if [ ! -f "$site/.distci-ready" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || exit 90
  # The fix package must be installed (not just importable) so torch finds its entry point.
  if [ -f fixes/pyproject.toml ]; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" ./fixes \
      || echo "gpu_run: WARNING: the fix package did not install; fixes are off"
  fi
  touch "$site/.distci-ready"
fi
flock -u 9
export PYTHONPATH="$site:$PWD"
run_dir="${OUT:-.distci/gpu}/$name"
mkdir -p "$run_dir"
start=$(date +%s)
python3 -m pytest -p distci.harness.plugin -p no:cacheprovider -q -rfEs --distci-device cuda \
  --distci-run-dir "$run_dir" --distci-cell "$cell" --distci-known-issues suites/known_issues.toml "$@" \
  > "$run_dir/pytest.log" 2>&1
code=$?
echo "$name: pytest exit $code in $(( $(date +%s) - start ))s"
tail -n 25 "$run_dir/pytest.log"
exit 0
