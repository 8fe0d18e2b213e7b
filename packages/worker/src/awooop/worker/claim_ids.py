"""Claim ids (ClaimRunsRequest.claim_id): every claim the worker sends names itself, so that a
claim that committed but whose answer was lost is answered again, the same leases at once, by
its retry instead of its runs waiting RUNNING for their lease to expire.

A claim keeps its id (and its max_runs: the scheduler refuses an id reused with other
parameters) until it gets an answer or fails in a way that says it claimed nothing. UNAVAILABLE
(after the channel's own retries, which resend the same request) and DEADLINE_EXCEEDED leave
the outcome unknown, so the worker's next claim is that claim again."""

from __future__ import annotations

import secrets

import grpc

from awooop.worker.errors import AwooopError

# failures after which the claim may have committed: its retry sends the same id
OUTCOME_UNKNOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def new_claim_id() -> str:
    return secrets.token_urlsafe(16)  # 22 printable ASCII characters, no spaces


class ClaimIds:
    """The id of the claim the worker sends next."""

    def __init__(self) -> None:
        self._open: tuple[str, int] | None = None  # a claim without an answer yet: (id, max_runs)

    def next(self, max_runs: int) -> tuple[str, int]:
        """(claim id, max_runs) of the next claim: a claim whose outcome is unknown is sent
        again as it was; else a new claim with a fresh id."""
        if self._open is None:
            self._open = (new_claim_id(), max_runs)
        return self._open

    def answered(self, err: AwooopError | None = None) -> None:
        """The claim was answered (err None) or failed with err; unless err leaves its outcome
        unknown, the next claim is a new one."""
        if err is None or err.code not in OUTCOME_UNKNOWN:
            self._open = None
