// OpenTelemetry spans, as the Python SDK's (awooop/worker/tracing.py): a claimed run's handler runs
// in a span `awooop.worker.run` of the run's trace (ClaimedRun.traceparent), after a span
// `awooop.run.claim` covering the queue wait (from ClaimedRun.claimable_since); steps, approvals
// and child runs are child spans; calls made inside a span carry it as W3C `traceparent` metadata,
// so the scheduler's and saga's spans join the trace.
//
// Only @opentelemetry/api is used: without an SDK registered (or a tracerProvider given) its tracer
// makes no spans of its own, and then nothing is traced and nothing is added to a call. Nested
// spans and the metadata follow the active context, which needs the context manager every OTel
// Node SDK registers (NodeTracerProvider.register(), NodeSDK); without one, spans still nest under
// their run.
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  isSpanContextValid,
  trace,
  type Attributes,
  type Context,
  type Span,
  type SpanContext,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";

export const SCOPE = "awooop.worker";

/** The tracer of `provider`, else of the global provider (a no-op one until an SDK registers). */
export function tracerOf(provider?: TracerProvider): Tracer {
  return (provider ?? trace.getTracerProvider()).getTracer(SCOPE);
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** The remote span context a W3C traceparent names; undefined when it is malformed or invalid. */
export function parseTraceparent(header: string): SpanContext | undefined {
  const m = TRACEPARENT.exec(header.trim());
  if (m === null || m[1] === "ff" || (m[1] === "00" && m[5] !== undefined)) return undefined;
  const sc = { traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4], 16) & 1, isRemote: true };
  return isSpanContextValid(sc) ? sc : undefined;
}

/** A span context as a W3C traceparent (version 00). */
export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** The traceparent to send with a call made now: the active span's, or "" outside any span. */
export function activeTraceparent(): string {
  const sc = trace.getSpanContext(context.active());
  return sc !== undefined && isSpanContextValid(sc) ? formatTraceparent(sc) : "";
}

/** True when the tracer made a span of its own (a no-op tracer hands back its parent's, or an invalid one). */
function ownSpan(span: Span, parent: Context): boolean {
  const sc = span.spanContext();
  return isSpanContextValid(sc) && sc.spanId !== trace.getSpanContext(parent)?.spanId;
}

/**
 * The span of one claimed run: `awooop.worker.run` (kind CONSUMER), a child of the run's
 * traceparent when there is one, after an `awooop.run.claim` span from claimableSince to now.
 * Undefined when tracing is off.
 */
export function startRunSpan(
  tracer: Tracer,
  run: { traceparent: string; claimableSince?: Date; attributes: Attributes },
): Span | undefined {
  const remote = parseTraceparent(run.traceparent);
  let parent = remote ? trace.setSpanContext(ROOT_CONTEXT, remote) : ROOT_CONTEXT;
  if (remote && run.claimableSince) {
    const claim = tracer.startSpan("awooop.run.claim", { startTime: run.claimableSince }, parent);
    claim.end();
    if (!ownSpan(claim, parent)) return undefined;
    parent = trace.setSpan(parent, claim);
  }
  const span = tracer.startSpan("awooop.worker.run", { kind: SpanKind.CONSUMER, attributes: run.attributes }, parent);
  if (ownSpan(span, parent)) return span;
  span.end();
  return undefined;
}

/**
 * fn inside a span `name` (active while fn runs), a child of the active span, else of `fallback`
 * (the run's, when no context manager carries it); an error fn throws is recorded on the span.
 */
export async function inSpan<T>(
  tracer: Tracer,
  name: string,
  fallback: Context,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
): Promise<T> {
  const parent = trace.getSpan(context.active()) !== undefined ? context.active() : fallback;
  const span = tracer.startSpan(name, { attributes }, parent);
  try {
    return await context.with(trace.setSpan(parent, span), () => fn(span));
  } catch (err) {
    span.recordException(err instanceof Error ? err : String(err));
    span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message : String(err) });
    throw err;
  } finally {
    span.end();
  }
}

/** fn with no span active: batched calls for many runs (Heartbeat, ClaimRuns, CompleteRuns) belong to no run's trace. */
export function untraced<T>(fn: () => T): T {
  return context.with(ROOT_CONTEXT, fn);
}
