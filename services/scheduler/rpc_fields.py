"""What several SchedulerService RPC groups read or answer alike: a lease token's fields, a
wait's timeout bound, a run status that never fails a read."""

from __future__ import annotations

from awooop.common.v1 import common_pb2
from services.common.runs import status_to_pb
from services.common.validate import Violations

# request limits shared by several groups (each group's own are beside its RPCs)
MAX_WAIT_TIMEOUT = 366 * 86400.0  # CreateWait's timeout, and StartChildRuns' CHILDREN wait
INT32_MAX = 2**31 - 1


def lease(v: Violations, field: str, token: common_pb2.LeaseToken) -> tuple[str, int]:
    """A lease token's run id and attempt, validated (violations recorded in v)."""
    run_id = v.uuid(f"{field}.run_id", token.run_id)
    v.check(1 <= token.attempt <= INT32_MAX, f"{field}.attempt", "must be >= 1 (the attempt ClaimRuns returned)")
    return run_id, token.attempt


def status_of(value: str | None) -> int:
    try:
        return status_to_pb(value)
    except ValueError:  # a status string some other writer used; never fail a read on it
        return 0
