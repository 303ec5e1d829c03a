#!/usr/bin/env bash
# Fail the step with a message shown as an error annotation in the run's UI.
set -euo pipefail
echo "::error::$*"
exit 1
