// A Sundial worker in Node.js (no dependencies) for the worker gateway: echo, sleep, fail, crash
// (the handler contract of tests/conformance). Holds only a pool token.
// Usage: SUNDIAL_WORKER_GATEWAY=http://127.0.0.1:8081 SUNDIAL_WORKER_TOKEN=<pool token> node gateway-worker.mjs
import { randomBytes } from "node:crypto";

const gateways = process.env.SUNDIAL_WORKER_GATEWAY.split(",").map((url) => url.trim());
let token = process.env.SUNDIAL_WORKER_TOKEN;
let current = 0;
const session = `node-${randomBytes(8).toString("hex")}`;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// POST to the current gateway; on a network error or a 5xx, move to the next one and try again.
async function call(path, body) {
  for (;;) {
    try {
      const response = await fetch(`${gateways[current]}/v1/worker/${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ session, ...body }),
      });
      if (response.ok) return await response.json();
      if (response.status < 500) throw new Error(`${path}: ${response.status} ${await response.text()}`);
    } catch (error) {
      if (!(error instanceof TypeError)) throw error; // fetch's network errors are TypeErrors
    }
    current = (current + 1) % gateways.length;
    await sleep(200);
  }
}

const held = (lease) => ({ executionId: lease.executionId, attempt: lease.attempt, attemptToken: lease.attemptToken });
const finish = (lease, outcome) => call("finish", { outcomes: [{ ...held(lease), ...outcome }] });

// Renews the attempt while the handler runs (every 2 s, with its latest progress); says when to stop.
function heartbeats(lease) {
  const state = { progress: undefined, stop: false };
  const timer = setInterval(async () => {
    const { running } = await call("heartbeat", { running: [{ ...held(lease), progress: state.progress }] });
    if (!running[0].renewed || running[0].cancel) state.stop = true;
  }, 2000);
  return { state, done: () => clearInterval(timer) };
}

const handlers = {
  echo: async (payload) => payload,
  sleep: async (payload, beat) => {
    let slept = 0;
    for (; slept < (payload.seconds ?? 1) && !beat.stop; slept++) {
      await sleep(1000);
      beat.progress = { slept: slept + 1 };
    }
    if (beat.stop) throw Object.assign(new Error("cancelled"), { cancelled: true });
    return { slept };
  },
  fail: async (payload) => {
    throw Object.assign(new Error(payload.message ?? "asked to fail"), { name: "ConformanceError" });
  },
  crash: async () => process.kill(process.pid, "SIGKILL"),
};

async function run(lease) {
  const beat = heartbeats(lease);
  try {
    const handler = handlers[lease.handler];
    if (!handler) throw Object.assign(new Error(lease.handler), { name: "UnknownHandler" });
    await finish(lease, { state: "SUCCEEDED", result: await handler(lease.payload, beat.state) });
  } catch (error) {
    const state = error.cancelled ? "CANCELLED" : "FAILED";
    await finish(lease, { state, error: { type: error.name, message: error.message, traceback: error.stack } });
  } finally {
    beat.done();
  }
}

let stopping = false;
process.on("SIGTERM", () => (stopping = true));
const running = new Set();
let pulls = 0;
while (!stopping) {
  if (++pulls % 100 === 0) token = (await call("token", {})).token; // refresh before it expires
  const free = Math.max(1, 4 - running.size); // what this worker is, announced as a live worker of the pool
  const worker = { concurrency: 4, freeSlots: free, handlers: Object.keys(handlers), version: "example" };
  const { executions } = await call("pull", { max: free, waitMs: 2000, worker });
  for (const lease of executions) {
    const task = run(lease).finally(() => running.delete(task));
    running.add(task);
  }
  while (running.size >= 4) await Promise.race(running);
}
await Promise.all(running);
