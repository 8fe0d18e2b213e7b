// Follows a run to its end with @awooop/worker's watchRun: its state changes, journal steps and
// the progress events its handler emits (ctx.emit), in order, then its output; with --tokens also
// the text it streams (ctx.streamToken), as it comes.
//
//   node dist/watch.js RUN_ID [AFTER] [--tokens]
//
//   AWOOOP_API_KEY          a key with any role in the run's project
//   AWOOOP_SCHEDULER_ADDR   else AWOOOP_SCHEDULER_PORT on AWOOOP_HOST, else 127.0.0.1:50052
import { Client, common, watchRun } from "@awooop/worker";

async function main(runId: string, after: number, tokens: boolean): Promise<number> {
  const client = new Client();
  try {
    for await (const item of watchRun(client, runId, after, { tokens })) {
      if ("offset" in item) {
        if (tokens && item.kind === "stream_checkpoint") continue; // its tokens came as "tokens" items
        console.log(`${item.offset} ${item.source} ${item.kind} ${JSON.stringify(item.data)}`);
      } else if ("kind" in item) {
        if (item.kind === "tokens") process.stdout.write(item.tokens.join(""));
        else if (item.kind === "token_gap") console.log(`\n[tokens ${item.fromSeq}..${item.toSeq} missed live: ${item.reason}]`);
        else console.log(`\n[${item.message}]`);
      } else {
        console.log(`ended ${common.RunStatus[item.status]} ${JSON.stringify(item.output ?? {})}`);
      }
    }
    return 0;
  } finally {
    client.close();
  }
}

const args = process.argv.slice(2);
const tokens = args.includes("--tokens");
const [runId, after] = args.filter((a) => a !== "--tokens");
if (!runId) {
  console.error("usage: node dist/watch.js RUN_ID [AFTER] [--tokens]");
  process.exit(2);
}
main(runId, Number(after ?? 0), tokens).then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(String(err)); // e.g. NOT_FOUND for a run of another project
    process.exit(1);
  },
);
