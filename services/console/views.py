"""The console's HTTP handlers: read the request, call the services with the operator's key
(backend.py), shape the answer (pages.py), render a template. Every POST has passed the CSRF
check (app.py) before it gets here and answers with a redirect, so a reload never repeats it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from awooop.cli import timeline
from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.errors import AwooopError
from awooop.worker.structs import to_struct
from services.common.principals import parse_key
from services.console import metrics, pages, security
from services.console.backend import Backend
from services.console.sessions import Session, SessionStore
from services.console.throttle import SigninThrottle

# what the session middleware (app.py) resolved from the cookie
SESSION = web.RequestKey("session", Session)
TOKEN = web.RequestKey("token", str)

RUNS_PAGE = 50
APPROVALS_PAGE = 20
MAX_REASON = 4096
MAX_QUERY = 256
MAX_BUILD = 128  # a build id's longest (ClaimRunsRequest.build_id)
NOT_ACCEPTED = "That key was not accepted (unknown, revoked or mistyped)."
_THROTTLED = {
    "address": "Too many failed sign-ins from your address; try again in {} seconds.",
    "key_id": "Too many failed sign-ins with this key id; try again in {} seconds.",
}
NOT_A_RUN_ID = "A run id is a UUID such as 85d58297-913b-40bc-bf51-a6f8da384788; this address does not hold one."

# outcomes of actions, shown after the redirect (a fixed set: nothing from the URL is echoed)
MESSAGES = {
    "approved": "Approved: the run is RESUMED and will be claimed again.",
    "rejected": "Rejected: the run FAILED and its completed steps are being compensated.",
    "retried": "Compensation retry scheduled.",
    "resolved": "Compensation resolved by hand; the reason is in the audit log.",
    "cancelled": "Cancel requested.",
    "wait_completed": "Wait completed by hand: a run parked on it is PENDING and resumes with your result.",
    "wait_expired": "Wait expired by hand: a run parked on it is PENDING and its handler sees the timeout.",
    "unscheduled": "Schedule deleted: it starts no more runs (runs it started are kept).",
    "debounce_set": "Debounce rule set: the channel's next events are batched by it.",
    "debounce_deleted": "Debounce rule deleted: batches already open start when their window ends.",
    "signedout": "Signed out.",
    "expired": "Your session ended; sign in again.",
}


class Console:
    def __init__(
        self,
        templates: jinja2.Environment,
        sessions: SessionStore,
        backend: Backend,
        *,
        trace_url: str,
        secure: bool,
        throttle: SigninThrottle | None = None,
    ) -> None:
        self.templates = templates
        self.sessions = sessions
        self.backend = backend
        self.trace_url = trace_url
        self.secure = secure
        self.throttle = throttle or SigninThrottle(0, 0)

    # --- helpers -----------------------------------------------------------------------------

    def render(self, request: web.Request, name: str, status: int = 200, **ctx: Any) -> web.Response:
        session: Session | None = request.get(SESSION)
        msg = MESSAGES.get(request.query.get("msg", ""), "")
        html = self.templates.get_template(name).render(
            session=session, csrf=session.csrf if session else "", path=request.path_qs, message=msg, **ctx
        )
        return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")

    def not_found(self, request: web.Request, title: str, text: str) -> web.Response:
        """A 404 as a console page (styled, with a way back), never aiohttp's bare text."""
        return self.render(request, "message.html", status=404, title=title, text=text, run_id="")

    def need(self, request: web.Request) -> Session:
        session: Session | None = request.get(SESSION)
        if session is None:
            raise web.HTTPSeeOther("/signin?" + urlencode({"next": request.path_qs}))
        return session

    async def call(self, request: web.Request, method: Any, message: Any) -> Any:
        return await self.backend.call(method, message, self.need(request).api_key)

    async def _runs_with_journals(
        self, request: web.Request, project: str, **only: Any
    ) -> tuple[list[tuple[common_pb2.Run, saga_pb2.GetJournalResponse]], str]:
        """One page of the project's runs that match `only` (ListRuns filters), each with its journal
        (fetched concurrently), and the next page's URL ("" on the last page): the work queues."""
        self.need(request)
        listed = await self.call(
            request,
            self.backend.scheduler.ListRuns,
            scheduler_pb2.ListRunsRequest(
                project_id=project,
                page_size=APPROVALS_PAGE,
                page_token=request.query.get("page_token", "")[:MAX_QUERY],
                **only,
            ),
        )
        journals = await asyncio.gather(
            *(
                self.call(request, self.backend.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=r.run_id))
                for r in listed.runs
            )
        )
        next_url = "?" + urlencode({"page_token": listed.next_page_token}) if listed.next_page_token else ""
        return list(zip(listed.runs, journals, strict=True)), next_url

    # --- sign-in -----------------------------------------------------------------------------

    async def signin_form(
        self, request: web.Request, error: str = "", status: int = 200, *, next_path: str | None = None
    ) -> web.Response:
        """The sign-in page; next_path: where the posted form was going (kept across a retry)."""
        token = security.new_signin_token()
        response = self.render(
            request,
            "signin.html",
            status=status,
            signin_token=token,
            next=security.safe_next(request.query.get("next", "/") if next_path is None else next_path),
            error=error,
        )
        secure = security.secure_request(request, self.secure)
        security.set_cookie(response, security.SIGNIN_COOKIE, token, secure=secure, path="/signin")
        return response

    async def signin(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        key = str(form.get("api_key", "")).strip()
        target = security.safe_next(str(form.get("next", "/")))
        if not key:
            return await self.signin_form(request, "Paste an API key.", 400, next_path=target)
        parsed = parse_key(key)
        address, key_id = request.remote or "unknown", parsed[0] if parsed else None
        refusal = self.throttle.attempt(address, key_id)
        if refusal is not None:  # refused before the key is looked at
            metrics.SIGNIN_THROTTLED.labels(refusal.by).inc()
            text = _THROTTLED[refusal.by].format(refusal.retry_after)
            response = await self.signin_form(request, text, 429, next_path=target)
            response.headers["Retry-After"] = str(refusal.retry_after)
            return response
        try:
            accepted = parsed is not None and await self._key_accepted(key)
        except BaseException:  # not judged (the services failed): not a failure of the key
            self.throttle.take_back(address, key_id)
            raise
        if not accepted:
            metrics.SIGNIN_FAILURES.inc()
            return await self.signin_form(request, NOT_ACCEPTED, 401, next_path=target)
        self.throttle.take_back(address, key_id)
        token, _ = await self.sessions.create(key)
        response = web.HTTPSeeOther(target)
        security.set_cookie(
            response,
            security.SESSION_COOKIE,
            token,
            secure=security.secure_request(request, self.secure),
            max_age=int(self.sessions.ttl),
        )
        response.del_cookie(security.SIGNIN_COOKIE, path="/signin")
        raise response

    async def _key_accepted(self, key: str) -> bool:
        """The services decide whether a key is good: ListProjects needs a valid one."""
        try:
            await self.backend.call(self.backend.scheduler.ListProjects, scheduler_pb2.ListProjectsRequest(), key)
        except AwooopError as err:
            if err.code.name in ("UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT"):
                return False
            raise
        return True

    async def signout(self, request: web.Request) -> web.StreamResponse:
        await self.sessions.revoke(request.get(TOKEN, ""))
        response = web.HTTPSeeOther("/signin?msg=signedout")
        response.del_cookie(security.SESSION_COOKIE, path="/")
        raise response

    # --- projects and runs ---------------------------------------------------------------------

    async def home(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        resp = await self.call(request, self.backend.scheduler.ListProjects, scheduler_pb2.ListProjectsRequest())
        projects = list(resp.project_ids)
        if len(projects) == 1:
            raise web.HTTPSeeOther(f"/projects/{projects[0]}/runs")
        return self.render(request, "projects.html", projects=projects, all_projects=resp.all_projects)

    async def runs(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        project = request.match_info["project"]
        q = request.query
        f = _runs_query(request)
        if f.search and _is_uuid(f.search):  # a run id: straight to its page when it is one of ours
            try:
                got = await self.call(
                    request, self.backend.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=f.search)
                )
                raise web.HTTPSeeOther(f"/runs/{got.run.run_id}")
            except AwooopError as err:
                if err.code.name != "NOT_FOUND":
                    raise
        listed, overview = await self._listed(request, project, f)
        rows = [] if f.search and _is_uuid(f.search) else [pages.run_row(r) for r in listed.runs]
        filtered = bool(f.statuses or f.channels or f.since or f.until or f.search or f.parent or f.build)
        if not listed.runs and not filtered:
            known = await self.call(request, self.backend.scheduler.ListProjects, scheduler_pb2.ListProjectsRequest())
            if project not in known.project_ids:  # a typo, or a project nobody has used: say so
                return self.not_found(
                    request,
                    "No such project",
                    f"No project named {project!r} has runs, and none of your roles names it: a mistyped "
                    "project? (A project appears here once a run is created in it.) "
                    + (f"Projects you can see: {', '.join(known.project_ids)}." if known.project_ids else ""),
                )
        keep = [(k, v) for k, v in q.items() if k != "page_token" and v]
        return self.render(
            request,
            "runs.html",
            project=project,
            rows=rows,
            overview=overview,
            statuses=pages.STATUSES,
            channels=pages.CHANNELS,
            chosen_statuses=f.statuses,
            chosen_channels=f.channels,
            since=q.get("since", ""),
            until=q.get("until", ""),
            search=f.search,
            parent=f.parent,
            build=f.build,
            errors=f.errors,
            next_url=("?" + urlencode([*keep, ("page_token", listed.next_page_token)]))
            if listed.next_page_token
            else "",
            first_url=("?" + urlencode(keep)) if q.get("page_token") else "",
            filtered=filtered,
        )

    async def _listed(
        self, request: web.Request, project: str, f: _RunsQuery
    ) -> tuple[scheduler_pb2.ListRunsResponse, pages.Overview]:
        """The page of runs and the counts above it: the project's (CountRuns), or with 'children of'
        the parent's children (they live with their parent: another project's parent redirects)."""
        req = scheduler_pb2.ListRunsRequest(
            project_id=project,
            statuses=[common_pb2.RunStatus.Value(f"RUN_STATUS_{s}") for s in f.statuses],
            channel_types=[common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{c.upper()}") for c in f.channels],
            page_size=RUNS_PAGE,
            page_token=request.query.get("page_token", "")[:MAX_QUERY],
            provider_event_id=f.search if f.search and not _is_uuid(f.search) else "",
            parent_run_id=f.parent,
            build_id=f.build,
        )
        if f.since:
            req.created_after.FromDatetime(f.since)
        if f.until:
            req.created_before.FromDatetime(f.until)
        if not f.parent:
            listed, counted = await asyncio.gather(
                self.call(request, self.backend.scheduler.ListRuns, req),
                self.call(
                    request,
                    self.backend.scheduler.CountRuns,
                    scheduler_pb2.CountRunsRequest(project_id=project, include_finished=True),
                ),
            )
            return listed, pages.overview(counted)
        # the children's counts come with their parent (CountRuns counts the whole project)
        listed, got_parent = await asyncio.gather(
            self.call(request, self.backend.scheduler.ListRuns, req), self._parent(request, f.parent)
        )
        if got_parent is not None and got_parent.run.project_id != project:  # children live with their parent
            home = quote(got_parent.run.project_id, safe="")
            raise web.HTTPSeeOther(f"/projects/{home}/runs?{request.query_string}")
        if got_parent is None:
            f.errors.append(f"'children of': no run {f.parent} in your projects")
            return listed, pages.children_overview([], False)
        return listed, pages.children_overview(list(got_parent.children), got_parent.more_children)

    async def _parent(self, request: web.Request, run_id: str) -> scheduler_pb2.GetRunResponse | None:
        """GetRun of the run whose children are listed; None when the caller has no such run."""
        try:
            got: scheduler_pb2.GetRunResponse = await self.call(
                request, self.backend.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id)
            )
        except AwooopError as err:
            if err.code.name != "NOT_FOUND":
                raise
            return None
        return got

    async def run(self, request: web.Request) -> web.StreamResponse:
        session = self.need(request)
        run_id = request.match_info["run_id"]
        if not _is_uuid(run_id):
            return self.not_found(request, "No such run", NOT_A_RUN_ID)
        view = await self.backend.run_view(session.api_key, run_id)
        page = pages.run_page(
            view.run,
            view.history,
            view.journal,
            now=time.time(),
            timeline_page=_int(request.query.get("tl", "1")),
            steps_page=_int(request.query.get("st", "1")),
            trace_url=self.trace_url,
            problems=view.problems,
            waits=view.waits,
            progress=view.progress,
            waiting_for_build=view.waiting_for_build,
            tokens=view.tokens,
        )
        return self.render(
            request,
            "run.html",
            page=page,
            run=view.run,
            children=[(c.run_id, c.step_id, timeline.status_name(c.status)) for c in view.children],
            more_children=view.more_children,
            project=view.run.project_id,
            query=request.query,
        )

    # --- approvals ---------------------------------------------------------------------------

    async def approvals(self, request: web.Request) -> web.StreamResponse:
        project = request.match_info["project"]
        runs, next_url = await self._runs_with_journals(
            request, project, statuses=[common_pb2.RUN_STATUS_WAITING_APPROVAL]
        )
        items = [
            (pages.run_row(r), r.approval_summary, _when_expires(r), [pages.step_view(s) for s in j.steps])
            for r, j in runs
        ]
        return self.render(request, "approvals.html", project=project, items=items, next_url=next_url)

    async def decide(self, request: web.Request) -> web.StreamResponse:
        """The approvals page's form: the approver pastes the token they were sent."""
        self.need(request)
        run_id = request.match_info["run_id"]
        form = await request.post()
        return await self._decide(request, run_id, str(form.get("approval_token", "")).strip(), form)

    async def approval_link(self, request: web.Request) -> web.StreamResponse:
        """/approvals/<run_id>/<token>: the link a worker or a bot sends a person."""
        self.need(request)
        run_id = request.match_info["run_id"]
        if not _is_uuid(run_id):
            return self.not_found(request, "No such approval", NOT_A_RUN_ID)
        run = (await self.call(request, self.backend.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run
        steps, problem = [], ""
        try:  # the journal is worker/approver reading: a key without either still sees the question
            journal = await self.call(request, self.backend.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id))
            steps = [pages.step_view(s) for s in journal.steps]
        except AwooopError as err:
            if err.code.name not in ("PERMISSION_DENIED", "NOT_FOUND"):
                raise
            problem = f"journal: {err.details.render()}"
        state, sentence = pages.approval_state(run, time.time())
        if state == "open":  # the form only for a token that would work
            state, sentence = await self._token_state(request, run_id, request.match_info["token"][:MAX_QUERY])
        return self.render(
            request,
            "approval.html",
            status=200 if state == "open" else 410,
            run=pages.run_row(run),
            question=run.approval_summary,
            expires=_when_expires(run),
            steps=steps,
            state=state,
            sentence=sentence,
            error=problem,
        )

    async def _token_state(self, request: web.Request, run_id: str, token: str) -> tuple[str, str]:
        """("open", "") when the link's token would decide the run now (the scheduler checks it
        without deciding), else the link's state and sentence. A key without the approver role
        learns nothing of the token: it still sees the form, and its decision is refused."""
        try:
            await self.call(
                request,
                self.backend.scheduler.DecideApproval,
                scheduler_pb2.DecideApprovalRequest(run_id=run_id, approval_token=token, validate_only=True),
            )
        except AwooopError as err:
            if err.reason in ("APPROVAL_INVALID", "FIELD_INVALID"):  # wrong, or not even token-shaped
                return "invalid", pages.INVALID_LINK
            if err.reason == "APPROVAL_EXPIRED":
                return "expired", pages.EXPIRED_LINK
            if err.reason not in ("FORBIDDEN", "INVALID_TRANSITION"):
                raise
        return "open", ""

    async def approval_link_post(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        run_id, token = request.match_info["run_id"], request.match_info["token"]
        if not _is_uuid(run_id):
            return self.not_found(request, "No such approval", NOT_A_RUN_ID)
        return await self._decide(request, run_id, token, await request.post())

    async def _decide(self, request: web.Request, run_id: str, token: str, form: Any) -> web.StreamResponse:
        decision = str(form.get("decision", ""))
        if decision not in ("approve", "reject") or not token:
            raise web.HTTPBadRequest(text="choose approve or reject, with the approval token")
        reason = str(form.get("reason", "")).strip()[:MAX_REASON]
        try:
            await self.call(
                request,
                self.backend.scheduler.DecideApproval,
                scheduler_pb2.DecideApprovalRequest(
                    run_id=run_id,
                    approval_token=token,
                    decision=scheduler_pb2.DECISION_APPROVE if decision == "approve" else scheduler_pb2.DECISION_REJECT,
                    reason=reason,
                ),
            )
        except AwooopError as err:
            plain = {
                "APPROVAL_INVALID": "This approval token is not valid: it was already used, mistyped, or the run "
                "asked again with a new one.",
                "APPROVAL_EXPIRED": "This approval token expired; the run has failed (E-APPROVAL-002) and is being "
                "compensated.",
                "FORBIDDEN": "Your key has no approver role in this run's project, so it cannot decide.",
                "INVALID_TRANSITION": "This run is not waiting for approval any more.",
            }.get(err.reason)
            if plain is None:
                raise
            return self.render(
                request,
                "message.html",
                status=409 if err.reason != "FORBIDDEN" else 403,
                title="Not decided",
                text=plain,
                run_id=run_id,
            )
        raise web.HTTPSeeOther(f"/runs/{run_id}?msg={'approved' if decision == 'approve' else 'rejected'}")

    # --- compensation ------------------------------------------------------------------------

    async def compensations(self, request: web.Request) -> web.StreamResponse:
        project = request.match_info["project"]
        runs, next_url = await self._runs_with_journals(
            request, project, saga_statuses=[common_pb2.SAGA_STATUS_COMPENSATION_FAILED]
        )
        items = [
            (pages.run_row(r), [v for v in map(pages.step_view, j.steps) if v.compensation_failed]) for r, j in runs
        ]
        return self.render(request, "compensations.html", project=project, items=items, next_url=next_url)

    async def retry(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        run_id = _run_id(request)
        form = await request.post()
        await self.call(
            request,
            self.backend.saga.RetryCompensation,
            saga_pb2.RetryCompensationRequest(run_id=run_id, step_id=str(form.get("step_id", ""))[:MAX_QUERY]),
        )
        raise web.HTTPSeeOther(f"/runs/{run_id}?msg=retried")

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        run_id = _run_id(request)
        form = await request.post()
        await self.call(
            request,
            self.backend.saga.ResolveCompensation,
            saga_pb2.ResolveCompensationRequest(
                run_id=run_id,
                step_id=str(form.get("step_id", ""))[:MAX_QUERY],
                reason=str(form.get("reason", "")).strip()[:MAX_REASON],
            ),
        )
        raise web.HTTPSeeOther(f"/runs/{run_id}?msg=resolved")

    async def schedules(self, request: web.Request) -> web.StreamResponse:
        """The project's cron schedules: next tick, and why the last tick failed (the scheduler
        retries a failed tick an hour later), as `awooop flow schedules`."""
        self.need(request)
        project = request.match_info["project"]
        found = await self.call(
            request, self.backend.scheduler.ListSchedules, scheduler_pb2.ListSchedulesRequest(project_id=project)
        )
        rows = [pages.schedule_row(s) for s in found.schedules]
        return self.render(request, "schedules.html", project=project, rows=rows)

    async def workers(self, request: web.Request) -> web.StreamResponse:
        """The project's workers with their labels, live or gone, as `awooop workers list`."""
        self.need(request)
        project = request.match_info["project"]
        found = await self.call(
            request, self.backend.scheduler.ListWorkers, scheduler_pb2.ListWorkersRequest(project_id=project)
        )
        rows = [pages.worker_row(w) for w in found.workers]
        return self.render(request, "workers.html", project=project, rows=rows)

    async def unschedule(self, request: web.Request) -> web.StreamResponse:
        """The schedules page's Delete form (admin role: the scheduler decides; audited there)."""
        self.need(request)
        project = request.match_info["project"]
        form = await request.post()
        name = str(form.get("name", ""))[:MAX_QUERY]
        await self.call(
            request,
            self.backend.scheduler.DeleteSchedule,
            scheduler_pb2.DeleteScheduleRequest(project_id=project, name=name),
        )
        raise web.HTTPSeeOther(f"/projects/{quote(project, safe='')}/schedules?msg=unscheduled")

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        self.need(request)
        run_id = _run_id(request)
        form = await request.post()
        await self.call(
            request,
            self.backend.scheduler.CancelRun,
            scheduler_pb2.CancelRunRequest(run_id=run_id, reason=str(form.get("reason", "")).strip()[:MAX_REASON]),
        )
        raise web.HTTPSeeOther(f"/runs/{run_id}?msg=cancelled")

    # --- durable waits, by hand (approver role: the scheduler decides) ---------------------------

    async def end_wait(self, request: web.Request) -> web.StreamResponse:
        """The run page's Complete / Expire forms of an open wait: CompleteWait with the form's
        JSON object, or ExpireWait. Audited by the scheduler with the operator as actor."""
        self.need(request)
        run_id = _run_id(request)
        wait_id = request.match_info["wait_id"]
        if not _is_uuid(wait_id):
            raise web.HTTPNotFound(text="no such wait")
        form = await request.post()
        expire = request.match_info["end"] == "expire"
        try:
            if expire:
                await self.call(
                    request, self.backend.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait_id)
                )
            else:
                result = _json_object(str(form.get("result", "") or "{}"))  # its size: the scheduler's limit
                if result is None:
                    return self.render(
                        request,
                        "message.html",
                        status=400,
                        title="Not completed",
                        text='The result must be a JSON object, for example {"approved": true}.',
                        run_id=run_id,
                    )
                await self.call(
                    request,
                    self.backend.scheduler.CompleteWait,
                    scheduler_pb2.CompleteWaitRequest(wait_id=wait_id, result=to_struct(result)),
                )
        except AwooopError as err:
            plain = {
                "WAIT_CLOSED": "This wait has already ended (" + err.details.metadata.get("outcome", "") + ").",
                "FORBIDDEN": "Your key has no approver role in this run's project, so it cannot end its waits.",
                "INVALID_TRANSITION": "This run is over: its waits take no completion.",
            }.get(err.reason)
            if plain is None:
                raise
            title = "Not expired" if expire else "Not completed"
            status = 403 if err.reason == "FORBIDDEN" else 409
            return self.render(request, "message.html", status=status, title=title, text=plain, run_id=run_id)
        raise web.HTTPSeeOther(f"/runs/{run_id}?msg={'wait_expired' if expire else 'wait_completed'}")


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class _RunsQuery:
    """The runs list's filters as the query string gives them, and what in it could not be read."""

    statuses: list[str]
    channels: list[str]
    search: str
    parent: str
    build: str  # only the runs on this worker build ("": all)
    since: dt.datetime | None
    until: dt.datetime | None
    errors: list[str]


def _runs_query(request: web.Request) -> _RunsQuery:
    q = request.query
    statuses = [s for s in q.getall("status", []) if s in pages.STATUSES]
    channels = [c for c in q.getall("channel", []) if c in pages.CHANNELS]
    search = q.get("q", "").strip()[:MAX_QUERY]
    parent = q.get("parent", "").strip()[:MAX_QUERY]
    build = q.get("build", "").strip()[:MAX_BUILD]
    errors: list[str] = []
    if not build.isprintable() or " " in build:
        errors.append("'build' is a build id: printable characters without spaces")
        build = ""
    if parent and not _is_uuid(parent):
        errors.append("'children of' is not a run id (a UUID such as the ones in the run column)")
        parent = ""
    since = until = None
    try:
        since = pages.parse_time(q.get("since", ""))
    except ValueError:
        errors.append("'from' is not a date or time (use 2026-12-01 or 2026-12-01T07:30)")
    try:
        until = pages.parse_time(q.get("until", ""))
    except ValueError:
        errors.append("'to' is not a date or time (use 2026-12-01 or 2026-12-01T07:30)")
    return _RunsQuery(statuses, channels, search, parent, build, since, until, errors)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _run_id(request: web.Request) -> str:
    run_id = request.match_info["run_id"]
    if not _is_uuid(run_id):
        raise web.HTTPNotFound(text="no such run")
    return run_id


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 1


def _when_expires(run: common_pb2.Run) -> str:
    from awooop.cli.client import when

    return when(run.approval_expires_at) if run.HasField("approval_expires_at") else ""
