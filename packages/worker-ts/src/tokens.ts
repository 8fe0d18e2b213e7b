// A handler's token streams (ctx.streamToken; docs/worker-sdk.md "Token streams"): high-rate
// partial output, such as an LLM's tokens, for whoever watches the run. The same protocol as the
// Python SDK's tokens.py: tokens numbered 1, 2, 3, ... per (run, attempt, stream), sent in batches
// (PublishTokens) BATCH_INTERVAL_MS after a batch's first token (a stream's first token at once: the
// answer carries the scheduler's checkpoint cadence); every so many tokens, ms or bytes a batch
// carries every token since the last checkpoint and the scheduler writes them as one durable row.
// ctx.emit, ctx.complete and ctx.fail checkpoint first. A retried batch is kept once, by seq (the
// client's retry policy resends UNAVAILABLE calls).
import type { Client } from "./client";
import type { LeaseToken } from "./gen/awooop/common/v1/common";

export const DEFAULT_STREAM = "output";
const BATCH_INTERVAL_MS = 20;

const TOKEN_OVERHEAD = 4; // bytes a token adds to a checkpoint's JSON: the scheduler's budget counts them
const bytes = (text: string): number => Buffer.byteLength(text, "utf8") + TOKEN_OVERHEAD;

/** One stream of one attempt: the tokens not yet sent, and those since the last checkpoint. */
class TokenStream {
  private seq = 0; // the last token numbered
  private sent = 0; // the last token sent live
  private since: string[] = []; // tokens after the last checkpoint
  private sinceBytes = 0;
  private firstAt = 0; // wall clock (ms) of the oldest unsent token
  private checkpointStarted = 0; // when the first token after the last checkpoint came
  private everyTokens = 500;
  private everyMs = 2000;
  private everyBytes = 32 * 1024;
  private timer: NodeJS.Timeout | undefined;
  private error: unknown; // a background send's failure, thrown to the handler
  private chain: Promise<void> = Promise.resolve(); // sends, one after the other
  private inFlight = false; // a send is under way
  live = true; // the last publish reached the live channel

  constructor(
    private readonly client: Client,
    private readonly lease: LeaseToken,
    readonly name: string,
  ) {}

  /** Numbers a token; true when a send is due now (the first token, a checkpoint's worth). */
  add(text: string): boolean {
    if (this.error !== undefined) throw this.error;
    if (this.since.length === 0) this.checkpointStarted = Date.now();
    if (this.sent === this.seq) this.firstAt = Date.now();
    this.seq += 1;
    this.since.push(text);
    this.sinceBytes += bytes(text);
    this.schedule();
    return this.seq === 1 || this.checkpointDue();
  }

  /** A batch BATCH_INTERVAL_MS from now, unless one is scheduled or a send is in flight (it schedules one as it ends). */
  private schedule(): void {
    if (this.timer !== undefined || this.inFlight) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.inFlight) return;
      this.send(false).catch((err: unknown) => (this.error = err));
    }, BATCH_INTERVAL_MS);
  }

  private checkpointDue(): boolean {
    return (
      this.since.length > 0 &&
      (this.since.length >= this.everyTokens ||
        this.sinceBytes >= this.everyBytes ||
        Date.now() - this.checkpointStarted >= this.everyMs)
    );
  }

  /** Sends the unsent tokens; with checkpoint (or when one is due), all since the last one. */
  send(checkpoint: boolean): Promise<void> {
    const next = this.chain.then(() => this.sendNow(checkpoint));
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async sendNow(wanted: boolean): Promise<void> {
    this.inFlight = true;
    try {
      await this.sendOne(wanted);
    } finally {
      this.inFlight = false;
    }
    if (this.sent < this.seq) this.schedule(); // the tokens added meanwhile
  }

  private async sendOne(wanted: boolean): Promise<void> {
    if (this.error !== undefined) throw this.error;
    const checkpoint = this.since.length > 0 && (wanted || this.checkpointDue());
    if (this.sent === this.seq && !checkpoint) return;
    const first = checkpoint ? this.seq - this.since.length + 1 : this.sent + 1;
    const tokens = checkpoint ? [...this.since] : this.since.slice(this.since.length - (this.seq - this.sent));
    const resp = await this.client.call(this.client.scheduler, "publishTokens", {
      lease: this.lease,
      stream: this.name,
      firstSeq: first,
      tokens,
      producedAt: new Date(this.firstAt),
      checkpoint,
    });
    this.sent = Math.max(this.sent, first + tokens.length - 1);
    this.live = resp.live;
    if (resp.checkpointTokens > 0) {
      this.everyTokens = resp.checkpointTokens;
      this.everyMs = resp.checkpointMs;
      this.everyBytes = resp.checkpointBytes;
    }
    if (checkpoint) {
      this.since = this.since.slice(tokens.length); // tokens added during the call stay for the next one
      this.sinceBytes = this.since.reduce((n, t) => n + bytes(t), 0);
      this.checkpointStarted = Date.now();
    }
  }

  close(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** A RunContext's streams by name. */
export class TokenStreams {
  private readonly streams = new Map<string, TokenStream>();

  constructor(
    private readonly client: Client,
    private readonly lease: LeaseToken,
  ) {}

  async token(text: string, stream: string): Promise<void> {
    let s = this.streams.get(stream);
    if (s === undefined) {
      s = new TokenStream(this.client, this.lease, stream);
      this.streams.set(stream, s);
    }
    if (s.add(text)) await s.send(false);
  }

  /** Every stream's tokens sent and written durably (before an emit and the run's end). */
  async checkpoint(): Promise<void> {
    for (const s of this.streams.values()) await s.send(true);
  }

  close(): void {
    for (const s of this.streams.values()) s.close();
  }

  async pipe(chunks: AsyncIterable<string>, stream: string): Promise<string> {
    const parts: string[] = [];
    for await (const chunk of chunks) {
      parts.push(chunk);
      await this.token(chunk, stream);
    }
    await this.checkpoint();
    return parts.join("");
  }
}
