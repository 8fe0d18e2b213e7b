// Follows a run to its end with @awooop/worker's watchRun: its state changes, journal steps and
// the progress events its handler emits (ctx.emit), in order, then its output.
//
//   node dist/watch.js RUN_ID [AFTER]
//
//   AWOOOP_API_KEY          a key with any role in the run's project
//   AWOOOP_SCHEDULER_ADDR   else AWOOOP_SCHEDULER_PORT on AWOOOP_HOST, else 127.0.0.1:50052
import { Client, common, watchRun } from "@awooop/worker";

async function main(runId: string, after: number): Promise<number> {
  const client = new Client();
  try {
    for await (const item of watchRun(client, runId, after)) {
      if ("offset" in item) {
        console.log(`${item.offset} ${item.source} ${item.kind} ${JSON.stringify(item.data)}`);
      } else {
        console.log(`ended ${common.RunStatus[item.status]} ${JSON.stringify(item.output ?? {})}`);
      }
    }
    return 0;
  } finally {
    client.close();
  }
}

const [runId, after] = process.argv.slice(2);
if (!runId) {
  console.error("usage: node dist/watch.js RUN_ID [AFTER]");
  process.exit(2);
}
main(runId, Number(after ?? 0)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(String(err)); // e.g. NOT_FOUND for a run of another project
    process.exit(1);
  },
);
