// Addresses and settings as the Python SDK and the CLI read them (pure functions of the environment).
import assert from "node:assert/strict";
import { test } from "node:test";
import { address, apiKey, channelTarget, workerHttpPort, workerLabels } from "../../src/index";

test("an address: given, else _ADDR, else _PORT on AWOOOP_HOST, else the awooop up port", () => {
  const env = { AWOOOP_SCHEDULER_ADDR: "sched:1", AWOOOP_SCHEDULER_PORT: "2", AWOOOP_HOST: "10.0.0.9" };
  assert.equal(address("scheduler", "given:3", env), "given:3");
  assert.equal(address("scheduler", undefined, env), "sched:1");
  assert.equal(address("scheduler", undefined, { AWOOOP_SCHEDULER_PORT: "2", AWOOOP_HOST: "10.0.0.9" }), "10.0.0.9:2");
  assert.equal(address("saga", undefined, {}), "127.0.0.1:50053");
  // a listener's "every interface" host is dialled on loopback; an IPv6 host gets brackets
  assert.equal(address("gateway", undefined, { AWOOOP_HOST: "0.0.0.0", AWOOOP_GATEWAY_PORT: "7" }), "127.0.0.1:7");
  assert.equal(address("gateway", undefined, { AWOOOP_HOST: "::", AWOOOP_GATEWAY_PORT: "7" }), "[::1]:7");
  assert.equal(address("saga", undefined, { AWOOOP_SAGA_PORT: "not-a-port" }), "127.0.0.1:50053");
  assert.equal(apiKey(undefined, { AWOOOP_API_KEY: "awk_x" }), "awk_x");
});

test("a comma-separated list of replicas becomes one target; host names in a list are refused", () => {
  assert.equal(channelTarget("dns:///scheduler:50052"), "dns:///scheduler:50052");
  assert.equal(channelTarget("10.0.0.1:50052, 10.0.0.2:50052"), "ipv4:10.0.0.1:50052,10.0.0.2:50052");
  assert.equal(channelTarget("[::1]:50052,[::2]:50052"), "ipv6:[::1]:50052,[::2]:50052");
  assert.throws(() => channelTarget("a.example:1,b.example:1"), /use dns:\/\/\/name:port/);
});

test("AWOOOP_WORKER_HTTP_PORT: unset serves nothing, a port number serves there, anything else is refused", () => {
  assert.equal(workerHttpPort({}), undefined);
  assert.equal(workerHttpPort({ AWOOOP_WORKER_HTTP_PORT: " 9464 " }), 9464);
  assert.equal(workerHttpPort({ AWOOOP_WORKER_HTTP_PORT: "0" }), 0);
  for (const bad of ["http", "-1", "65536", "94.6"]) {
    assert.throws(() => workerHttpPort({ AWOOOP_WORKER_HTTP_PORT: bad }), /AWOOOP_WORKER_HTTP_PORT: not a port number/);
  }
});

test("AWOOOP_WORKER_LABELS: key=value pairs, blanks ignored, a pair without = refused", () => {
  assert.deepEqual(workerLabels({ AWOOOP_WORKER_LABELS: " gpu=a100, region=eu ,," }), { gpu: "a100", region: "eu" });
  assert.deepEqual(workerLabels({}), {});
  assert.throws(() => workerLabels({ AWOOOP_WORKER_LABELS: "gpu" }), /not key=value/);
});
