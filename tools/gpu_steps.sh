#!/usr/bin/env bash
# Runs several tools/gpu_run.sh steps inside one device call, each bounded by what is left
# of the call's budget, and packs every run directory into $OUT/runs.tgz at the end (the
# device tool brings back a few files, not whole trees).
# Usage: BUDGET_S=560 [RUNS_TGZ=runs.tgz] tools/gpu_steps.sh CELL 'NAME|CAP_S|pytest args' ...
#   CAP_S caps each test's timeout (--distci-timeout-cap); a step gets at most the time left.
set -uo pipefail
cell=$1; shift
budget=${BUDGET_S:-560}
start=$(date +%s)
names=()
for step in "$@"; do
  IFS='|' read -r name cap args <<<"$step"
  left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt 60 ]; then
    echo "gpu_steps: $name not run: ${left}s left of ${budget}s"
    continue
  fi
  names+=("$name")
  eval "argv=($args)"  # the step's pytest arguments, shell-quoted inside the string
  timeout "$left" bash "$(dirname "$0")/gpu_run.sh" "$name" "$cell" --distci-timeout-cap="$cap" "${argv[@]}"
done
tar czf "${OUT:-.}/${RUNS_TGZ:-runs.tgz}" -C "${OUT:-.distci/gpu}" "${names[@]}" && rm -rf "${names[@]/#/${OUT:-.distci/gpu}/}"
echo "gpu_steps: done in $(( $(date +%s) - start ))s"
