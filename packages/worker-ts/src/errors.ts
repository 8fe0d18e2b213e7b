// awooop's rich errors on the client side: every failed call carries a google.rpc.Status in the
// `grpc-status-details-bin` trailer with an ErrorInfo (domain "awooop", reason, metadata) and, for
// bad input, a BadRequest. Callers branch on `reason` (LEASE_LOST, INVALID_TRANSITION, ...), never
// on the message.
import { Metadata, status as Code, type ServiceError } from "@grpc/grpc-js";
import { ErrorReason, errorReasonToJSON } from "./gen/awooop/common/v1/errors";
import { Status } from "./gen/google/rpc/status";
import { BadRequest, ErrorInfo } from "./gen/google/rpc/error_details";

/** ErrorInfo.reason of an ErrorReason, as the services send it (ERROR_REASON_LEASE_LOST -> LEASE_LOST). */
export function reasonName(value: ErrorReason): string {
  return errorReasonToJSON(value).replace(/^ERROR_REASON_/, "");
}

export const LEASE_LOST = reasonName(ErrorReason.ERROR_REASON_LEASE_LOST);
export const INVALID_TRANSITION = reasonName(ErrorReason.ERROR_REASON_INVALID_TRANSITION);
export const JOURNAL_TOO_LARGE = reasonName(ErrorReason.ERROR_REASON_JOURNAL_TOO_LARGE);

const ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo";
const BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest";

export interface FieldViolation {
  field: string;
  description: string;
}

/** A failed awooop call, decoded. */
export class AwooopError extends Error {
  readonly code: Code;
  /** The ErrorInfo reason ("" when the server sent none, e.g. a refused connection). */
  readonly reason: string;
  readonly metadata: Readonly<Record<string, string>>;
  readonly violations: readonly FieldViolation[];
  /** The method called, e.g. "ClaimRuns". */
  readonly method: string;

  constructor(
    code: Code,
    reason: string,
    message: string,
    metadata: Record<string, string> = {},
    violations: FieldViolation[] = [],
    method = "",
  ) {
    // `CODE REASON: message` (a reason that repeats the code is said once), then the violations
    // the message left out, one per line
    const said = reason === "" || reason === Code[code] ? Code[code] : `${Code[code]} ${reason}`;
    const extra = violations
      .map((v) => `${v.field}: ${v.description}`)
      .filter((line) => !message.includes(line))
      .map((line) => `\n  ${line}`);
    super(`${said}: ${message}${extra.join("")}`);
    this.name = new.target.name;
    this.code = code;
    this.reason = reason;
    this.metadata = metadata;
    this.violations = violations;
    this.method = method;
  }

  /** The status code's name, e.g. "FAILED_PRECONDITION". */
  get codeName(): string {
    return Code[this.code] ?? String(this.code);
  }

  /** Decodes a @grpc/grpc-js error (works for errors without rich details too). */
  static fromServiceError(err: ServiceError, method = ""): AwooopError {
    let message = err.details || err.message;
    let reason = "";
    let metadata: Record<string, string> = {};
    let violations: FieldViolation[] = [];
    const raw = err.metadata instanceof Metadata ? err.metadata.get("grpc-status-details-bin")[0] : undefined;
    if (raw instanceof Buffer) {
      const status = Status.decode(raw);
      message = status.message || message;
      for (const any of status.details) {
        if (any.typeUrl === ERROR_INFO) {
          const info = ErrorInfo.decode(any.value);
          reason = info.reason;
          metadata = info.metadata;
        } else if (any.typeUrl === BAD_REQUEST) {
          violations = BadRequest.decode(any.value).fieldViolations.map((v) => ({
            field: v.field,
            description: v.description,
          }));
        }
      }
    }
    const Kind = reason === LEASE_LOST ? LeaseLost : AwooopError;
    return new Kind(err.code, reason, message, metadata, violations, method);
  }
}

/** The run's lease is no longer ours (reaped, cancelled, finished or taken by another attempt): stop working on it. */
export class LeaseLost extends AwooopError {}

/** The handler used its RunContext after the run was completed, failed, handed to an approver, or taken from it. */
export class RunFinished extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RunFinished";
  }
}

/** The worker cannot go on (a bad key, no worker role), or stopped with runs it could not settle. */
export class WorkerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WorkerError";
  }
}

/**
 * The run is parked on a durable wait and no longer held by this worker: the handler unwinds
 * (thrown by ctx.wait / ctx.sleep; the Worker catches it and counts the run as parked). Let it
 * pass: a handler that catches every error must rethrow this one.
 */
export class RunParked extends Error {
  constructor(readonly stepId: string) {
    super(`parked on wait ${stepId}`);
    this.name = "RunParked";
  }
}

/**
 * A wait's time ran out before anyone completed it. Catch it to go on another way; left uncaught,
 * the Worker fails the run (not retryable, error code E-WAIT-TIMEOUT) and the saga compensates.
 */
export class WaitTimeout extends Error {
  constructor(
    readonly stepId: string,
    readonly waitId: string,
  ) {
    super(`wait ${stepId} (${waitId}) timed out`);
    this.name = "WaitTimeout";
  }
}

/**
 * A parked tool call's tool posted an error (`{ error, code }`) instead of a result: the step is
 * journaled failed (nothing to compensate) and this is thrown; left uncaught, the attempt fails as
 * for any handler error.
 */
export class ParkedToolFailed extends Error {
  constructor(
    readonly stepId: string,
    readonly toolMessage: string,
    readonly code = "",
  ) {
    super(`tool of step ${stepId} failed: ${toolMessage}${code ? ` (${code})` : ""}`);
    this.name = "ParkedToolFailed";
  }
}

/** The error code of a run whose handler let WaitTimeout escape. */
export const WAIT_TIMED_OUT_CODE = "E-WAIT-TIMEOUT";
