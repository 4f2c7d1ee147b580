#!/usr/bin/env bash
# A Sundial worker in shell (curl + jq) for the worker gateway: echo, sleep, fail, crash (see tests/conformance).
# Usage: SUNDIAL_WORKER_GATEWAY=http://127.0.0.1:8081 SUNDIAL_WORKER_TOKEN=<pool token> ./gateway-worker.sh
set -euo pipefail
GW=${SUNDIAL_WORKER_GATEWAY%%,*}; TOKEN=$SUNDIAL_WORKER_TOKEN; SESSION="sh-$(od -An -tx8 -N8 /dev/urandom | tr -d ' ')"
call() { curl -sf -X POST "$GW/v1/worker/$1" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d "$2"; }
finish() { call finish "$(jq -nc --arg s "$SESSION" --argjson e "$1" --argjson o "$2" \
  '{session: $s, outcomes: [{executionId: $e.executionId, attempt: $e.attempt, attemptToken: $e.attemptToken} + $o]}')" >/dev/null; }
beat() { call heartbeat "$(jq -nc --arg s "$SESSION" --argjson e "$1" --argjson p "$2" \
  '{session: $s, running: [{executionId: $e.executionId, attempt: $e.attempt, attemptToken: $e.attemptToken, progress: $p}]}')" \
  | jq -r '.running[0] | if .renewed and (.cancel | not) then "run" else "stop" end'; }
trap 'exit 0' TERM INT
pulls=0
while true; do
  if (( ++pulls % 100 == 0 )); then TOKEN=$(call token '{}' | jq -r .token); fi  # refresh before it expires
  call pull "{\"session\":\"$SESSION\",\"max\":1,\"waitMs\":5000}" | jq -c '.executions[]' | while read -r e; do
    case $(jq -r .handler <<<"$e") in
      echo) finish "$e" "$(jq -c '{state: "SUCCEEDED", result: .payload}' <<<"$e")" ;;
      sleep) state=SUCCEEDED
        for ((i = 1; i <= $(jq -r '.payload.seconds // 1' <<<"$e"); i++)); do
          sleep 1; [[ $(beat "$e" "{\"slept\":$i}") == run ]] || { state=CANCELLED; break; }
        done
        finish "$e" "{\"state\":\"$state\",\"result\":{\"slept\":$((i - 1))}}" ;;
      fail) finish "$e" "$(jq -c '{state: "FAILED", error: {type: "ConformanceError", message: (.payload.message // "asked to fail")}}' <<<"$e")" ;;
      crash) kill -9 0 ;;  # the worker dies mid-attempt (its process group): the sweeper takes it back
      *) finish "$e" "$(jq -c '{state: "FAILED", error: {type: "UnknownHandler", message: .handler}}' <<<"$e")" ;;
    esac
  done
done
