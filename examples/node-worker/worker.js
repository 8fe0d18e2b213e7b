// An awooop worker in Node, from the project's protos/ alone: @grpc/grpc-js for the calls,
// @grpc/proto-loader for the contracts, protobufjs for google.rpc error details.
//
// It claims runs with a long-poll (retried safely with a claim id), renews the lease, journals a tool step with its compensation
// (BeginStep, then CompleteStep) and an LLM step (RecordStep), and completes the run. Then it shows
// how a lost lease reaches a client: as an outcome in Heartbeat's body, and as an error with a
// google.rpc.ErrorInfo (reason LEASE_LOST) from every other call.
//
//   AWOOOP_API_KEY          a key with the worker role in the project
//   AWOOOP_SCHEDULER_ADDR   else AWOOOP_SCHEDULER_PORT on AWOOOP_HOST, else 127.0.0.1:50052
//   AWOOOP_SAGA_ADDR        else AWOOOP_SAGA_PORT on AWOOOP_HOST, else 127.0.0.1:50053
//                           (the same order as the Python SDK and the CLI)
//   AWOOOP_PROJECT          default demo
//   AWOOOP_RUNS             runs to handle before exiting (default: run until SIGTERM)
//
// Every event is printed as one JSON line.
"use strict";

const path = require("node:path");
const { randomUUID } = require("node:crypto");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const PROTOS = process.env.AWOOOP_PROTOS || path.join(__dirname, "..", "..", "protos");

// keepCase: the field names of the .proto (run_id), as every doc and error message writes them;
// with the default (camelCase) `{run_id: ...}` is silently dropped and the server answers
// INVALID_ARGUMENT "run_id: required". enums: String gives "LEASE_OUTCOME_RENEWED", not 1.
// defaults: unset fields read as their zero value, as in every other proto3 language.
const LOADER = { keepCase: true, enums: String, longs: String, defaults: true, oneofs: true, includeDirs: [PROTOS] };
const defs = protoLoader.loadSync(
  ["awooop/scheduler/v1/scheduler.proto", "awooop/saga/v1/saga.proto"],
  LOADER,
);
const api = grpc.loadPackageDefinition(defs).awooop;

// google.rpc.Status and its details, to read grpc-status-details-bin (vendored in protos/google/rpc).
const rpc = new protobuf.Root();
rpc.resolvePath = (_origin, target) => (target.startsWith("google/protobuf/") ? target : path.join(PROTOS, target));
rpc.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
const Status = rpc.lookupType("google.rpc.Status");
const DETAILS = {
  "type.googleapis.com/google.rpc.ErrorInfo": rpc.lookupType("google.rpc.ErrorInfo"),
  "type.googleapis.com/google.rpc.BadRequest": rpc.lookupType("google.rpc.BadRequest"),
};

/** The ErrorInfo of a failed call ({reason, domain, metadata}), or null. */
function errorInfo(err) {
  const raw = err.metadata && err.metadata.get("grpc-status-details-bin")[0];
  if (!raw) return null;
  for (const any of Status.decode(raw).details) {
    if (any.type_url === "type.googleapis.com/google.rpc.ErrorInfo") {
      return DETAILS[any.type_url].toObject(DETAILS[any.type_url].decode(any.value), { defaults: true });
    }
  }
  return null;
}

// google.protobuf.Struct as proto-loader gives it: {fields: {k: {kind: "stringValue", stringValue: "x"}}}.
function toValue(v) {
  if (v === null || v === undefined) return { nullValue: "NULL_VALUE" };
  if (typeof v === "number") return { numberValue: v };
  if (typeof v === "string") return { stringValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  return { structValue: toStruct(v) };
}
function toStruct(obj) {
  return { fields: Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, toValue(v)])) };
}
function fromValue(v) {
  switch (v.kind) {
    case "structValue": return fromStruct(v.structValue);
    case "listValue": return v.listValue.values.map(fromValue);
    case "nullValue": return null;
    default: return v[v.kind];
  }
}
function fromStruct(s) {
  return Object.fromEntries(Object.entries((s && s.fields) || {}).map(([k, v]) => [k, fromValue(v)]));
}

const emit = (event) => console.log(JSON.stringify(event));

/** A service's address: AWOOOP_<NAME>_ADDR, else AWOOOP_<NAME>_PORT on AWOOOP_HOST, else the default. */
function address(name, defaultPort) {
  const env = process.env;
  if (env[`AWOOOP_${name}_ADDR`]) return env[`AWOOOP_${name}_ADDR`];
  const port = (env[`AWOOOP_${name}_PORT`] || "").trim();
  // a listener bound to every interface is dialled on loopback
  const bound = (env.AWOOOP_HOST || "").trim();
  const host = { "": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1" }[bound] ?? bound;
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return `${hostPart}:${/^\d+$/.test(port) ? port : defaultPort}`;
}

const creds = grpc.credentials.createInsecure();
const scheduler = new api.scheduler.v1.SchedulerService(address("SCHEDULER", 50052), creds);
const saga = new api.saga.v1.SagaService(address("SAGA", 50053), creds);
const auth = new grpc.Metadata();
auth.set("authorization", `Bearer ${process.env.AWOOOP_API_KEY}`);

/** One unary call as a promise, with a deadline (long-polls pass a longer one). */
function call(client, method, request, seconds = 30) {
  return new Promise((resolve, reject) => {
    client[method](request, auth, { deadline: Date.now() + seconds * 1000 }, (err, resp) =>
      err ? reject(err) : resolve(resp),
    );
  });
}

const WORKER_ID = `node-${process.pid}`;

// Retried claims: a claim that committed but whose answer was lost (a deadline, a dropped
// connection) would leave its run RUNNING for nobody until the lease expires. A claim id, fresh
// per claim and the same on every retry of it, makes the scheduler answer the retry with the
// runs that claim took (same leases) instead of claiming more.
const RETRY = [grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED];

/** One claim (a long-poll), retried up to 4 times with its claim id while its outcome is unknown. */
async function claim(project) {
  const request = {
    worker_id: WORKER_ID, project_ids: [project], max_runs: 1, wait: { seconds: 10, nanos: 0 },
    claim_id: randomUUID(),
  };
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await call(scheduler, "ClaimRuns", request, 20);
    } catch (err) {
      if (attempt >= 4 || !RETRY.includes(err.code)) throw err;
      await new Promise((resolve) => setTimeout(resolve, 200 * 2 ** attempt));
    }
  }
}

async function handle(claimed) {
  const lease = claimed.lease; // the fencing token {run_id, attempt}: sent with every write
  const input = fromStruct(claimed.run.input);
  emit({ event: "claimed", run_id: lease.run_id, attempt: lease.attempt, resumed: claimed.resumed, input });

  const hb = await call(scheduler, "Heartbeat", { worker_id: WORKER_ID, leases: [lease] });
  emit({ event: "heartbeat", outcome: hb.renewals[0].outcome });

  // a tool step: journal it before calling the tool, so a crash mid-call leaves a pending record
  const params = { deployment: "api", replicas: 3 };
  const begun = await call(saga, "BeginStep", {
    lease, step_id: "scale", step_type: "STEP_TYPE_TOOL_CALL", tool_id: "k8s_scale_deployment",
    tool_params: toStruct(params),
  });
  emit({ event: "begin_step", step_id: "scale", action: begun.action, idempotency_key: begun.idempotency_key });
  if (begun.action !== "STEP_ACTION_SKIP") {
    const result = { deployment: "api", previous_replicas: 1, replicas: 3 }; // the tool's answer
    await call(saga, "CompleteStep", {
      lease, step_id: "scale", result: toStruct(result),
      compensation_cmd: {
        tool_id: "k8s_scale_deployment", params: toStruct({ deployment: "api", replicas: 1 }), reason: "scale back",
      },
    });
    emit({ event: "complete_step", step_id: "scale" });
  }

  // an LLM step: finished before it is journaled, nothing to undo
  const rec = await call(saga, "RecordStep", {
    lease, step_id: "diagnose", step_type: "STEP_TYPE_LLM_CALL", result: toStruct({ cause: "cpu saturated" }),
  });
  emit({ event: "record_step", step_id: "diagnose", recorded: rec.recorded, status: rec.step.status });

  const done = await call(scheduler, "CompleteRun", { lease, output: toStruct({ scaled_to: 3 }) });
  emit({ event: "completed", run_id: done.run.run_id, status: done.run.status, saga_status: done.run.saga_status });

  // The lease ended with the run. Heartbeat answers per lease in its body (a batch renews many
  // leases; one lost lease must not fail the others) ...
  const after = await call(scheduler, "Heartbeat", { worker_id: WORKER_ID, leases: [lease] });
  emit({ event: "heartbeat_after_complete", outcome: after.renewals[0].outcome });
  // ... every other call fails with FAILED_PRECONDITION and an ErrorInfo whose reason is LEASE_LOST.
  try {
    await call(saga, "RecordStep", {
      lease, step_id: "late", step_type: "STEP_TYPE_LLM_CALL", result: toStruct({ too: "late" }),
    });
    emit({ event: "unexpected_success" });
  } catch (err) {
    const info = errorInfo(err);
    emit({ event: "lease_lost", code: err.code, code_name: grpc.status[err.code], reason: info && info.reason,
      domain: info && info.domain, metadata: info && info.metadata });
  }
}

async function main() {
  let left = Number(process.env.AWOOOP_RUNS || "0") || Infinity;
  let stopping = false;
  process.on("SIGTERM", () => { stopping = true; });
  emit({ event: "started", worker_id: WORKER_ID });
  while (!stopping && left > 0) {
    // long-poll: the scheduler holds the call up to `wait` until a run is ready
    const resp = await claim(process.env.AWOOOP_PROJECT || "demo");
    for (const claimed of resp.runs) {
      await handle(claimed);
      left -= 1;
    }
  }
  scheduler.close();
  saga.close();
}

main().catch((err) => {
  const info = errorInfo(err);
  emit({ event: "error", code_name: grpc.status[err.code], message: err.details || String(err), reason: info && info.reason });
  process.exit(1);
});
