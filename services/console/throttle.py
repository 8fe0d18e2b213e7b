"""Failed console sign-ins, throttled per client address and per key id (the `awk_<key_id>_`
part of a key): after `max_failures` failures within `window` seconds from one address, or with
one key id, further sign-ins from there are refused (429) without the key being checked, until
the oldest of those failures is `window` old.

An attempt counts as a failure from the moment it passes the check until its key is accepted, so
concurrent guesses are throttled as sequential ones are: with a limit of 5, of 40 simultaneous
wrong keys 5 are checked and 35 refused. A sign-in that succeeds (or that the services could not
judge) takes its attempt back; it does not clear earlier failures, so one valid key does not
reset the count for guesses made around it.

The state is this process's memory (per console process; replicas count separately, and a restart
forgets): each table keeps at most `max_tracked` names, each at most `max_failures` timestamps,
and drops the name that failed least recently when full. A process is single-threaded (asyncio):
check-and-count is one step."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_TRACKED = 10_000  # addresses (and key ids) remembered per console process


@dataclass(frozen=True, slots=True)
class Refusal:
    by: str  # "address" or "key_id": the metric's label and what the page says
    retry_after: int  # whole seconds until an attempt would be checked again


class FailureLog:
    """Recent failure times per name, at most `limit` per name and `max_tracked` names."""

    def __init__(self, limit: int, window: float, max_tracked: int) -> None:
        self.limit = limit
        self.window = window
        self.max_tracked = max_tracked
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, name: str, now: float) -> float:
        """Seconds until `name` may try again (0: now)."""
        times = self._times.get(name)
        if times is None:
            return 0.0
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._times[name]
            return 0.0
        return times[0] + self.window - now if len(times) >= self.limit else 0.0

    def add(self, name: str, now: float) -> None:
        times = self._times.get(name)
        if times is None:
            times = self._times[name] = deque(maxlen=self.limit)
            if len(self._times) > self.max_tracked:
                self._times.popitem(last=False)
        else:
            self._times.move_to_end(name)
        times.append(now)

    def take_back(self, name: str) -> None:
        times = self._times.get(name)
        if times:
            times.pop()
            if not times:
                del self._times[name]

    def __len__(self) -> int:
        return len(self._times)


class SigninThrottle:
    def __init__(
        self,
        max_failures: int,
        window: float,
        *,
        max_tracked: int = MAX_TRACKED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = max_failures > 0 and window > 0
        self.clock = clock
        self.by_address = FailureLog(max(1, max_failures), window, max_tracked)
        self.by_key_id = FailureLog(max(1, max_failures), window, max_tracked)

    def attempt(self, address: str, key_id: str | None) -> Refusal | None:
        """A refusal when the address or key id has used its failures; else the attempt is
        counted as a failure until `take_back`."""
        if not self.enabled:
            return None
        now = self.clock()
        logs = [("address", self.by_address, address)]
        if key_id:
            logs.append(("key_id", self.by_key_id, key_id))
        for by, log, name in logs:
            wait = log.wait(name, now)
            if wait > 0:
                return Refusal(by, max(1, math.ceil(wait)))
        for _, log, name in logs:
            log.add(name, now)
        return None

    def take_back(self, address: str, key_id: str | None) -> None:
        """The attempt was not a failure (the key was accepted, or could not be judged)."""
        if not self.enabled:
            return
        self.by_address.take_back(address)
        if key_id:
            self.by_key_id.take_back(key_id)
