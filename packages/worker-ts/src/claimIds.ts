// Claim ids (ClaimRunsRequest.claim_id): every claim names itself, so a claim that committed but
// whose answer was lost is answered again by its retry (the same leases, at once) instead of its
// runs waiting RUNNING until their lease expires. A claim keeps its id and its max_runs (the
// scheduler refuses an id reused with other parameters) until it is answered or fails in a way
// that says it claimed nothing: UNAVAILABLE (after the channel's retries) and DEADLINE_EXCEEDED
// leave the outcome unknown, so the next claim is that claim again.
import { randomBytes } from "node:crypto";
import { status as Code } from "@grpc/grpc-js";
import type { AwooopError } from "./errors";

const OUTCOME_UNKNOWN: readonly Code[] = [Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED];

export function newClaimId(): string {
  return randomBytes(16).toString("base64url"); // 22 printable ASCII characters, no spaces
}

/** The id of the claim the worker sends next. */
export class ClaimIds {
  private open: { id: string; maxRuns: number } | undefined;

  /** The next claim: one whose outcome is unknown is sent again as it was; else a new one. */
  next(maxRuns: number): { id: string; maxRuns: number } {
    this.open ??= { id: newClaimId(), maxRuns };
    return this.open;
  }

  /** The claim was answered (no error) or failed with err. */
  answered(err?: AwooopError): void {
    if (err === undefined || !OUTCOME_UNKNOWN.includes(err.code)) this.open = undefined;
  }
}
