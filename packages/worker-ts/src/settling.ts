// Calls that settle a run (complete, fail, hand back, acknowledge a cancel), tried again until a
// deadline. The channel's own retries cover a refused connection for a few tenths of a second; a
// scheduler that is slow or briefly away outlasts them. A settling call that ended UNAVAILABLE or
// DEADLINE_EXCEEDED is safe to send again: the scheduler answers a repeated completion or failure
// of the same lease with the same success, and a repeated ReleaseRun with LEASE_LOST. Every other
// error is an answer.
import { status as Code } from "@grpc/grpc-js";
import { AwooopError } from "./errors";
import { now, sleep } from "./time";

const RETRY_CODES: readonly Code[] = [Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED];
const MIN_TIMEOUT = 0.5; // every try gets at least this long, even when the deadline is (nearly) over
const FIRST_BACKOFF = 0.1;
const MAX_BACKOFF = 1.0;

/**
 * Awaits call(timeout), again after UNAVAILABLE / DEADLINE_EXCEEDED while deadline() (monotonic
 * seconds, asked before each try: it may move) has not passed; rejects with the last error.
 * There is always a first try; timeout is the time left (at least MIN_TIMEOUT).
 */
export async function until<T>(deadline: () => number, call: (timeout: number) => Promise<T>): Promise<T> {
  let backoff = FIRST_BACKOFF;
  for (;;) {
    try {
      return await call(Math.max(deadline() - now(), MIN_TIMEOUT));
    } catch (err) {
      if (!(err instanceof AwooopError) || !RETRY_CODES.includes(err.code) || now() + backoff >= deadline()) {
        throw err;
      }
    }
    await sleep(backoff);
    backoff = Math.min(backoff * 2, MAX_BACKOFF);
  }
}
