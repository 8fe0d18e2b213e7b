// Spans of a run and its steps (tracing.ts) with the real OpenTelemetry SDK and its in-memory
// exporter, and with no SDK at all (the API's no-op tracer): nothing made, nothing sent.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import {
  activeTraceparent,
  formatTraceparent,
  inSpan,
  parseTraceparent,
  startRunSpan,
  tracerOf,
  untraced,
} from "../../src/tracing";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT = "00f067aa0ba902b7";

const contextManager = new AsyncLocalStorageContextManager().enable();
context.setGlobalContextManager(contextManager);
after(() => context.disable());

function sdk(): { exporter: InMemorySpanExporter; provider: BasicTracerProvider } {
  const exporter = new InMemorySpanExporter();
  return { exporter, provider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }) };
}

test("a W3C traceparent is parsed and formatted; malformed and all-zero ones are refused", () => {
  const sc = parseTraceparent(`00-${TRACE}-${PARENT}-01`);
  assert.deepEqual(sc, { traceId: TRACE, spanId: PARENT, traceFlags: 1, isRemote: true });
  assert.equal(formatTraceparent(sc!), `00-${TRACE}-${PARENT}-01`);
  assert.equal(parseTraceparent(`cc-${TRACE}-${PARENT}-00-future`)?.traceFlags, 0); // a later version's extra field
  for (const bad of [
    "",
    `00-${TRACE}-${PARENT}`,
    `00-${TRACE}-${PARENT}-01-extra`, // version 00 has four fields
    `ff-${TRACE}-${PARENT}-01`,
    `00-${"0".repeat(32)}-${PARENT}-01`,
    `00-${TRACE}-${"0".repeat(16)}-01`,
    `00-${TRACE.toUpperCase()}-${PARENT}-01`,
  ]) {
    assert.equal(parseTraceparent(bad), undefined, bad);
  }
});

test("a run's span continues its trace after a claim span covering the queue wait; steps nest and are sent along", async () => {
  const { exporter, provider } = sdk();
  const tracer = tracerOf(provider);
  const claimableSince = new Date(Date.now() - 1500);
  const run = startRunSpan(tracer, {
    traceparent: `00-${TRACE}-${PARENT}-01`,
    claimableSince,
    attributes: { "awooop.run_id": "r1", "awooop.attempt": 2 },
  });
  assert.ok(run !== undefined);
  const runContext = trace.setSpan(ROOT_CONTEXT, run);
  let sent = "";
  await context.with(runContext, () =>
    inSpan(tracer, "awooop.worker.step", ROOT_CONTEXT, { "awooop.step_id": "scale" }, async (span) => {
      sent = activeTraceparent(); // what a call made inside the step carries
      span.setAttribute("awooop.action", "execute");
    }),
  );
  run.end();
  const spans = exporter.getFinishedSpans();
  const byName = new Map(spans.map((s) => [s.name, s]));
  const claim = byName.get("awooop.run.claim")!;
  const runSpan = byName.get("awooop.worker.run")!;
  const step = byName.get("awooop.worker.step")!;
  assert.equal(spans.length, 3);
  for (const s of spans) assert.equal(s.spanContext().traceId, TRACE);
  assert.equal(claim.parentSpanContext?.spanId, PARENT);
  assert.equal(claim.startTime[0], Math.floor(claimableSince.getTime() / 1000)); // from when the run became claimable
  assert.equal(runSpan.parentSpanContext?.spanId, claim.spanContext().spanId);
  assert.equal(runSpan.kind, SpanKind.CONSUMER);
  assert.deepEqual(runSpan.attributes, { "awooop.run_id": "r1", "awooop.attempt": 2 });
  assert.equal(step.parentSpanContext?.spanId, runSpan.spanContext().spanId);
  assert.equal(step.attributes["awooop.action"], "execute");
  assert.equal(sent, `00-${TRACE}-${step.spanContext().spanId}-01`);
  // the worker's loops run untraced: their batched calls carry no run's trace
  assert.equal(context.with(runContext, () => untraced(activeTraceparent)), "");
});

test("a step falls back to its run's span without a context manager carrying it, and records what it threw", async () => {
  const { exporter, provider } = sdk();
  const tracer = tracerOf(provider);
  const run = startRunSpan(tracer, { traceparent: "", attributes: {} })!; // an untraced run: a trace of its own
  await assert.rejects(
    inSpan(tracer, "awooop.worker.step", trace.setSpan(ROOT_CONTEXT, run), {}, async () => {
      throw new TypeError("bad params");
    }),
    TypeError,
  );
  run.end();
  const [step, runSpan] = exporter.getFinishedSpans();
  assert.equal(runSpan.name, "awooop.worker.run");
  assert.equal(runSpan.parentSpanContext, undefined);
  assert.equal(step.parentSpanContext?.spanId, runSpan.spanContext().spanId);
  assert.equal(step.status.code, SpanStatusCode.ERROR);
  assert.equal(step.events[0]?.name, "exception");
});

test("without an OpenTelemetry SDK nothing is traced and no traceparent is sent", () => {
  const tracer = tracerOf(); // the global provider: none registered in this process
  const run = startRunSpan(tracer, {
    traceparent: `00-${TRACE}-${PARENT}-01`,
    claimableSince: new Date(),
    attributes: {},
  });
  assert.equal(run, undefined);
  assert.equal(startRunSpan(tracer, { traceparent: "", attributes: {} }), undefined);
  assert.equal(activeTraceparent(), "");
});
