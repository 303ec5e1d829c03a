#!/usr/bin/env bash
# Several shares of one CPU cell's tier side by side on a many-core machine (the one-GPU
# device's 16 CPUs), optionally beside a one-GPU run, each through tools/gpu_1gpu_tier.sh
# (SIGINT at the budget: distci records what finished). Everything comes back as one
# all.tgz in $OUT (a remote runner brings back few files).
#   KS="1 2 3 4 5" N=10 B=520 [CELL=...] [GK="<-k for the one-GPU cell>"] bash tools/device_shards.sh
# The first share starts alone until it has a result (it installs the carried wheels into
# the shared overlay env); the others follow 5 s apart, each with what is left of B seconds.
set -uo pipefail
: "${KS:?shares to run, e.g. KS=\"1 2 3\"}" "${N:?number of shares}" "${B:?budget in seconds}"
W=$(mktemp -d)
export DISTCI_TEST_TIMEOUT_CAP=${DISTCI_TEST_TIMEOUT_CAP:-150}
cell=${CELL:-cpu-cpu-torch_installed-ao_0.17.0-ws2-fix_off}
t0=$(date +%s)
first=1
for k in $KS; do
  OUT=$W CELL=$cell NAME=c$k BUDGET_S=$((B - ($(date +%s) - t0))) \
    bash tools/gpu_1gpu_tier.sh --shard "$k/$N" > "$W/c$k.txt" 2>&1 &
  if [ $first = 1 ]; then
    for _ in $(seq 90); do grep -q "PASSED\|SKIPPED\|FAILED\|KNOWN" "$W/c$k.txt" 2>/dev/null && break; sleep 2; done
    first=0
  else
    sleep 5
  fi
done
if [ -n "${GK:-}" ]; then
  OUT=$W CELL=cuda-cu130-torch_installed-ao_0.17.0-ws1-fix_on NAME=g BUDGET_S=$((B - ($(date +%s) - t0))) \
    bash tools/gpu_1gpu_tier.sh -k "$GK" > "$W/g.txt" 2>&1 &
fi
wait
echo "device_shards: all done in $(( $(date +%s) - t0 ))s"
tail -n 3 "$W"/*.txt
tar czf "${OUT:-.}/all.tgz" -C "$W" .
