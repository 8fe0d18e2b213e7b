// Seconds as the protos' Duration, and the clocks the worker counts with.
import { setTimeout as sleepMs } from "node:timers/promises";
import type { Duration } from "./gen/google/protobuf/duration";

/** seconds as a Duration; undefined for 0 / unset (the server's default). */
export function duration(seconds: number | undefined): Duration | undefined {
  if (!seconds) return undefined;
  const whole = Math.floor(seconds);
  return { seconds: whole, nanos: Math.round((seconds - whole) * 1e9) };
}

/** Monotonic seconds. */
export function now(): number {
  return performance.now() / 1000;
}

/** Resolves after `seconds`, or at once when `signal` aborts (never rejects). */
export async function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  try {
    await sleepMs(Math.max(0, seconds * 1000), undefined, { signal });
  } catch {
    // aborted: the caller looks at why
  }
}

/** Resolves when `signal` aborts (at once if it has). */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** Waits for `promise`, at most `seconds` (no timer is left behind either way). */
export async function within(promise: Promise<unknown>, seconds: number): Promise<void> {
  const timer = new AbortController();
  try {
    await Promise.race([promise, sleep(seconds, timer.signal)]);
  } finally {
    timer.abort();
  }
}
