"""Provider event ids: the last part of the dedupe key (project_id, channel_type, provider_event_id)
of seed ADR-114 D1, derived from the channel's own delivery when the caller does not give one.

| channel      | provider_event_id                                                                 |
|--------------|-----------------------------------------------------------------------------------|
| telegram     | payload.update_id (an integer); "<endpoint>:<update_id>" when the endpoint is known |
| alertmanager | payload.groupKey + ":" + sha256 of the sorted alert fingerprints (see below)      |
| gitea        | the X-Gitea-Delivery header (names match case-insensitively)                      |
| line         | payload.events[i].webhookEventId, one event (and one run) per element             |
| api          | the idempotency-key header, else the request's `idempotency-key` metadata         |

Alertmanager: each alert contributes "<fingerprint>=<status>@<startsAt>" (the parts it has); the
distinct items are sorted and joined with newlines before hashing. A retried or re-sent (repeat
interval) notification carries the same alerts with the same statuses and startsAt, so it is a
duplicate; the "resolved" notification of the same group is a new event (its statuses differ); the
same alert firing again as a new incident has a new startsAt (Alertmanager starts a new alert once
the old one resolved), so it is a new run; an alert joining or leaving the group changes the set,
so it is a new event too. A groupKey too long to fit 256 characters is replaced by
"sha256:<hex of the groupKey>".

Telegram: update_id counts per bot, so two bots of one project would collide on it. A delivery
that names its endpoint (every HTTP delivery, and gRPC requests that set `endpoint`) gets
"<endpoint>:<update_id>"; without one the id stays the update_id (seed ADR-114 D1).

Everything here is a pure function over plain Python values (the payload as a dict), so each
channel is unit-tested without a server. Problems are reported as (field, description) pairs with
field paths relative to the request ("payload.update_id", "headers.X-Gitea-Delivery").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.jsonvalues import SAFE_INTEGER
from services.common.limits import MAX_PROVIDER_EVENT_ID
from services.common.validate import is_text

GITEA_DELIVERY_HEADER = "X-Gitea-Delivery"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"  # also the gRPC metadata name for the API channel

Violation = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Derived:
    """One event of a delivery: its provider event id, and for LINE the event object (the run's
    default input); None means the whole payload is the default input."""

    provider_event_id: str
    event: dict[str, Any] | None = None


class DerivationError(Exception):
    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(f"{f}: {d}" for f, d in violations))
        self.violations = violations


def header(headers: Mapping[str, str], name: str) -> str:
    """The value of header `name`, matched case-insensitively; "" when absent."""
    value = headers.get(name)
    if value is not None:
        return value
    lname = name.lower()
    for k, v in headers.items():
        if k.lower() == lname:
            return v
    return ""


def derive(
    channel: str,
    payload: Mapping[str, Any],
    headers: Mapping[str, str],
    *,
    provider_event_id: str = "",
    idempotency_key: str = "",
    endpoint: str = "",
) -> list[Derived]:
    """The events of one delivery with their provider event ids.

    A non-empty provider_event_id is used as given (one event). idempotency_key is the
    API channel's fallback (the request metadata). endpoint scopes Telegram update ids to
    one bot. Raises DerivationError when the delivery lacks what the channel needs."""
    if provider_event_id:
        return [Derived(provider_event_id)]
    fn = _DERIVERS.get(channel)
    if fn is None:
        raise DerivationError([("channel_type", f"unknown channel {channel!r}")])
    derived = fn(payload, headers, idempotency_key)
    if endpoint and channel == "telegram":
        return [Derived(_check_id("endpoint", f"{endpoint}:{d.provider_event_id}"), d.event) for d in derived]
    return derived


def _check_id(field: str, value: str) -> str:
    if not value:
        raise DerivationError([(field, "must not be empty")])
    if len(value) > MAX_PROVIDER_EVENT_ID:
        raise DerivationError([(field, f"at most {MAX_PROVIDER_EVENT_ID} characters as a provider event id")])
    if "\x00" in value:
        raise DerivationError([(field, "must not contain NUL characters")])
    if not is_text(value):  # a header's invalid UTF-8 bytes
        raise DerivationError([(field, "must be valid UTF-8")])
    return value


def telegram(payload: Mapping[str, Any], headers: Mapping[str, str], idempotency_key: str) -> list[Derived]:
    field = "payload.update_id"
    if "update_id" not in payload:
        raise DerivationError([(field, "required for TELEGRAM when provider_event_id is empty")])
    value = payload["update_id"]
    # JSON numbers arrive as int or float; only exactly representable integers are ids (1e300
    # is none); bool is an int subclass and is refused
    if (type(value) is int or (type(value) is float and value.is_integer())) and -SAFE_INTEGER < value < SAFE_INTEGER:
        return [Derived(str(int(value)))]
    if isinstance(value, str) and value.lstrip("-").isdigit() and value.isascii():
        return [Derived(_check_id(field, str(int(value))))]
    raise DerivationError([(field, f"must be an integer between -2^53 and 2^53 (got {_short(value)})")])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def alertmanager(payload: Mapping[str, Any], headers: Mapping[str, str], idempotency_key: str) -> list[Derived]:
    problems: list[Violation] = []
    group_key = payload.get("groupKey")
    if not isinstance(group_key, str) or not group_key:
        problems.append(("payload.groupKey", "required (a non-empty string) for ALERTMANAGER"))
    alerts = payload.get("alerts")
    items: set[str] = set()
    if not isinstance(alerts, list) or not alerts:
        problems.append(("payload.alerts", "required (a non-empty list of alerts) for ALERTMANAGER"))
    else:
        for i, alert in enumerate(alerts):
            fp = alert.get("fingerprint") if isinstance(alert, dict) else None
            if not isinstance(fp, str) or not fp:
                problems.append((f"payload.alerts[{i}].fingerprint", "required (a non-empty string)"))
                continue
            item = fp
            status = alert.get("status")
            if isinstance(status, str) and status:
                item += f"={status}"
            starts_at = alert.get("startsAt")
            if isinstance(starts_at, str) and starts_at:
                item += f"@{starts_at}"
            items.add(item)
    if problems:
        raise DerivationError(problems)
    assert isinstance(group_key, str)
    digest = hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()
    if len(group_key) + 1 + len(digest) > MAX_PROVIDER_EVENT_ID or "\x00" in group_key:
        group_key = "sha256:" + hashlib.sha256(group_key.encode()).hexdigest()
    return [Derived(f"{group_key}:{digest}")]


def gitea(payload: Mapping[str, Any], headers: Mapping[str, str], idempotency_key: str) -> list[Derived]:
    field = f"headers.{GITEA_DELIVERY_HEADER}"
    value = header(headers, GITEA_DELIVERY_HEADER)
    if not value:
        raise DerivationError([(field, "required for GITEA when provider_event_id is empty")])
    return [Derived(_check_id(field, value))]


def line(payload: Mapping[str, Any], headers: Mapping[str, str], idempotency_key: str) -> list[Derived]:
    events = payload.get("events")
    if not isinstance(events, list):
        raise DerivationError([("payload.events", "required (a list of events) for LINE")])
    # An empty list is LINE's webhook URL verification: no events, no runs.
    out: list[Derived] = []
    problems: list[Violation] = []
    for i, event in enumerate(events):
        field = f"payload.events[{i}].webhookEventId"
        wid = event.get("webhookEventId") if isinstance(event, dict) else None
        if not isinstance(wid, str) or not wid:
            problems.append((field, "required (a non-empty string)"))
            continue
        try:
            out.append(Derived(_check_id(field, wid), event))
        except DerivationError as exc:
            problems.extend(exc.violations)
    if problems:
        raise DerivationError(problems)
    return out


def api(payload: Mapping[str, Any], headers: Mapping[str, str], idempotency_key: str) -> list[Derived]:
    value = header(headers, IDEMPOTENCY_KEY_HEADER)
    if value:
        return [Derived(_check_id(f"headers.{IDEMPOTENCY_KEY_HEADER}", value))]
    if idempotency_key:
        return [Derived(_check_id(f"metadata.{IDEMPOTENCY_KEY_HEADER}", idempotency_key))]
    raise DerivationError(
        [("provider_event_id", "required for API: set it, or the idempotency-key header or request metadata")]
    )


_DERIVERS = {"telegram": telegram, "alertmanager": alertmanager, "gitea": gitea, "line": line, "api": api}
