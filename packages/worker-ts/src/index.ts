// @awooop/worker: a typed awooop worker for Node (see README.md).
export { Worker, defaultWorkerId, jsonLogger } from "./worker";
export type { Logger, LogLevel, WorkerOptions, WorkerStats } from "./worker";
export { RunContext, HandlerStopped, describe, toolResult } from "./context";
export type {
  Approval,
  ChildHandle,
  Compensation,
  CompensationCommand,
  Handler,
  Json,
  StepActionName,
  StepCall,
  StepFn,
  StepKind,
  StepOptions,
  StopReason,
  ParkedToolOptions,
  WaitToken,
} from "./context";
export { ChildrenTimeout } from "./children";
export type { Child, ChildOutcome } from "./children";
export { keyOf } from "./eventMatches";
export type { EventMatch, MatchChannel } from "./eventMatches";
export { ToolClient } from "./tools";
export { Nondeterminism, ReplayCheck, NONDETERMINISM_CODE, PATCH_PREFIX } from "./replay";
export { watchRun } from "./watch";
export type { EventSource, RunEvent, TokenBatch, TokenChannel, TokenGap, TokenItem, WatchOptions } from "./watch";
export type { ToolClientOptions } from "./tools";
export { Client, CHANNEL_OPTIONS, DEFAULT_TIMEOUT } from "./client";
export type { ClientOptions, RequestOf, ResponseOf, UnaryMethod } from "./client";
export {
  AwooopError,
  LeaseLost,
  ParkedToolFailed,
  RunFinished,
  RunParked,
  WaitTimeout,
  WorkerError,
  LEASE_LOST,
  INVALID_TRANSITION,
  WAIT_TIMED_OUT_CODE,
  reasonName,
} from "./errors";
export type { FieldViolation } from "./errors";
export { address, apiKey, channelTarget, DEFAULT_PORTS, workerBuild, workerHttpPort, workerLabels } from "./settings";
export { registerMetrics, LABEL_VALUES } from "./metrics";
export type { Health } from "./health";
export { SCOPE as TRACER_SCOPE, formatTraceparent, parseTraceparent } from "./tracing";
export type { Service } from "./settings";
// the generated contracts, for calls the worker does not wrap
export * as common from "./gen/awooop/common/v1/common";
export * as scheduler from "./gen/awooop/scheduler/v1/scheduler";
export * as saga from "./gen/awooop/saga/v1/saga";
export * as tools from "./gen/awooop/tools/v1/tools";
