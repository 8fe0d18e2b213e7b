"""The flow-control fields a new run may carry (CreateRun, IngestEvent): when it may first be
claimed (not_before), its priority and its own retry policy (docs/flow-control.md)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from google.protobuf.timestamp_pb2 import Timestamp

from awooop.common.v1 import common_pb2
from services.common import labels, retry_policy
from services.common.limits import MAX_CONCURRENCY_KEY
from services.common.validate import Violations

MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # CHECK of awooop_run_state.priority
MAX_DELAY = dt.timedelta(days=366)  # a not_before further out is a mistake, not a schedule
MAX_KEYS = 8  # keys per run (CHECK of awooop_run_state.concurrency_keys)


class WaitReason(StrEnum):
    """awooop_run_state.wait_reason: why a run is held back until not_before. The statements that
    set it write these values (tests/test_runstate.py checks them); the CLI and the console word
    each one (awooop.cli.timeline)."""

    BACKOFF = "backoff"
    DELAYED = "delayed"
    KEY_BUSY = "key_busy"  # parked behind a full concurrency key (not_before 'infinity')
    RATE_LIMITED = "rate_limited"  # its key started its rate's worth in this window (not_before = its end)
    # a run parked on a durable wait (WAITING_TOOL without a lease; not_before = the wait's expiry)
    ON_TOKEN = "wait_token"
    ON_SLEEP = "wait_sleep"
    ON_EVENT = "wait_event"
    ON_CHILDREN = "wait_children"  # parked until its child runs end (a 'children' wait)
    # held by its worker (HoldRun: its code does not replay the run's journal; not_before
    # 'infinity') until an operator's UnholdRun or CancelRun
    HELD = "held"
    # parked by the label sweep: no live worker has the labels it requires (not_before 'infinity'
    # until one has; services/scheduler/workers.sql)
    LABELS = "labels"
    # a batch of debounced channel events gathering more of its key's events (issue 46; not_before =
    # the end of its quiet window, at most its max wait after its first event)
    DEBOUNCE = "debounce"


@dataclass(frozen=True, slots=True)
class RunOptions:
    not_before: dt.datetime | None = None
    priority: int = 0
    # the run's own retry policy as JSON (None: none)
    retry_policy_json: str | None = None
    # the run's concurrency keys, sorted and distinct (empty: none)
    concurrency_keys: tuple[str, ...] = ()
    # awooop_run_state.auto_upgrade: its own routing across builds (None: its project's)
    auto_upgrade: bool | None = None
    # the labels a worker must have and those the run prefers, as the store's JSON (None: none;
    # services/common/labels.py)
    required_labels_json: str | None = None
    preferred_labels_json: str | None = None

    @property
    def keys_param(self) -> list[str] | None:
        """awooop_run_state.concurrency_keys (NULL: none)."""
        return list(self.concurrency_keys) or None


NO_OPTIONS = RunOptions()
EMPTY: Mapping[str, str] = {}


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
    concurrency_keys: Sequence[str] = (),
    versioning: int = 0,
    required_labels: Mapping[str, str] = EMPTY,
    preferred_labels: Mapping[str, str] = EMPTY,
) -> RunOptions:
    """Validated options; problems go to v under `prefix` (e.g. "events[3].")."""
    unset = not_before is None and not priority and policy is None and not concurrency_key and not concurrency_keys
    if unset and not versioning and not required_labels and not preferred_labels:
        return NO_OPTIONS  # none set (most requests): nothing to check
    when = None
    if not_before is not None:
        when = timestamp(v, prefix + "not_before", not_before)
    if when is not None:
        v.check(
            when <= dt.datetime.now(dt.UTC) + MAX_DELAY,
            prefix + "not_before",
            "must be within a year from now",
        )
    v.check(MIN_PRIORITY <= priority <= MAX_PRIORITY, prefix + "priority", f"must be {MIN_PRIORITY} to {MAX_PRIORITY}")
    policy_json = None
    if policy is not None:
        fields = retry_policy.from_pb(v, prefix + "retry_policy", policy)
        if fields:
            policy_json = json.dumps(fields, sort_keys=True)
    return RunOptions(
        when,
        priority,
        policy_json,
        keys(v, prefix, concurrency_key, concurrency_keys),
        auto_upgrade(v, prefix + "versioning", versioning),
        labels.to_json(labels.parse(v, prefix + "required_labels", required_labels)),
        labels.to_json(labels.parse(v, prefix + "preferred_labels", preferred_labels)),
    )


def auto_upgrade(v: Violations, field: str, versioning: int) -> bool | None:
    """Versioning as awooop_run_state.auto_upgrade and awooop_project_flow.versioning read it:
    None (UNSPECIFIED: the project's), False (PINNED), True (AUTO_UPGRADE)."""
    for known, auto in VERSIONING.items():  # (an unknown number is no ValueType: matched, not indexed)
        if versioning == known:
            return auto
    v.add(field, "must be VERSIONING_UNSPECIFIED, VERSIONING_PINNED or VERSIONING_AUTO_UPGRADE")
    return None


# Versioning -> auto-upgrade (None: not set)
VERSIONING: dict[common_pb2.Versioning.ValueType, bool | None] = {
    common_pb2.VERSIONING_UNSPECIFIED: None,
    common_pb2.VERSIONING_PINNED: False,
    common_pb2.VERSIONING_AUTO_UPGRADE: True,
}


def keys(v: Violations, prefix: str, concurrency_key: str, concurrency_keys: Sequence[str]) -> tuple[str, ...]:
    """A run's keys: the list and the old single field (an alias: merged into the list), each a
    token; a key named twice counts once; at most MAX_KEYS distinct keys. Sorted: the order the
    claim and the release trigger lock the keys' rows in."""
    v.token(prefix + "concurrency_key", concurrency_key, max_len=MAX_CONCURRENCY_KEY, required=False)
    for i, key in enumerate(concurrency_keys):
        v.token(f"{prefix}concurrency_keys[{i}]", key, max_len=MAX_CONCURRENCY_KEY)
    got = sorted({k for k in (concurrency_key, *concurrency_keys) if k})
    if len(got) > MAX_KEYS:
        v.add(prefix + "concurrency_keys", f"at most {MAX_KEYS} distinct keys per run, got {len(got)}")
    return tuple(got)
