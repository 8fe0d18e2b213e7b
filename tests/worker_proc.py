"""A tiny real worker process for crash tests, on the raw generated stubs (no SDK).

    python tests/worker_proc.py ADDRESS API_KEY PROJECT WORKER_ID [HEARTBEAT_SECONDS [LABELS]]

LABELS: the worker's labels as key=value,key=value (ClaimRunsRequest.labels).

Claims one run (waiting for it up to 30 s), prints its lease as one JSON line on stdout,
then renews the lease every HEARTBEAT_SECONDS (default 0.2) forever, printing each outcome
on stderr. The test kills it with SIGKILL mid-run; nothing here cleans up on purpose."""

from __future__ import annotations

import json
import sys
import time

import grpc
from google.protobuf import duration_pb2

from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc


def main(argv: list[str]) -> int:
    address, key, project, worker_id = argv[1:5]
    interval = float(argv[5]) if len(argv) > 5 else 0.2
    labels = dict(pair.split("=", 1) for pair in argv[6].split(",")) if len(argv) > 6 else {}
    metadata = (("authorization", f"Bearer {key}"),)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(address))
    resp = stub.ClaimRuns(
        scheduler_pb2.ClaimRunsRequest(
            worker_id=worker_id,
            project_ids=[project],
            max_runs=1,
            wait=duration_pb2.Duration(seconds=30),
            labels=labels,
        ),
        metadata=metadata,
        timeout=40,
    )
    if not resp.runs:
        print(json.dumps({"error": "nothing to claim"}), flush=True)
        return 1
    claimed = resp.runs[0]
    print(
        json.dumps(
            {
                "run_id": claimed.lease.run_id,
                "attempt": claimed.lease.attempt,
                "lease_until": claimed.lease_until.ToJsonString(),
                "worker_id": worker_id,
            }
        ),
        flush=True,
    )
    while True:
        time.sleep(interval)
        beat = stub.Heartbeat(
            scheduler_pb2.HeartbeatRequest(worker_id=worker_id, leases=[claimed.lease]), metadata=metadata, timeout=10
        )
        outcome = scheduler_pb2.LeaseOutcome.Name(beat.renewals[0].outcome)
        print(outcome, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
