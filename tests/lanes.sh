#!/usr/bin/env bash
# `make test`: the suite in two lanes at once, one per core, each a pytest session with a server stack of its own:
#   in-process — tests/unit and tests/integration (and the bench smoke, which runs a stack of its own and asserts
#                no timing), at ports TEST_PORTS + SUNDIAL_TEST_PORT_OFFSET;
#   processes  — tests/e2e and tests/faults (real Sundial processes, one test at a time), at that offset + 100.
# Each lane writes .sundial/test-logs/<lane>.log; a lane's whole log is printed when it ends (the slowest 15 tests
# of each lane at its end). Exits non-zero if either lane failed. Extra arguments go to both pytest sessions.
# Each lane runs in a session of its own (setsid): a signal a test sends to its own process group never reaches
# this script or the other lane; Ctrl-C or SIGTERM here stops both lanes' whole process groups.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${SUNDIAL_TEST_PORT_OFFSET:-0}
logs=.sundial/test-logs
mkdir -p "$logs"

started=$(date +%s)
SUNDIAL_TEST_PORT_OFFSET=$base setsid uv run --frozen pytest --durations=15 tests/unit tests/integration tests/e2e/test_bench_smoke.py "$@" \
    >"$logs/in-process.log" 2>&1 &
in_process=$!
SUNDIAL_TEST_PORT_OFFSET=$((base + 100)) setsid uv run --frozen pytest --durations=15 tests/e2e tests/faults --ignore=tests/e2e/test_bench_smoke.py "$@" \
    >"$logs/processes.log" 2>&1 &
processes=$!

stop() {
    echo "lanes.sh: $1 received: stopping both lanes" >&2
    kill -TERM -- "-$in_process" "-$processes" 2>/dev/null
    wait
    exit 130
}
trap 'stop SIGINT' INT
trap 'stop SIGTERM' TERM
trap 'stop SIGHUP' HUP

status=0
for lane in in-process processes; do
    pid=$in_process
    [ "$lane" = processes ] && pid=$processes
    wait "$pid" || status=1
    echo "===================== lane $lane ($logs/$lane.log) ====================="
    cat "$logs/$lane.log"
done
echo "make test: both lanes done in $(($(date +%s) - started)) s; $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
