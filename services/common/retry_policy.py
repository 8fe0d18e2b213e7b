"""Retry policy (docs/flow-control.md): how long a run waits after a retryable failure or a
reaped lease, how many attempts it gets, and which error codes are never retried.

A policy is a JSON object of the fields it sets. The one a run follows is the service's
(settings AWOOOP_RETRY_*), overridden by its project's (awooop_project_flow), overridden by the
run's own (awooop_run_state.retry_policy): `defaults || project || run`. It is merged when the
run fails, so a project's new policy applies to its queued runs too; only max_attempts is
fixed when the run is created (the claim compares it with the attempts used).

The n-th failure (n = attempts used, hand-backs not counted) waits
min(max_backoff, initial_backoff * multiplier^(n-1)), less a random part of at most jitter of it.
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from services.common.limits import MAX_ATTEMPTS_LIMIT, MAX_ERROR_CODE
from services.common.settings import Settings
from services.common.validate import Violations

MAX_BACKOFF_SECONDS = 86400.0
MAX_MULTIPLIER = 10.0
MAX_NON_RETRYABLE_CODES = 32

# the JSON keys of a stored policy
INITIAL = "initial_backoff"
MULTIPLIER = "multiplier"
MAX_DELAY = "max_backoff"
JITTER = "jitter"
MAX_ATTEMPTS = "max_attempts"
NON_RETRYABLE = "non_retryable_error_codes"

Policy = dict[str, Any]


def defaults(settings: Settings) -> Policy:
    """The service's policy: every field set."""
    return {
        INITIAL: settings.retry_backoff,
        MULTIPLIER: settings.retry_multiplier,
        MAX_DELAY: settings.retry_max_backoff,
        JITTER: settings.retry_jitter,
        MAX_ATTEMPTS: settings.max_attempts,
        NON_RETRYABLE: [],
    }


# the policy of a service with default settings, as JSON text (callers without settings at hand)
DEFAULTS_JSON = json.dumps(defaults(Settings()))


def _seconds(d: Duration) -> float:
    return d.seconds + d.nanos / 1e9


def from_pb(v: Violations, field: str, pb: common_pb2.RetryPolicy) -> Policy:
    """The fields pb sets (zero: unset), validated; problems go to v under `field`."""
    out: Policy = {}
    for name, given, d in (
        (INITIAL, pb.HasField("initial_backoff"), pb.initial_backoff),
        (MAX_DELAY, pb.HasField("max_backoff"), pb.max_backoff),
    ):
        if given:
            secs = _seconds(d)
            if v.check(0 <= secs <= MAX_BACKOFF_SECONDS, f"{field}.{name}", "must be 0 to 1 day"):
                out[name] = secs
    if pb.multiplier:
        if v.check(1.0 <= pb.multiplier <= MAX_MULTIPLIER, f"{field}.multiplier", "must be 1 to 10"):
            out[MULTIPLIER] = pb.multiplier
    if pb.jitter:
        if v.check(0.0 <= pb.jitter <= 1.0, f"{field}.jitter", "must be 0 to 1"):
            out[JITTER] = pb.jitter
    if pb.max_attempts:
        ok = 1 <= pb.max_attempts <= MAX_ATTEMPTS_LIMIT
        if v.check(ok, f"{field}.max_attempts", f"must be 1 to {MAX_ATTEMPTS_LIMIT}"):
            out[MAX_ATTEMPTS] = pb.max_attempts
    codes = list(pb.non_retryable_error_codes)
    if codes:
        if len(codes) > MAX_NON_RETRYABLE_CODES:
            v.add(f"{field}.{NON_RETRYABLE}", f"at most {MAX_NON_RETRYABLE_CODES} codes")
        for i, code in enumerate(codes[:MAX_NON_RETRYABLE_CODES]):
            v.token(f"{field}.{NON_RETRYABLE}[{i}]", code, max_len=MAX_ERROR_CODE)
        out[NON_RETRYABLE] = sorted(set(codes))
    return out


def to_pb(policy: Policy) -> common_pb2.RetryPolicy:
    pb = common_pb2.RetryPolicy(
        multiplier=float(policy.get(MULTIPLIER, 0.0)),
        jitter=float(policy.get(JITTER, 0.0)),
        max_attempts=int(policy.get(MAX_ATTEMPTS, 0)),
        non_retryable_error_codes=list(policy.get(NON_RETRYABLE, [])),
    )
    for name in (INITIAL, MAX_DELAY):
        if name in policy:
            getattr(pb, name).FromNanoseconds(round(float(policy[name]) * 1e9))
    return pb
