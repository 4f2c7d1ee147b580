#!/usr/bin/env bash
# `make test`: the suite in three lanes at once, each a pytest session with a server stack of its own:
#   in-process — tests/unit, tests/contracts and tests/integration (and the bench smoke, which runs a stack of its
#                own and asserts no timing; and tests/docs, the documentation's examples on one stack of real
#                processes of its own), at ports TEST_PORTS + SUNDIAL_TEST_PORT_OFFSET;
#   e2e        — tests/e2e and tests/console (real Sundial processes, one test at a time; the console's in a real
#                browser), at that offset + 100;
#   faults     — tests/faults (real processes, one fault at a time), at that offset + 200.
# The process lanes mostly wait on real time (leases, timeouts, restarts), so three fit two cores.
# Each lane writes .sundial/test-logs/<lane>.log. While they run, one status line every LANES_PROGRESS_SEC (default
# 30) says how many tests each lane has done and failed so far (read from pytest's progress in its log), and a lane
# that ends says so at once with pytest's summary line; every lane's whole log is printed once all have ended (the
# slowest 15 tests of each lane at its end). Exits non-zero if any lane failed. Extra arguments go to every pytest
# session.
# Each lane runs in a session of its own (setsid): a signal a test sends to its own process group never reaches
# this script or another lane; Ctrl-C or SIGTERM here stops every lane's whole process group.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${SUNDIAL_TEST_PORT_OFFSET:-0}
# Every process the suite starts may use the development signing key (tests/conftest.py sets it too).
export SUNDIAL_ENV=dev
logs=.sundial/test-logs
mkdir -p "$logs"

started=$(date +%s)
lanes=(in-process e2e faults)
declare -A pids
lane() {  # name, port offset, pytest arguments...
    local name=$1 offset=$2
    shift 2
    SUNDIAL_TEST_PORT_OFFSET=$offset setsid uv run --frozen pytest --durations=15 "$@" >"$logs/$name.log" 2>&1 &
    pids[$name]=$!
}
lane in-process "$base" tests/unit tests/contracts tests/integration tests/e2e/test_bench_smoke.py tests/docs "$@"
lane e2e $((base + 100)) tests/e2e tests/console tests/conformance --ignore=tests/e2e/test_bench_smoke.py "$@"
lane faults $((base + 200)) tests/faults "$@"

stop() {
    echo "lanes.sh: $1 received: stopping every lane" >&2
    for name in "${lanes[@]}"; do kill -TERM -- "-${pids[$name]}" 2>/dev/null; done
    wait
    exit 130
}
trap 'stop SIGINT' INT
trap 'stop SIGTERM' TERM
trap 'stop SIGHUP' HUP

# "<done>/<collected> done, <failed> failed" of a lane, from its log: pytest writes one character per test
# (. passed, F failed, E error, s skipped, x/X xfail/xpass) after the file's name (or alone with -q), and a line
# "collected N items" first.
progress() {
    awk '
        /^collected [0-9]+ item/ { total = $2 }
        /^([^ ]+\.py )?[.FEsxX]+ *(\[ *[0-9]+%\])?$/ {
            line = $0; sub(/ *\[ *[0-9]+%\]$/, "", line); sub(/^[^ ]+\.py /, "", line)
            done += length(line); failed += gsub(/[FE]/, "", line)
        }
        END { printf "%d/%s done, %d failed", done, (total == "" ? "?" : total), failed }
    ' "$1"
}

status=0
every=${LANES_PROGRESS_SEC:-30}
declare -A ended
n_ended=0
next_report=$(($(date +%s) + every))
while [ $n_ended -lt ${#lanes[@]} ]; do
    for name in "${lanes[@]}"; do
        [ -n "${ended[$name]:-}" ] && continue
        kill -0 "${pids[$name]}" 2>/dev/null && continue
        wait "${pids[$name]}"
        code=$?
        ended[$name]=$code
        n_ended=$((n_ended + 1))
        [ "$code" = 0 ] || status=1
        summary=$(grep -E '^=+ .*(passed|failed|error|no tests ran).* =+$' "$logs/$name.log" | tail -n 1 | tr -d '=')
        echo "lanes.sh: lane $name ended after $(($(date +%s) - started)) s (exit $code):${summary:- $(progress "$logs/$name.log")}"
    done
    [ $n_ended -lt ${#lanes[@]} ] || break
    if [ "$(date +%s)" -ge "$next_report" ]; then
        line=""
        for name in "${lanes[@]}"; do
            line+="  $name: $(progress "$logs/$name.log")$([ -n "${ended[$name]:-}" ] && echo ' (ended)')"
        done
        echo "lanes.sh: $(($(date +%s) - started)) s;$line"
        next_report=$(($(date +%s) + every))
    fi
    sleep 1
done
for name in "${lanes[@]}"; do
    echo "===================== lane $name ($logs/$name.log) ====================="
    cat "$logs/$name.log"
done
echo "make test: every lane done in $(($(date +%s) - started)) s; $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
