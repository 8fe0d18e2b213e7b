// Watching a run: its log (state changes, journal steps, progress events) from an offset, then
// live, then the ended run (WatchRun). A dropped stream (UNAVAILABLE: a scheduler draining) is
// resumed after the last offset received, so a caller sees every event once, in order.
import { status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

import type { Client } from "./client";
import { AwooopError } from "./errors";
import type { Run } from "./gen/awooop/common/v1/common";
import { RunEventSource, type WatchRunResponse } from "./gen/awooop/scheduler/v1/scheduler";

export type EventSource = "state" | "step" | "progress" | "unknown";

/** One row of a run's log. */
export interface RunEvent {
  offset: number;
  source: EventSource;
  kind: string;
  data: { [key: string]: unknown };
  attempt: number;
  at: Date | undefined;
}

const SOURCES: Record<number, EventSource> = {
  [RunEventSource.RUN_EVENT_SOURCE_STATE]: "state",
  [RunEventSource.RUN_EVENT_SOURCE_STEP]: "step",
  [RunEventSource.RUN_EVENT_SOURCE_PROGRESS]: "progress",
};
const RESUME_BACKOFF_MS = 200;

/**
 * Yields the run's events after `after`, in order, then the ended Run (with its output), and
 * returns. Another project's run rejects NOT_FOUND; an offset past the log's end INVALID_ARGUMENT.
 *
 *   for await (const item of watchRun(client, runId)) {
 *     if ("offset" in item) console.log(item.offset, item.source, item.kind, item.data);
 *     else console.log("ended", item.status, item.output);
 *   }
 */
export async function* watchRun(client: Client, runId: string, after = 0): AsyncGenerator<RunEvent | Run> {
  for (;;) {
    const stream = client.scheduler.watchRun({ runId, after, snapshot: false, untilSagaEnds: false }, client.metadata);
    try {
      for await (const msg of stream as AsyncIterable<WatchRunResponse>) {
        if (msg.run !== undefined) {
          yield msg.run;
          return;
        }
        const e = msg.event;
        if (e === undefined) continue;
        after = e.offset;
        yield {
          offset: e.offset,
          source: SOURCES[e.source] ?? "unknown",
          kind: e.kind,
          data: e.data ?? {},
          attempt: e.attempt,
          at: e.at,
        };
      }
    } catch (err) {
      const se = err as ServiceError;
      if (se.code !== GrpcStatus.UNAVAILABLE) throw AwooopError.fromServiceError(se, "WatchRun");
    } finally {
      stream.cancel();
    }
    await new Promise((resolve) => setTimeout(resolve, RESUME_BACKOFF_MS)); // dropped: resume after `after`
  }
}
