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

/** Tokens of a run's stream (watchRun with tokens), live or from a checkpoint row. */
export interface TokenBatch {
  kind: "tokens";
  stream: string;
  attempt: number; // a new attempt starts again at seq 1
  firstSeq: number;
  tokens: string[];
  producedAt: Date | undefined;
  fromCheckpoint: boolean;
}

/** Tokens fromSeq..toSeq of an attempt the watcher will not get live (trimmed, or lost with Redis). */
export interface TokenGap {
  kind: "token_gap";
  stream: string;
  attempt: number;
  fromSeq: number;
  toSeq: number;
  reason: string;
}

/** The live channel went away (live false: tokens come only with checkpoints) or came back. */
export interface TokenChannel {
  kind: "token_channel";
  live: boolean;
  message: string;
}

export type TokenItem = TokenBatch | TokenGap | TokenChannel;

export interface WatchOptions {
  /** Also yield the token stream's TokenBatch, TokenGap and TokenChannel items. */
  tokens?: boolean;
  /** The token stream followed (default "output"). */
  tokenStream?: string;
}

function tokenItem(msg: WatchRunResponse): TokenItem | undefined {
  if (msg.tokenBatch !== undefined) {
    const b = msg.tokenBatch;
    return {
      kind: "tokens",
      stream: b.stream,
      attempt: b.attempt,
      firstSeq: b.firstSeq,
      tokens: b.tokens,
      producedAt: b.producedAt,
      fromCheckpoint: b.fromCheckpoint,
    };
  }
  if (msg.tokenGap !== undefined) {
    const g = msg.tokenGap;
    return { kind: "token_gap", stream: g.stream, attempt: g.attempt, fromSeq: g.fromSeq, toSeq: g.toSeq, reason: g.reason };
  }
  if (msg.tokenChannel !== undefined) return { kind: "token_channel", ...msg.tokenChannel };
  return undefined;
}

/**
 * Yields the run's events after `after`, in order, then the ended Run (with its output), and
 * returns; with `{ tokens: true }` also the token stream's items (each token once, in order; a
 * TokenGap for tokens it will not get live; a TokenChannel when the live channel goes or returns).
 * Another project's run rejects NOT_FOUND; an offset past the log's end INVALID_ARGUMENT.
 *
 *   for await (const item of watchRun(client, runId, 0, { tokens: true })) {
 *     if ("offset" in item) console.log(item.offset, item.source, item.kind, item.data);
 *     else if ("kind" in item && item.kind === "tokens") process.stdout.write(item.tokens.join(""));
 *     else if (!("kind" in item)) console.log("ended", item.status, item.output);
 *   }
 */
export async function* watchRun(
  client: Client,
  runId: string,
  after = 0,
  options: WatchOptions = {},
): AsyncGenerator<RunEvent | TokenItem | Run> {
  let tokenAttempt = 0;
  let tokenAfter = 0;
  for (;;) {
    const request = {
      runId,
      after,
      snapshot: false,
      untilSagaEnds: false,
      tokens: options.tokens ?? false,
      tokenStream: options.tokenStream ?? "",
      tokenAttempt,
      tokenAfter,
    };
    const stream = client.scheduler.watchRun(request, client.metadata);
    try {
      for await (const msg of stream as AsyncIterable<WatchRunResponse>) {
        if (msg.run !== undefined) {
          yield msg.run;
          return;
        }
        const item = tokenItem(msg);
        if (item !== undefined) {
          if (item.kind === "tokens") [tokenAttempt, tokenAfter] = [item.attempt, item.firstSeq + item.tokens.length - 1];
          if (item.kind === "token_gap") [tokenAttempt, tokenAfter] = [item.attempt, item.toSeq];
          yield item;
          continue;
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
