-- wrk script of the bench's `create` workload (bench/workloads/create.py): POST /v1/jobs or /v1/jobs:batch with the
-- tenant's bearer token, a unique job name per job (and a unique Idempotency-Key per request when keyed).
--
-- Arguments (after wrk's `--`): token, mode ("single" or "batch"), jobs per batch, "keyed" or "plain",
-- pool, delaySeconds, the run's name prefix. The summary is one line `WRK_RESULT {json}` on stdout.

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  token, mode, size, keyed, pool, delay, run = args[1], args[2], tonumber(args[3]), args[4] == "keyed", args[5],
    args[6], args[7]
  headers = { ["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json" }
  path = mode == "batch" and "/v1/jobs:batch" or "/v1/jobs"
  job = '{"name":"%s","type":"DELAYED","delaySeconds":' .. delay .. ',"target":{"pool":"' .. pool
    .. '","handler":"echo"},"payload":{"n":%d}}'
  sent = 0
end

function request()
  sent = sent + 1
  local name = run .. "-" .. id .. "-" .. sent
  local body
  if mode == "batch" then
    local items = {}
    for i = 1, size do
      items[i] = string.format(job, name .. "-" .. i, i)
    end
    body = '{"jobs":[' .. table.concat(items, ",") .. "]}"
  else
    body = string.format(job, name, sent)
  end
  if keyed then
    headers["Idempotency-Key"] = name
  end
  return wrk.format("POST", path, headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,'
      .. '"status_errors":%d,"timeouts":%d,"latency_us":{"p50":%d,"p90":%d,"p95":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(95), latency:percentile(99), latency.max,
    latency.mean))
end
