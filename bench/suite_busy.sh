#!/usr/bin/env bash
# The whole test suite N times in a row with the other core kept busy (issue #36).
# A fresh clone of HEAD, the README's set-up and main job (as .ci/run), then the README's test command N times beside one
# process that spins a core for the whole time; stops at the first failure. Prints one line a run.
#   bench/suite_busy.sh [RUNS=3] [LOG_DIR]
set -uo pipefail
runs=${1:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d -t meshplan-busy.XXXXXX)
logs=${2:-$work/logs}
mkdir -p "$logs"
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 PREFECT_RUNNER_POLL_FREQUENCY=1
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset PREFECT_API_URL

git clone -q "$repo" "$work/clone" && cd "$work/clone" || exit 1
echo "commit $(git rev-parse --short HEAD), logs in $logs"
python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 && .venv/bin/pip install -q -e '.[dev]' \
  && PREFECT_HOME="$work/prefect0" .venv/bin/meshplan --state-dir "$work/state" run >"$logs/main_job.txt" 2>&1 \
  || { echo "set-up or the main job failed: $logs/main_job.txt"; exit 1; }
echo "README command 1 (set-up and the main job): ok"

python3 -c 'while True: pass' &   # the busy core, at the suite's own priority
spin=$!
trap 'kill $spin 2>/dev/null; rm -rf "$work/clone"' EXIT

rc=0
for i in $(seq 1 "$runs"); do
  export PREFECT_HOME="$work/prefect$i" PREFECT_LOCAL_STORAGE_PATH="$work/prefect$i/storage"
  t0=$(date +%s)
  setsid .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 >"$logs/run$i.txt" 2>&1 &
  pid=$!
  wait "$pid"; rc=$?
  kill -- -"$pid" 2>/dev/null
  echo "run $i: rc=$rc, $(( $(date +%s) - t0 )) s wall, load $(cut -d' ' -f1-3 /proc/loadavg): $(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$logs/run$i.txt" | tail -1)"
  [ "$rc" -ne 0 ] && break
done
exit $rc
