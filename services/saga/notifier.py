"""Escalation of failed compensations (seed ADR-119 risks: "audit_log + Telegram alert").

The alert row (awooop_saga_alert) is written in the transaction that marks the step
compensation_failed, next to its audit row; this module delivers it afterwards, at least once:
  - Redis: XADD to <redis_prefix><alert_stream> (fields alert_id, kind, project_id, run_id, step_id,
    tool_id, error, created_at) for other systems to read; readers dedupe on alert_id.
  - Telegram Bot API: POST {telegram_api_base}/bot{token}/sendMessage with chat_id and text, when a
    token and a chat are configured.
Delivery never breaks compensation: failures are logged and retried on the next pass (several
replicas claim alerts with SKIP LOCKED), up to MAX_ATTEMPTS passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from typing import Any

from services.common import loops
from services.common.runtime import AppContext
from services.common.sagastate import StepStatus
from services.saga import notifier_sql
from services.saga.metrics import ALERTS

log = logging.getLogger("awooop.saga.notifier")

MAX_ATTEMPTS = 10  # delivery passes per alert before it is given up (and logged)
BATCH = 20
LOOP = "saga.alerts"
STREAM_MAXLEN = 10000  # approximate cap of the Redis stream
TELEGRAM_TRIES = 3
TELEGRAM_BACKOFF = (0.3, 1.0)
TELEGRAM_TIMEOUT = 5.0
TELEGRAM_MAX_TEXT = 4096  # Telegram's limit for one message

Alert = notifier_sql.ClaimAlertsRow  # an alert as delivery reads it


def alert_text(row: Alert) -> str:
    text = (
        "awooop: SAGA compensation failed, operator needed\n"
        f"project: {row['project_id']}\nrun: {row['run_id']}\nstep: {row['step_id']}\n"
        f"tool: {row['tool_id'] or '-'}\nerror: {row['error']}\n"
        f"retry or resolve: awooop.saga.v1.SagaService/RetryCompensation, /ResolveCompensation"
    )
    return text[:TELEGRAM_MAX_TEXT]


def _post_json(url: str, body: dict[str, Any], timeout: float) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer = json.loads(resp.read() or b"{}")
    if not answer.get("ok", False):
        raise RuntimeError(f"telegram answered ok=false: {answer.get('description', '')}")


class Notifier:
    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def telegram_enabled(self) -> bool:
        return bool(self.settings.telegram_bot_token and self.settings.telegram_chat_id)

    def deliver_soon(self) -> None:
        """Delivers pending alerts in the background now (the periodic pass catches what this misses)."""
        task = asyncio.create_task(self._deliver_logged())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver_logged(self) -> None:
        try:
            await self.deliver_pending()
        except Exception:
            log.warning("alert delivery pass failed; the next pass retries", exc_info=True)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def deliver_pending(self) -> int:
        rows = await notifier_sql.claim_alerts(self.ctx.pool, batch=BATCH)
        for row in rows:
            try:
                await self._deliver(row)
            except Exception as exc:  # this alert waits for the next pass; the others go out
                loops.row_failed(LOOP, f"alert {row['alert_id']} of run {row['run_id']}", exc)
        return len(rows)

    async def _deliver(self, row: Alert) -> None:
        redis_ok = row["redis_sent_at"] is not None or not self.ctx.cache.enabled
        telegram_ok = row["telegram_sent_at"] is not None or not self.telegram_enabled
        problems = []
        if not redis_ok:
            redis_ok = await self._to_redis(row)
            if not redis_ok:
                problems.append("redis unavailable")
        if not telegram_ok:
            err = await self._to_telegram(row)
            telegram_ok = err is None
            if err:
                problems.append(f"telegram: {err}")
        done = redis_ok and telegram_ok
        if not done and row["attempts"] >= MAX_ATTEMPTS:
            log.error(
                "giving up on alert delivery",
                extra={"alert_id": row["alert_id"], "run_id": str(row["run_id"]), "problems": problems},
            )
            done = True
        await notifier_sql.finish_alert(
            self.ctx.pool,
            alert_id=row["alert_id"],
            redis_sent=redis_ok and self.ctx.cache.enabled,
            telegram_sent=telegram_ok and self.telegram_enabled,
            last_error="; ".join(problems) or None,
            done=done,
        )

    async def _to_redis(self, row: Alert) -> bool:
        fields = {
            "alert_id": str(row["alert_id"]),
            "kind": StepStatus.COMPENSATION_FAILED.value,  # the alert's kind: the step status it reports
            "project_id": row["project_id"],
            "run_id": str(row["run_id"]),
            "step_id": row["step_id"],
            "tool_id": row["tool_id"] or "",
            "error": row["error"],
            "created_at": row["created_at"].isoformat(),
        }
        stream = self.ctx.cache.key(self.settings.alert_stream)
        ok = await self.ctx.cache.call("xadd", stream, fields, maxlen=STREAM_MAXLEN, approximate=True) is not None
        ALERTS.labels("redis", "ok" if ok else "error").inc()
        return ok

    async def _to_telegram(self, row: Alert) -> str | None:
        """None when delivered, else the last error (the bot token never appears in it)."""
        s = self.settings
        url = f"{s.telegram_api_base.rstrip('/')}/bot{s.telegram_bot_token}/sendMessage"
        body = {"chat_id": s.telegram_chat_id, "text": alert_text(row), "disable_web_page_preview": True}
        last = ""
        for i in range(TELEGRAM_TRIES):
            try:
                await asyncio.to_thread(_post_json, url, body, TELEGRAM_TIMEOUT)
                ALERTS.labels("telegram", "ok").inc()
                return None
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError, ValueError, RuntimeError) as exc:
                last = type(exc).__name__ if isinstance(exc, urllib.error.URLError | OSError) else str(exc)
            ALERTS.labels("telegram", "error").inc()
            log.warning("telegram alert failed", extra={"alert_id": row["alert_id"], "try": i + 1, "error": last})
            if i < len(TELEGRAM_BACKOFF):
                await asyncio.sleep(TELEGRAM_BACKOFF[i])
        return last
