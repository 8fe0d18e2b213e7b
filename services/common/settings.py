"""Settings from AWOOOP_* environment variables, with the documented defaults.

Every knob lives here so the configuration table has one source: docs/configuration.md
is generated from this class (`python -m services.common.settings`), taking each
setting's meaning from the comment on its line (or the comment lines just above it), so
give every new field such a comment. Durations are seconds (floats allowed) so tests can
shorten leases and loops.
"""

from __future__ import annotations

import inspect
import io
import os
import re
import shlex
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from awooop.worker.client import local_address
from services.common.limits import MAX_CHILD_DEPTH, MAX_CHILDREN_PER_RUN


class SettingsError(ValueError):
    """An AWOOOP_* variable that does not parse; the message names it."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse(name: str, raw: str, cast: type) -> Any:
    if cast is bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise SettingsError(f"{name}={raw!r} is not a boolean (use one of {', '.join(_TRUE + _FALSE)})")
    try:
        return cast(raw.strip()) if cast in (int, float) else cast(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a valid {cast.__name__}") from None


def read_key_file(name: str, path: str) -> str:
    """The key in the file a *_FILE setting names (surrounding whitespace dropped)."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{name}={path!r} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if not key:
        raise SettingsError(f"{name}={path!r} is empty")
    return key


def _env(name: str, default: Any, cast: type, environ: Mapping[str, str] | None = None) -> Any:
    env_name = f"AWOOOP_{name}"
    raw = (os.environ if environ is None else environ).get(env_name)
    if raw is None or raw == "":
        return default
    return _parse(env_name, raw, cast)


@dataclass(frozen=True)
class Settings:
    # --- store and cache ---
    database_url: str = ""  # Postgres DSN; empty: `awooop up` starts an embedded Postgres, `serve` refuses to start
    # session connection for LISTEN, migrations (which create the plan functions of
    # AWOOOP_DB_SERVER_PLANS) and `awooop admin` when AWOOOP_DATABASE_URL goes through a
    # transaction-mode pooler (PgBouncer); empty: AWOOOP_DATABASE_URL
    database_direct_url: str = ""
    # asyncpg's prepared statement cache; false behind a transaction-mode pooler (PgBouncer before 1.21)
    db_statement_cache: bool = True
    # with the statement cache off, run the hot statements (claim, complete, heartbeat) as the
    # server-side functions `awooop migrate` creates, so their plans are kept; without one, plain
    db_server_plans: bool = True
    redis_url: str = ""  # empty: `awooop up` starts an embedded Redis; services run without Redis
    # AWOOOP_REDIS_URL names one node of a Redis Cluster: use the cluster client (keys carry a
    # {project} hash tag, so each call's keys share a slot)
    redis_cluster: bool = False
    redis_prefix: str = "awooop:"  # every Redis key starts with this (lets tenants of one Redis coexist)
    db_pool_min: int = 2  # connections opened at start (when the store is up) and kept
    db_pool_max: int = 10  # most connections one process holds; size Postgres max_connections for all replicas
    db_statement_timeout: float = 10.0  # Postgres statement_timeout; a slower statement answers UNAVAILABLE
    db_connect_timeout: float = 5.0  # connect / pool acquire timeout; past it the RPC answers UNAVAILABLE
    migrate_on_start: bool = False  # apply pending migrations before serving (concurrent starts wait on a lock)

    # --- listeners ---
    host: str = "127.0.0.1"  # address the gRPC and metrics listeners bind; 0.0.0.0 in containers
    ingest_port: int = 50051  # gRPC port of the ingest service
    scheduler_port: int = 50052  # gRPC port of the scheduler service
    saga_port: int = 50053  # gRPC port of the saga service
    gateway_port: int = 50054  # gRPC port of the reference tool gateway
    http_port: int = 8080  # HTTP port of the ingest service (webhooks, API events: docs/channels.md); 0 disables
    # where the scheduler listens, as the CLI and SDK read the same variable: ingest's HTTP run event
    # streams (GET /v1/runs/<id>/events) call WatchRun there; empty: AWOOOP_SCHEDULER_PORT on this host
    scheduler_addr: str = ""
    # Prometheus /metrics (one per process); 0 disables the endpoint. Unset in a process of one
    # service (`awooop serve saga`): that service's own port, 9464 ingest, 9465 scheduler, 9466 saga,
    # 9467 gateway, so single-service processes on one host do not collide
    metrics_port: int = 9464
    tls_cert_file: str = ""  # PEM certificate chain; with tls_key_file set, every gRPC and HTTP port serves TLS only
    tls_key_file: str = ""  # PEM private key of tls_cert_file
    # on SIGTERM: seconds health stays NOT_SERVING while still serving, so load balancers move away first
    shutdown_delay: float = 0.0
    shutdown_grace: float = 10.0  # then seconds in-flight RPCs get to finish before they are cancelled
    max_message_bytes: int = 4 * 1024 * 1024  # largest gRPC message received or sent
    # RPCs one server handles at once (long-polling claims included); past it a call answers
    # UNAVAILABLE / OVERLOADED at once (retryable: the SDK retries with backoff); 0: no limit
    max_concurrent_rpcs: int = 2000
    log_level: str = "INFO"  # DEBUG, INFO, WARNING or ERROR; logs are JSON lines on stderr
    access_log: bool = True  # one JSON line per RPC (method, code, ms, principal, peer), at DEBUG
    uvloop: bool = False  # run the event loop on uvloop (pip install awooop[uvloop])

    # --- auth ---
    auth_cache_seconds: float = 5.0  # how long a verified API key is trusted before re-reading it
    # service key (a principal with a role in every project) the scheduler presents to the saga and the
    # saga to the tool gateway; without one the saga compensates nothing and its compensation health
    # (awooop.saga.compensation) is NOT_SERVING, while its journal serves
    internal_api_key: str = ""
    # a file holding AWOOOP_INTERNAL_API_KEY (a mounted secret; docker-compose.yml's internal-key step
    # writes one), read at start-up when AWOOOP_INTERNAL_API_KEY is empty; unreadable or empty stops the process
    internal_api_key_file: str = ""
    # a key id this process does not know is looked up by refreshing its set of live key ids, at most
    # once per this many seconds however many requests miss (a flood of unknown keys costs no query each)
    auth_key_refresh_seconds: float = 1.0

    # --- ingest ---
    max_payload_bytes: int = 256 * 1024  # largest event payload / run input, as compact JSON
    max_batch: int = 1000  # most events in one IngestEvents call
    dedupe_retention: float = 7 * 24 * 3600.0  # how long an event id is remembered (seed 000 D1: 7 days)
    idempotency_ttl: float = 24 * 3600.0  # how long an idempotency key replays its response (seed 003: 24 h)
    policy_version: str = "v1"  # sanitizer/policy version recorded with idempotency keys
    # how long a finished run (COMPLETED, FAILED, CANCELLED) is kept with its journal, compensation and
    # audit rows, counted from its last change; 0 keeps runs for ever
    run_retention: float = 30 * 24 * 3600.0
    # how often expired dedupe rows and idempotency keys (ingest) and recorded claim answers (scheduler) are pruned
    prune_interval: float = 300.0
    prune_batch: int = 5000  # rows deleted per pruning statement (short transactions, no long locks)
    redis_dedupe_ttl: float = 24 * 3600.0  # how long Redis answers a repeated event id without Postgres
    # recent event ids each ingest process answers from its own memory, without Redis (0: off; ~0.4 KB each)
    dedupe_memory_keys: int = 50_000
    endpoint_cache_seconds: float = 5.0  # how long webhook endpoint secrets are trusted before re-reading them
    # how long an ingest process trusts the debounce rules it read (a rule set or deleted takes effect within it)
    debounce_rule_cache_seconds: float = 5.0
    endpoint_rotation_grace: float = 24 * 3600.0  # how long a rotated endpoint's previous secret still verifies

    # --- scheduler ---
    lease_ttl: float = 300.0  # lease a claim grants unless the claim asks for its own (seed 000: 5 min)
    # workers choose their heartbeat period (the SDK: min(30 s, lease / 3)); the services only warn at
    # start when this expected period (seed 000: 30 s) is not shorter than lease_ttl
    heartbeat_interval: float = 30.0
    reaper_interval: float = 60.0  # how often expired leases are reaped (seed 000: 60 s)
    max_attempts: int = 3  # attempts a run gets unless its request says otherwise (seed 000: 3)
    retry_backoff: float = 5.0  # retry policy: delay after a run's first retryable failure or reaped lease
    retry_multiplier: float = 2.0  # retry policy: growth of the delay per further failure (1-10)
    retry_max_backoff: float = 300.0  # retry policy: longest delay between attempts
    retry_jitter: float = 0.2  # retry policy: fraction of a delay taken off at random (0-1)
    approval_ttl: float = 900.0  # life of an approval token (15 min); then E-APPROVAL-002
    approval_sweep_interval: float = 30.0  # how often expired approvals are failed
    wait_sweep_interval: float = 1.0  # how often durable waits past their timeout (and sleeps) are ended
    # what a durable wait's callback URL starts with (ingest's public HTTP address, e.g.
    # https://hooks.example.com); empty: the URL is the path only, /v1/waits/<token>
    wait_callback_base_url: str = ""
    max_claim_wait: float = 60.0  # longest a ClaimRuns long-poll may wait for work
    # a worker build counts as live while a claim of it was seen this recently (or it holds a lease);
    # queued runs pinned to a build that is not live wait for it, counted and alerted on
    build_live_seconds: float = 120.0
    # worker labels (docs/flow-control.md): a worker counts as live while a claim of it was seen this
    # recently; a run that requires labels no live worker has is parked (wait_reason labels) until one has
    worker_live_seconds: float = 60.0
    # a run that prefers labels waits this long (since it became ready) for a worker that has them, when
    # one is live; then any eligible worker takes it
    prefer_wait_seconds: float = 10.0
    label_sweep_interval: float = 2.0  # how often runs that require labels are parked or woken (0: off)
    queue_metrics_interval: float = 15.0  # how often runs by project and status are counted for /metrics (0: off)
    metrics_max_projects: int = 100  # projects with their own metrics label; later ones share project="_other"
    schedule_interval: float = 1.0  # how often each scheduler fires the cron schedules that are due
    # progress events (ctx.emit) one run may emit, and their data's total size as compact JSON; past
    # either an emit answers RESOURCE_EXHAUSTED / RUN_EVENTS_EXHAUSTED (state changes and steps are
    # always recorded)
    max_run_events: int = 10_000
    max_run_event_bytes_total: int = 16 * 1024 * 1024  # the data of a run's progress events together
    max_run_event_bytes: int = 64 * 1024  # largest data of one progress event, as compact JSON
    max_watchers: int = 1000  # WatchRun streams one scheduler serves at once; past it RESOURCE_EXHAUSTED
    # longest a watcher goes without re-reading its run when no wake-up came (a lost NOTIFY is late by
    # at most this much)
    watch_poll_interval: float = 5.0
    # token streams (PublishTokens, ctx.stream_token): the SDK writes a durable checkpoint of a
    # stream's tokens every this many tokens, milliseconds or bytes of token text, whichever first
    stream_checkpoint_tokens: int = 500
    stream_checkpoint_ms: int = 2000  # the same checkpoint's longest wait after its first token (ms)
    # the same checkpoint's largest size: token text plus 4 bytes a token (its JSON), capped at half of
    # AWOOOP_MAX_RUN_EVENT_BYTES (a checkpoint is one event)
    stream_checkpoint_bytes: int = 32 * 1024
    # live token entries (batches) a run's stream keeps in Redis; older ones are trimmed (a late watcher
    # is told of the gap)
    stream_live_entries: int = 1000
    stream_live_ttl: float = 3600.0  # a run's live token stream expires this long after its last batch
    # how long the scheduler trusts a lease it checked for PublishTokens (a reaped attempt may publish
    # live tokens for at most this long; never a checkpoint)
    stream_lease_check: float = 0.5
    # child runs (StartChildRuns): how deep a run tree may grow, a root run being depth 0 (at most 32)
    max_child_depth: int = 8
    # child runs one run may start over its life, its fan-out (at most 10000)
    max_children_per_run: int = 1000

    # --- saga ---
    saga_addr: str = ""  # scheduler -> saga nudges; empty: the saga's recovery loop picks requests up
    gateway_addr: str = "127.0.0.1:50054"  # tool gateway the saga calls to run compensations
    max_step_result_bytes: int = 64 * 1024  # largest journaled step result, as compact JSON
    compensation_interval: float = 5.0  # how often the saga looks for recorded compensation requests
    compensation_lease: float = 60.0  # how long one saga replica owns a compensation request it picked up
    tool_timeout: float = 30.0  # deadline of one compensation tool call
    telegram_api_base: str = "https://api.telegram.org"  # Telegram Bot API base URL for escalations
    telegram_bot_token: str = ""  # empty: no Telegram escalation (audit log and Redis stream still get it)
    telegram_chat_id: str = ""  # chat that receives compensation_failed escalations
    alert_stream: str = "alerts"  # Redis stream (under redis_prefix) that receives escalations

    # --- console ---
    console_port: int = 8081  # HTTP port of the operator console (`awooop serve console`, part of `awooop up`)
    console_scheduler_addr: str = "127.0.0.1:50052"  # scheduler the console calls with the operator's key
    console_saga_addr: str = "127.0.0.1:50053"  # saga service the console calls with the operator's key
    console_session_ttl: float = 8 * 3600.0  # a console sign-in lasts this long (then sign in again)
    # serve the session cookie with Secure even without TLS here (TLS ends at a proxy in front)
    console_secure_cookie: bool = False
    # link from a run page to its trace, with {run_id} replaced; empty: no trace links
    console_trace_url: str = ""
    # failed sign-ins from one client address, or with one key id, within AWOOOP_CONSOLE_SIGNIN_WINDOW
    # before the console answers 429 without checking the key (per console process); 0: no limit
    console_signin_max_failures: int = 10
    console_signin_window: float = 300.0  # seconds a failed console sign-in counts against its address and key id

    extra: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from AWOOOP_* variables (os.environ unless environ is given); raises
        SettingsError naming the variable when one does not parse."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            default = f.default
            values[f.name] = _env(f.name.upper(), default, type(default), environ)
        values.update(overrides)
        for key, file_setting in KEY_FILES.items():
            if not values[key] and values[file_setting]:
                values[key] = read_key_file(f"AWOOOP_{file_setting.upper()}", values[file_setting])
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @property
    def direct_url(self) -> str:
        """The DSN for session work: LISTEN, migrations, `awooop admin`."""
        return self.database_direct_url or self.database_url

    def port_of(self, service: str) -> int:
        return int(getattr(self, f"{service}_port"))

    def scheduler_address(self) -> str:
        """Where this deployment's scheduler is: AWOOOP_SCHEDULER_ADDR, else its port on this host
        (the rule the CLI and SDK apply to the same variables, awooop.worker.client.resolve_address)."""
        return self.scheduler_addr or local_address(self.host, self.scheduler_port)


# a secret setting -> the setting naming a file it is read from when it is empty (a mounted secret)
KEY_FILES = {"internal_api_key": "internal_api_key_file"}
# settings whose value is a secret: `awooop config` says whether they are set, never what they are
SECRET_SETTINGS = frozenset({"internal_api_key", "telegram_bot_token"})
MASK = "****"
# a libpq keyword DSN's password (`host=db password=x`), or a URL's query parameter (`?password=x`)
_PASSWORD_PARAM = re.compile(r"(password=)[^\s&]*", re.I)


@dataclass(frozen=True)
class Effective:
    """A setting as this environment configures it, for `awooop config`."""

    name: str  # AWOOOP_<NAME>
    value: Any  # the parsed value; secrets and the passwords in URLs masked
    source: str  # "environment", "file AWOOOP_<NAME>_FILE" or "default"

    def text(self) -> str:
        """The value as a shell would set it (a masked secret as the mask alone)."""
        if self.value == MASK:
            return MASK
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        value = self.value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return shlex.quote(str(value))


def masked(setting: str, value: Any) -> Any:
    """The value with its secret parts hidden: a secret setting's whole value (when set), a URL's
    or DSN's password."""
    if not isinstance(value, str) or not value:
        return value
    if setting in SECRET_SETTINGS:
        return MASK
    try:
        url = urlsplit(value)
        password = url.password
    except ValueError:  # not a URL (a port that does not parse, ...): only keyword passwords
        password = None
    if password is not None:
        user = f"{url.username or ''}:{MASK}@"
        value = urlunsplit(url._replace(netloc=user + url.netloc.rpartition("@")[2]))
    return _PASSWORD_PARAM.sub(rf"\g<1>{MASK}", value)


def effective(environ: Mapping[str, str] | None = None) -> list[Effective]:
    """Every setting's value in this environment (os.environ unless environ is given) and where
    it came from, secrets masked; raises SettingsError as Settings.from_env does."""
    env = os.environ if environ is None else environ
    settings = Settings.from_env(env)
    from_file = {key: f"file AWOOOP_{name.upper()}" for key, name in KEY_FILES.items()}
    out = []
    for f in fields(Settings):
        if f.name == "extra":
            continue
        name = f"AWOOOP_{f.name.upper()}"
        value = getattr(settings, f.name)
        if env.get(name, "") != "":  # an empty variable is unset, as from_env reads it
            source = "environment"
        elif f.name in from_file and value:
            source = from_file[f.name]
        else:
            source = "default"
        out.append(Effective(name, masked(f.name, value), source))
    return out


# the /metrics port of a process serving one service when AWOOOP_METRICS_PORT is unset
# (docker-compose.yml publishes the services' metrics on the same host ports)
SERVICE_METRICS_PORTS = {"ingest": 9464, "scheduler": 9465, "saga": 9466, "gateway": 9467}


def metrics_port_for(settings: Settings, services: list[str], environ: Mapping[str, str] | None = None) -> int:
    """The /metrics port of a process serving these services: AWOOOP_METRICS_PORT when set, else
    the one service's own port, else the default."""
    if (os.environ if environ is None else environ).get("AWOOOP_METRICS_PORT", "") != "" or len(services) != 1:
        return settings.metrics_port
    return SERVICE_METRICS_PORTS.get(services[0], settings.metrics_port)


# AWOOOP_* variables that are not server settings: read by the CLI, the worker SDK and the tests.
CLIENT_VARIABLES = frozenset(
    {"AWOOOP_API_KEY", "AWOOOP_DATA_DIR", "AWOOOP_ADDR", "AWOOOP_TEST_DATABASE_URL", "AWOOOP_TEST_REDIS_URL"}
)


def env_names() -> list[str]:
    return [f"AWOOOP_{f.name.upper()}" for f in fields(Settings) if f.name != "extra"]


def unknown_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """AWOOOP_* variables that name no setting: most likely typos, worth a warning."""
    known = set(env_names()) | CLIENT_VARIABLES
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("AWOOOP_") and k not in known)


# A run's fields besides input and output at their limits (ids, reasons and summaries as UTF-8),
# plus the framing of an answer that carries it: what the message limit must hold on top of them.
RUN_FIELDS_BYTES = 64 * 1024


def deliverability_problem(s: Settings) -> str | None:
    """Why a value accepted under these limits could not be returned in one message, or None.
    Checked at start-up (a configuration error): a run's input and output are each up to
    max_payload_bytes, a journal step's parameters and result each up to max_step_result_bytes."""
    for name, value in (
        ("AWOOOP_MAX_PAYLOAD_BYTES", s.max_payload_bytes),
        ("AWOOOP_MAX_STEP_RESULT_BYTES", s.max_step_result_bytes),
    ):
        need = 2 * value + RUN_FIELDS_BYTES
        if s.max_message_bytes < need:
            return (
                f"AWOOOP_MAX_MESSAGE_BYTES ({s.max_message_bytes}) is too small for {name} ({value}): a run or step "
                f"with two values of that size could not be delivered; set AWOOOP_MAX_MESSAGE_BYTES to at least "
                f"2 x {name} + {RUN_FIELDS_BYTES} (= {need}) or lower {name}"
            )
    return None


def problems(s: Settings) -> list[str]:
    """Combinations that run but defeat their purpose; serve() logs them as warnings."""
    out = []
    if s.heartbeat_interval >= s.lease_ttl:
        out.append("AWOOOP_HEARTBEAT_INTERVAL >= AWOOOP_LEASE_TTL: live workers will lose their leases")
    if bool(s.tls_cert_file) != bool(s.tls_key_file):
        out.append("only one of AWOOOP_TLS_CERT_FILE / AWOOOP_TLS_KEY_FILE is set: serving without TLS")
    if s.db_pool_min > s.db_pool_max:
        out.append("AWOOOP_DB_POOL_MIN > AWOOOP_DB_POOL_MAX")
    if not 1 <= s.max_child_depth <= MAX_CHILD_DEPTH:
        out.append(f"AWOOOP_MAX_CHILD_DEPTH outside 1..{MAX_CHILD_DEPTH}: clamped")
    if not 1 <= s.max_children_per_run <= MAX_CHILDREN_PER_RUN:
        out.append(f"AWOOOP_MAX_CHILDREN_PER_RUN outside 1..{MAX_CHILDREN_PER_RUN}: clamped")
    return out


# --- the configuration table, generated from the comments in the Settings class ---

_SECTION = re.compile(r"#\s*---\s*(.+?)\s*---")
_FIELD = re.compile(r"^\s+(\w+)\s*:")


def setting_docs() -> dict[str, tuple[str, str]]:
    """field name -> (section, meaning), read from the comments in Settings' source."""
    source = inspect.getsource(Settings)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    names = {f.name for f in fields(Settings)}
    docs: dict[str, tuple[str, str]] = {}
    section = ""
    above: list[str] = []
    for no, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("#"):
            m = _SECTION.match(stripped)
            if m:
                section, above = m.group(1), []
            else:
                above.append(comments.get(no, ""))
            continue
        m = _FIELD.match(line)
        if m and m.group(1) in names:
            text = " ".join([*above, comments.get(no, "")]).strip()
            docs[m.group(1)] = (section, text)
        above = []
    return docs


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == "":
        return "(empty)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown() -> str:
    """docs/configuration.md."""
    docs = setting_docs()
    out = [
        "# Configuration",
        "",
        "Every server setting is an environment variable (`AWOOOP_<NAME>`); this table lists all of them.",
        "It is generated from `services/common/settings.py` by `python -m services.common.settings >",
        "docs/configuration.md`, and a test fails when the two differ. Durations are seconds (decimals",
        "allowed), sizes are bytes, booleans accept `1/true/yes/on` and `0/false/no/off`; a value that does",
        "not parse stops the service with a message naming the variable. `awooop config` prints each",
        "setting's value in the environment it runs in and where it came from (environment, file or",
        "default), secrets masked.",
        "",
        "Client-side variables (not server settings): `AWOOOP_API_KEY` (the key the CLI and SDK send),",
        "`AWOOOP_INGEST_ADDR`, `AWOOOP_SCHEDULER_ADDR`, `AWOOOP_SAGA_ADDR`, `AWOOOP_GATEWAY_ADDR` (where the",
        "CLI and SDK find each service; default 127.0.0.1 and the default ports), `AWOOOP_TLS` and",
        "`AWOOOP_TLS_CA_FILE` (dial with TLS, trusting that CA), `AWOOOP_DATA_DIR` (where `awooop up`",
        "keeps its embedded Postgres and Redis; default `.awooop`). `AWOOOP_SAGA_ADDR` and",
        "`AWOOOP_SCHEDULER_ADDR` are also server settings below (the scheduler's and ingest's): in both",
        "roles each says where that service listens.",
    ]
    section = None
    for f in fields(Settings):
        if f.name == "extra":
            continue
        sec, text = docs.get(f.name, ("", ""))
        if sec != section:
            section = sec
            out += ["", f"## {sec or 'other'}", "", "| variable | default | meaning |", "|---|---|---|"]
        meaning = text.replace("|", "\\|")
        out.append(f"| `AWOOOP_{f.name.upper()}` | {_default_text(f.default)} | {meaning} |")
    out += ["", *OTEL_DOC]
    return "\n".join(out) + "\n"


# The standard OpenTelemetry variables the services read (services/common/tracing.py)
OTEL_DOC = [
    "## tracing (standard OpenTelemetry variables)",
    "",
    "Tracing is off unless one of these turns it on; docs/operations.md says what a trace holds.",
    "",
    "| variable | default | meaning |",
    "|---|---|---|",
    "| `OTEL_TRACES_EXPORTER` | (empty) | `otlp` or `console` turns tracing on; `none` keeps it off |",
    "| `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | (empty) | "
    "the collector's OTLP/gRPC address (e.g. `http://otel-collector:4317`); setting one turns tracing on |",
    "| `OTEL_EXPORTER_OTLP_INSECURE`, `_HEADERS`, `_CERTIFICATE`, `_TIMEOUT` | | the OTLP exporter's own settings |",
    "| `OTEL_SERVICE_NAME` | `awooop-<service>` (`awooop` for several in one process) | the resource's service.name |",
    "| `OTEL_RESOURCE_ATTRIBUTES` | (empty) | more resource attributes, `key=value,...` |",
    "| `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` | `parentbased_always_on` | "
    "the SDK's sampler; in production `parentbased_traceidratio` with `0.1` (docs/operations.md, Tracing) |",
    "| `OTEL_SDK_DISABLED` | `false` | `true` turns tracing off whatever else is set |",
]


if __name__ == "__main__":
    print(markdown(), end="")
