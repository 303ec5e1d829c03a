#!/usr/bin/env bash
# One ephemeral runner's life (started again and again by distci-runner@.service): ask
# GitHub for a just-in-time runner configuration, which registers a runner for ONE job
# and cannot be used twice, then run that job. A fresh configuration every start means no
# registration token is kept: they expire after an hour, the credential below does not.
#
# ~/distci-runner.env (docs/runners.md) sets:
#   GH_TOKEN               a fine-grained token (or a GitHub App installation token):
#                          repository permission "Administration: read and write" for a
#                          repository's runners, organization permission "Self-hosted
#                          runners: read and write" for an organization's
#   DISTCI_RUNNER_SCOPE    repos/<owner>/<repo> or orgs/<org>
#   DISTCI_RUNNER_LABELS   every label the runner answers to, comma separated (a
#                          just-in-time runner gets only these: self-hosted and linux too)
#   DISTCI_RUNNER_GROUP_ID 1 (a repository's runners; an organization's runner group id)
#   DISTCI_RUNNER_DIR      the runner application's directory (its .env is read by run.sh)
set -euo pipefail
set -a
# shellcheck source=/dev/null
. "$HOME/distci-runner.env"
set +a
: "${GH_TOKEN:?set GH_TOKEN in ~/distci-runner.env}"
: "${DISTCI_RUNNER_SCOPE:?set DISTCI_RUNNER_SCOPE (repos/OWNER/REPO or orgs/ORG) in ~/distci-runner.env}"
: "${DISTCI_RUNNER_LABELS:?set DISTCI_RUNNER_LABELS in ~/distci-runner.env}"
: "${DISTCI_RUNNER_DIR:?set DISTCI_RUNNER_DIR in ~/distci-runner.env}"
fields=(-f "name=$(uname -n)-$(date +%s)-$$" -F "runner_group_id=${DISTCI_RUNNER_GROUP_ID:-1}" -f work_folder=_work)
IFS=, read -ra labels <<< "$DISTCI_RUNNER_LABELS"
for label in "${labels[@]}"; do
    fields+=(-f "labels[]=$label")
done
jit=$(gh api -X POST "$DISTCI_RUNNER_SCOPE/actions/runners/generate-jitconfig" "${fields[@]}" --jq .encoded_jit_config)
cd "$DISTCI_RUNNER_DIR"
exec ./run.sh --jitconfig "$jit"
