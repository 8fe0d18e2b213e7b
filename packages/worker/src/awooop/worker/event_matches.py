"""The match vocabulary of event waits (`ctx.wait_for_event(match, ...)`): which channel event
completes a wait. Declared here once; the event side, the key each arriving event carries, is
the SQL function awooop_event_key (migration 0171), and the scheduler's wait sweep compares the
two (docs/worker-sdk.md "Event matches").

| match                                              | completed by                                          |
|----------------------------------------------------|-------------------------------------------------------|
| {"channel": "api", "correlation_key": K} (or K)    | an API event whose payload has "correlation_key": K   |
| {"channel": "telegram", "chat_id": C}              | a Telegram message in chat C (a reply in the same chat) |
| {"channel": "alertmanager", "group_key": G}        | an Alertmanager notification of group G with status "resolved" |

A match is sent to CreateWait as (channel, correlation_key): the API key as it is, the chat id
as its decimal text, the group key as the md5 hex of its text (a fixed length for a group key of
any length; a digest for matching, not a secret).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

Match = str | Mapping[str, Any]

FIELDS = {"api": "correlation_key", "telegram": "chat_id", "alertmanager": "group_key"}


def key_of(match: Match) -> tuple[str, str]:
    """(channel, correlation_key) of a match; ValueError naming what is wrong with it."""
    if isinstance(match, str):
        return "api", match
    channel = match.get("channel", "api")
    if channel not in FIELDS:
        raise ValueError(f"match channel must be one of {', '.join(FIELDS)}, not {channel!r}")
    field = FIELDS[channel]
    extra = set(match) - {"channel", field}
    if extra or field not in match:
        raise ValueError(f"a {channel} match is {{'channel': {channel!r}, {field!r}: ...}}, not {dict(match)!r}")
    value = match[field]
    if channel == "telegram":
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).lstrip("-").isdigit():
            raise ValueError(f"telegram chat_id must be an integer, not {value!r}")
        return channel, str(int(value))
    if not isinstance(value, str) or not value:
        raise ValueError(f"{channel} {field} must be a non-empty string, not {value!r}")
    if channel == "alertmanager":
        return channel, hashlib.md5(value.encode(), usedforsecurity=False).hexdigest()
    return channel, value
