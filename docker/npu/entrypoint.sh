#!/bin/bash
# Sets up the CANN environment the way Ascend documents it (source set_env.sh), adds the
# host driver's libraries mounted at run time, then runs the container's command.
for script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
  if [ -f "$script" ]; then
    # shellcheck disable=SC1090
    source "$script"
  fi
done
for dir in /usr/local/Ascend/driver/lib64/common /usr/local/Ascend/driver/lib64/driver; do
  if [ -d "$dir" ]; then
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
export LD_LIBRARY_PATH
exec "$@"
