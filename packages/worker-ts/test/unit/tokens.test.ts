// The token streams' batching (tokens.ts) against a recording stand-in for the client: the first
// token at once, later ones batched, a checkpoint carrying every token since the last, numbering.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { Client } from "../../src/client";
import { TokenStreams } from "../../src/tokens";

interface Sent {
  firstSeq: number;
  tokens: string[];
  checkpoint: boolean;
}

function recorder(): { client: Client; sent: Sent[] } {
  const sent: Sent[] = [];
  const client = {
    scheduler: {},
    call: async (_stub: unknown, method: string, request: Sent) => {
      assert.equal(method, "publishTokens");
      sent.push({ firstSeq: request.firstSeq, tokens: [...request.tokens], checkpoint: request.checkpoint });
      return { live: true, checkpointOffset: 0, checkpointTokens: 5, checkpointMs: 60_000, checkpointBytes: 1 << 20 };
    },
  } as unknown as Client;
  return { client, sent };
}

test("the first token goes at once, the rest in batches, a checkpoint every N with all since the last", async () => {
  const { client, sent } = recorder();
  const streams = new TokenStreams(client, { runId: "r", attempt: 1 });
  await streams.token("a", "output"); // sent at once: its answer says a checkpoint every 5 tokens
  assert.deepEqual(sent, [{ firstSeq: 1, tokens: ["a"], checkpoint: false }]);
  for (const t of ["b", "c", "d"]) await streams.token(t, "output");
  await new Promise((resolve) => setTimeout(resolve, 60)); // the batch interval passes
  assert.deepEqual(sent[1], { firstSeq: 2, tokens: ["b", "c", "d"], checkpoint: false });
  await streams.token("e", "output"); // the fifth since the last checkpoint: a checkpoint of 1..5
  assert.deepEqual(sent[2], { firstSeq: 1, tokens: ["a", "b", "c", "d", "e"], checkpoint: true });
  await streams.token("f", "output");
  await streams.checkpoint(); // ctx.flushTokens: 6 alone
  assert.deepEqual(sent[3], { firstSeq: 6, tokens: ["f"], checkpoint: true });
  await streams.checkpoint(); // nothing new: no call
  assert.equal(sent.length, 4);
  streams.close();
});

test("streams are numbered apart, and pipe returns the whole text after a checkpoint", async () => {
  const { client, sent } = recorder();
  const streams = new TokenStreams(client, { runId: "r", attempt: 2 });
  async function* chunks(): AsyncGenerator<string> {
    yield "x";
    yield "y";
  }
  assert.equal(await streams.pipe(chunks(), "notes"), "xy");
  await streams.token("z", "output");
  assert.deepEqual(sent.at(-1), { firstSeq: 1, tokens: ["z"], checkpoint: false });
  assert.ok(sent.some((s) => s.checkpoint && s.tokens.join("") === "xy" && s.firstSeq === 1));
  streams.close();
});
