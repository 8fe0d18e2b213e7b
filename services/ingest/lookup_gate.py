"""Whether asking Redis before Postgres pays: the share of duplicates among the events the
process's memory did not answer, kept as a moving average.

A Redis lookup answers a duplicate without Postgres, but a unique event pays the lookup's round
trip and then Postgres all the same. When duplicates are rare (a provider's retries among fresh
events, the usual traffic) the lookups are skipped and the misses go straight to Postgres, whose
unique constraint decides as it always does: a duplicate that skipped Redis is answered there,
with its run, and counted here, so a burst of redeliveries opens the gate again within a few
dozen events. Nothing about exactly-once depends on it; only which store answers a duplicate.
"""

from __future__ import annotations

# Ask Redis while at least this share of the events that reach it or Postgres are duplicates: a
# lookup costs every unique event a round trip and saves a duplicate one Postgres statement, a
# few times a lookup's cost (docs/benchmarks.md, issue 29).
MIN_DUPLICATE_SHARE = 0.25
# events the moving average spans (each event moves it by 1/WINDOW of the gap)
WINDOW = 64


class LookupGate:
    def __init__(self, min_share: float = MIN_DUPLICATE_SHARE, window: int = WINDOW) -> None:
        self.min_share = min_share
        self.weight = 1.0 / max(1, window)
        self.share = 1.0  # a new process asks Redis until its traffic says otherwise

    @property
    def open(self) -> bool:
        return self.share >= self.min_share

    def observe(self, events: int, duplicates: int) -> None:
        """Events answered by Redis or Postgres, and how many of them were duplicates."""
        if events <= 0:
            return
        # n steps of the moving average at once: the gap shrinks by (1 - w) per event
        keep = (1.0 - self.weight) ** events
        self.share = self.share * keep + (duplicates / events) * (1.0 - keep)
