"""`awooop workers ...`: the workers a project's claims came from, with their labels
(docs/flow-control.md, "Worker labels"), through the gRPC API.

    awooop workers list --project P      the workers: labels, build, live or gone, first and last seen

Every command takes --json; errors as `awooop runs`.
"""

from __future__ import annotations

import argparse
from typing import Any

from awooop.cli.client import add_connection_args, print_json, print_table, run_command, to_json, when
from awooop.cli.timeline import label_words
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client


def register(sub: Any) -> None:
    workers = sub.add_parser("workers", help="a project's workers: their labels, live or gone")
    w = workers.add_subparsers(dest="workers_command", metavar="ACTION", required=True)
    help_text = "the project's workers with their labels and build, live (a claim seen lately) or gone"
    p: argparse.ArgumentParser = w.add_parser("list", help=help_text, description=help_text)
    p.add_argument("--project", required=True)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_connection_args(p)
    p.set_defaults(func=run_command(cmd_list))


async def cmd_list(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(client.scheduler.ListWorkers, scheduler_pb2.ListWorkersRequest(project_id=args.project))
    if args.json:  # the list under its key even when empty (docs/cli.md)
        print_json({"workers": [to_json(w) for w in resp.workers]})
        return 0
    if not resp.workers:
        print(f"no worker has claimed from project {args.project}")
        return 0
    print_table(
        ["WORKER", "STATE", "LABELS", "BUILD", "FIRST_SEEN", "LAST_SEEN"],
        [
            [
                w.worker_id,
                "live" if w.live else "gone",
                label_words(w.labels) or "-",
                w.build_id or "-",
                when(w.first_seen_at),
                when(w.last_seen_at),
            ]
            for w in resp.workers
        ],
    )
    return 0
