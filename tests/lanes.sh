#!/usr/bin/env bash
# `make test`: the suite in two lanes at once, one per core, each a pytest session with a server stack of its own:
#   in-process — tests/unit and tests/integration, at ports TEST_PORTS + SUNDIAL_TEST_PORT_OFFSET;
#   processes  — tests/e2e and tests/faults (real Sundial processes, one test at a time), at that offset + 100.
# Each lane writes .sundial/test-logs/<lane>.log; a lane's whole log is printed when it ends (the slowest 15 tests
# of each lane at its end). Exits non-zero if either lane failed. Extra arguments go to both pytest sessions.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${SUNDIAL_TEST_PORT_OFFSET:-0}
logs=.sundial/test-logs
mkdir -p "$logs"

lane() {  # lane NAME OFFSET PATHS... [-- pytest args]
    local name=$1 offset=$2
    shift 2
    SUNDIAL_TEST_PORT_OFFSET=$offset uv run --frozen pytest --durations=15 "$@" >"$logs/$name.log" 2>&1
}

started=$(date +%s)
lane in-process "$base" tests/unit tests/integration "$@" &
in_process=$!
lane processes "$((base + 100))" tests/e2e tests/faults "$@" &
processes=$!
trap 'kill "$in_process" "$processes" 2>/dev/null; wait' INT TERM

status=0
for pair in "in-process:$in_process" "processes:$processes"; do
    name=${pair%%:*}
    wait "${pair#*:}" || status=1
    echo "===================== lane $name ($logs/$name.log) ====================="
    cat "$logs/$name.log"
done
echo "make test: both lanes done in $(($(date +%s) - started)) s; $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
