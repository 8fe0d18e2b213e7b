"""The flow-control fields a new run may carry (CreateRun, IngestEvent): when it may first be
claimed (not_before), its priority and its own retry policy (docs/flow-control.md)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from awooop.common.v1 import common_pb2
from services.common import retry_policy
from services.common.validate import Violations

MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # CHECK of awooop_run_state.priority
MAX_DELAY = dt.timedelta(days=366)
MAX_KEY = 128  # awooop_run_state.concurrency_key VARCHAR(128)  # a not_before further out is a mistake, not a schedule

# awooop_run_state.wait_reason
WAIT_BACKOFF = "backoff"
WAIT_DELAYED = "delayed"
WAIT_KEY_BUSY = "key_busy"  # parked behind a full concurrency key (not_before 'infinity')
WAIT_RATE_LIMITED = "rate_limited"  # its key started its rate's worth in this window (not_before = its end)


@dataclass(frozen=True, slots=True)
class RunOptions:
    not_before: dt.datetime | None = None
    priority: int = 0
    # the run's own retry policy as JSON (None: none)
    retry_policy_json: str | None = None
    concurrency_key: str | None = None

    @property
    def wait_reason(self) -> str | None:
        return WAIT_DELAYED if self.not_before is not None else None


NO_OPTIONS = RunOptions()


def timestamp(v: Violations, field: str, value: Timestamp) -> dt.datetime | None:
    """A Timestamp as an aware datetime; an invalid one (nanos out of range, beyond year 9999)
    is a violation of field and None."""
    try:
        return value.ToDatetime(tzinfo=dt.UTC)
    except (ValueError, OverflowError):
        v.add(field, "not a valid timestamp")
        return None


def parse(
    v: Violations,
    prefix: str,
    *,
    not_before: Timestamp | None,
    priority: int,
    policy: common_pb2.RetryPolicy | None,
    concurrency_key: str = "",
) -> RunOptions:
    """Validated options; problems go to v under `prefix` (e.g. "events[3].")."""
    when = None
    if not_before is not None:
        when = timestamp(v, prefix + "not_before", not_before)
    if when is not None:
        v.check(
            when <= dt.datetime.now(dt.UTC) + MAX_DELAY,
            prefix + "not_before",
            "must be within a year from now",
        )
    v.check(
        MIN_PRIORITY <= priority <= MAX_PRIORITY, prefix + "priority", f"must be {MIN_PRIORITY} to {MAX_PRIORITY}"
    )
    policy_json = None
    if policy is not None:
        fields = retry_policy.from_pb(v, prefix + "retry_policy", policy)
        if fields:
            policy_json = json.dumps(fields, sort_keys=True)
    key = v.token(prefix + "concurrency_key", concurrency_key, max_len=MAX_KEY, required=False) or None
    return RunOptions(when, priority, policy_json, key)
