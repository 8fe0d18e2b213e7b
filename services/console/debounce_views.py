"""The console's debounce page (issue 46): a project's debounce rules, as `awooop flow debounces`
shows them, with a form to set one (SetDebounceRule) and a Delete button per rule
(DeleteDebounceRule). The scheduler checks the admin role and the rule (a bad one is shown as the
service's INVALID_ARGUMENT, field by field) and audits the change."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from aiohttp import web

from awooop.cli.debounce import CHANNELS, MODES, rule_text
from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2

if TYPE_CHECKING:
    from services.console.views import Console

MAX_FIELD = 256


def _seconds(text: str) -> float:
    """A form's seconds (0: unset, which the scheduler refuses or defaults as its field says)."""
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if 0 < value < 1e9 else 0.0


def _channel(text: str) -> common_pb2.ChannelType.ValueType:
    name = text if text in CHANNELS else "unspecified"
    return common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{name.upper()}")


class DebounceViews:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def page(self, request: web.Request) -> web.StreamResponse:
        self.c.need(request)
        project = request.match_info["project"]
        found = await self.c.call(
            request,
            self.c.backend.scheduler.ListDebounceRules,
            scheduler_pb2.ListDebounceRulesRequest(project_id=project),
        )
        rows = [
            dict(zip(("channel", "key", "window", "max_wait", "mode"), rule_text(r), strict=True)) for r in found.rules
        ]
        return self.c.render(
            request, "debounce.html", project=project, rows=rows, channels=CHANNELS, modes=sorted(MODES)
        )

    async def set_rule(self, request: web.Request) -> web.StreamResponse:
        self.c.need(request)
        project = request.match_info["project"]
        form = await request.post()
        rule = scheduler_pb2.DebounceRule(
            project_id=project,
            channel_type=_channel(str(form.get("channel", ""))),
            key_expression=str(form.get("key", "")).strip()[:MAX_FIELD],
            mode=MODES.get(str(form.get("mode", "")), scheduler_pb2.DEBOUNCE_MODE_ALL),
        )
        rule.window.FromNanoseconds(round(_seconds(str(form.get("window", ""))) * 1e9))
        max_wait = _seconds(str(form.get("max_wait", "")))
        if max_wait:
            rule.max_wait.FromNanoseconds(round(max_wait * 1e9))
        await self.c.call(
            request, self.c.backend.scheduler.SetDebounceRule, scheduler_pb2.SetDebounceRuleRequest(rule=rule)
        )
        raise web.HTTPSeeOther(f"/projects/{quote(project, safe='')}/debounce?msg=debounce_set")

    async def delete_rule(self, request: web.Request) -> web.StreamResponse:
        self.c.need(request)
        project = request.match_info["project"]
        form = await request.post()
        req = scheduler_pb2.DeleteDebounceRuleRequest(
            project_id=project, channel_type=_channel(str(form.get("channel", "")))
        )
        await self.c.call(request, self.c.backend.scheduler.DeleteDebounceRule, req)
        raise web.HTTPSeeOther(f"/projects/{quote(project, safe='')}/debounce?msg=debounce_deleted")
