"""docker-compose.yml and the Dockerfile, checked without a Docker engine (none on this
machine): every command is a real `awooop` command line, every AWOOOP_* variable a real
setting whose value parses, healthchecks use `awooop health` on the port the service
listens on, the internal service key is provisioned (the one-shot step's command, run for
real, writes a key the saga reads and the gateway accepts), and the files the image is built
from make a complete package. When a compose client is installed, `config -q` validates the
file too."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from awooop.cli.main import build_parser
from services.cli.server import SERVICE_CHOICES
from services.common.settings import Settings, SettingsError, env_names
from tests.harness.infra import require_program

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SERVED = ("ingest", "scheduler", "saga", "gateway")  # the gRPC services
CONSOLE = "console"  # HTTP
ONE_SHOT = ("migrate", "internal-key")
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")
KEY_FILE_VAR = "AWOOOP_INTERNAL_API_KEY_FILE"


def interpolate(value: Any) -> str:
    """A compose value as compose would pass it with no host variables set."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def service_env(svc: dict[str, Any], key_file: Path | None = None) -> dict[str, str]:
    """A service's environment as its container gets it (no host variables set); the internal key
    file, which only the internal-key step writes, is read from key_file here."""
    env = {k: interpolate(v) for k, v in svc.get("environment", {}).items()}
    if KEY_FILE_VAR in env and key_file is not None:
        env[KEY_FILE_VAR] = str(key_file)
    return env


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "internal-api-key"
    path.write_text("awk_0123456789abcdef_not-a-real-secret\n")
    return path


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def parses(argv: list[str]) -> Any:
    """argv as the awooop CLI parses it (argparse exits on an unknown command or choice)."""
    assert argv[0] == "awooop", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"not a valid awooop command line: {argv}") from exc


def test_the_stack_is_complete(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "redis", *ONE_SHOT, *SERVED, CONSOLE}
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"
    images = {services[name]["image"] for name in (*ONE_SHOT, *SERVED, CONSOLE)}
    assert images == {"awooop:local"}  # one image, built from the Dockerfile
    assert all(services[name]["build"] == "." for name in (*ONE_SHOT, *SERVED, CONSOLE))


def test_every_command_is_a_real_awooop_command(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert parses(services["migrate"]["command"]).func.__name__ == "cmd_migrate"
    for name in (*SERVED, CONSOLE):
        args = parses(services[name]["command"])
        assert args.func.__name__ == "cmd_serve" and args.services == [name]
        assert name in SERVICE_CHOICES


def test_every_variable_is_a_setting_and_parses(compose: dict[str, Any], key_file: Path) -> None:
    known = set(env_names())
    for name in (*ONE_SHOT, *SERVED, CONSOLE):
        env = service_env(compose["services"][name], key_file)
        unknown = [k for k in env if k.startswith("AWOOOP_") and k not in known]
        assert not unknown, f"{name}: not settings: {unknown}"
        s = Settings.from_env(env)  # raises SettingsError naming a value that does not parse
        assert urlsplit(s.database_url).hostname == "postgres"
        assert urlsplit(s.redis_url).hostname == "redis"
        if name in (*SERVED, CONSOLE):
            assert s.host == "0.0.0.0", f"{name} must listen beyond the container's loopback"


def test_healthchecks_and_ports_match_the_settings(compose: dict[str, Any], key_file: Path) -> None:
    published: list[str] = []
    for name in SERVED:
        svc = compose["services"][name]
        s = Settings.from_env(service_env(svc, key_file))
        port = s.port_of(name)
        assert port == Settings().port_of(name)  # the documented default
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD"
        args = parses(test[1:])
        assert args.func.__name__ == "cmd_health"
        assert args.address == f"127.0.0.1:{port}" and args.service == name
        targets = {int(p.split(":")[1]): p.split(":")[0] for p in svc["ports"]}
        assert port in targets and s.metrics_port in targets, svc["ports"]
        published += targets.values()
        deps = svc["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully"
        assert deps["internal-key"]["condition"] == "service_completed_successfully"
        assert deps["redis"]["condition"] == "service_healthy"
    published += [p.split(":")[0] for p in compose["services"][CONSOLE]["ports"]]
    assert len(published) == len(set(published)), "two services publish the same host port"
    assert compose["services"]["saga"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert compose["services"]["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_console_serves_on_its_settings_port_and_calls_the_services_by_their_compose_names(
    compose: dict[str, Any], key_file: Path
) -> None:
    from services.console.app import make_app, templates
    from services.console.views import Console

    services = compose["services"]
    svc = services[CONSOLE]
    s = Settings.from_env(service_env(svc))
    assert s.console_port == Settings().console_port  # the documented default
    targets = {int(p.split(":")[1]): p.split(":")[0] for p in svc["ports"]}
    assert set(targets) == {s.console_port, s.metrics_port}, svc["ports"]
    scheduler_port = Settings.from_env(service_env(services["scheduler"], key_file)).scheduler_port
    saga_port = Settings.from_env(service_env(services["saga"], key_file)).saga_port
    assert (s.console_scheduler_addr, s.console_saga_addr) == (f"scheduler:{scheduler_port}", f"saga:{saga_port}")
    for name in ("migrate", "internal-key"):
        assert svc["depends_on"][name]["condition"] == "service_completed_successfully"
    for name in ("scheduler", "saga"):
        assert svc["depends_on"][name]["condition"] == "service_healthy"
    # the healthcheck asks the console's own health route (no session) on its port
    test = svc["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    (url,) = re.findall(r"'(http://[^']+)'", test[3])
    app = make_app(Console(templates(), None, None, trace_url="", secure=False))  # type: ignore[arg-type]
    routes = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource is not None}
    assert urlsplit(url).netloc == f"127.0.0.1:{s.console_port}" and urlsplit(url).path in routes


def test_callback_urls_start_with_ingests_published_http_port(compose: dict[str, Any], key_file: Path) -> None:
    """A durable wait's callback URL (handed out by the scheduler) reaches ingest's HTTP endpoint
    as compose publishes it on the host."""
    services = compose["services"]
    base = urlsplit(Settings.from_env(service_env(services["scheduler"], key_file)).wait_callback_base_url)
    http_port = Settings.from_env(service_env(services["ingest"])).http_port
    published = {int(p.split(":")[1]): int(p.split(":")[0]) for p in services["ingest"]["ports"]}
    assert base.scheme == "http" and base.port == published[http_port]


def test_saga_reaches_the_gateway_by_its_compose_name(compose: dict[str, Any]) -> None:
    env = compose["services"]["saga"]["environment"]
    gateway_port = Settings.from_env(
        {k: interpolate(v) for k, v in compose["services"]["gateway"]["environment"].items()}
    ).gateway_port
    assert env["AWOOOP_GATEWAY_ADDR"] == f"gateway:{gateway_port}"


def test_the_scheduler_nudges_the_saga_by_its_compose_name(compose: dict[str, Any], key_file: Path) -> None:
    env = service_env(compose["services"]["scheduler"])
    saga_port = Settings.from_env(service_env(compose["services"]["saga"], key_file)).saga_port
    assert env["AWOOOP_SAGA_ADDR"] == f"saga:{saga_port}"  # compensation starts at once, not on the saga's timer


def test_the_internal_key_is_provisioned_for_the_saga_and_the_scheduler(compose: dict[str, Any]) -> None:
    """docker compose up -d compensates out of the box: a one-shot step writes the internal service
    key into a volume before any service starts, and the saga (which presents it to the gateway)
    and the scheduler (to the saga) read it from there."""
    services = compose["services"]
    step = services["internal-key"]
    args = parses(step["command"])
    assert args.admin_command == "ensure-service-key"
    key_path = PurePosixPath(args.file)
    assert step["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert step["restart"] == "no"

    def mounted(svc: dict[str, Any]) -> dict[str, str]:
        """container directory -> volume name (with its :ro / :rw suffix)."""
        out = {}
        for m in svc.get("volumes", []):
            volume, target, *mode = m.split(":")
            out[target] = ":".join([volume, *mode])
        return out

    (volume,) = [v for t, v in mounted(step).items() if t == str(key_path.parent)]
    assert volume in compose["volumes"], "the key's volume is not declared"
    for name in ("saga", "scheduler"):
        svc = services[name]
        env = service_env(svc)
        assert env[KEY_FILE_VAR] == str(key_path), f"{name} reads another file"
        assert env.get("AWOOOP_INTERNAL_API_KEY", "") == "", f"{name}: a fixed key would win over the file"
        assert mounted(svc).get(str(key_path.parent)) == f"{volume}:ro", f"{name} does not mount the key's volume"
        assert svc["depends_on"]["internal-key"]["condition"] == "service_completed_successfully"
    # the image has the directory, writable by its non-root user (a fresh volume takes its owner)
    steps = dockerfile()
    run = next(rest for word, rest in steps if word == "RUN")
    user = [rest for word, rest in steps if word == "USER"][-1]
    assert f"install -d -o {user} -m 0700 {key_path.parent}" in run


async def test_the_internal_key_step_writes_a_key_the_gateway_accepts_from_the_saga(
    compose: dict[str, Any], db_dsn: str, db: Any, start_services: Any, tmp_path: Path
) -> None:
    """The internal-key step's command line, run for real against a store (twice: it keeps a valid
    key, and replaces a revoked one); the saga's settings from its compose environment read the
    file, and a saga with them is SERVING: the real gateway accepted the key."""
    from prometheus_client import REGISTRY

    from tests.harness.helpers import eventually

    key_path = tmp_path / "internal-api-key"
    argv = [*compose["services"]["internal-key"]["command"]]
    argv[argv.index("--file") + 1] = str(key_path)

    def run() -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_DATABASE_URL": db_dsn}
        return subprocess.run(
            [sys.executable, "-m", "awooop.cli", *argv[1:]], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    first = await asyncio.to_thread(run)
    assert first.returncode == 0 and "issued key" in first.stderr, first.stderr
    key = key_path.read_text().strip()
    assert oct(key_path.stat().st_mode & 0o777) == "0o600"
    again = await asyncio.to_thread(run)
    assert again.returncode == 0 and "kept" in again.stderr and key_path.read_text().strip() == key, again.stderr
    roles = await db.fetch("SELECT project_id, role FROM awooop_project_member WHERE principal_id = 'awooop-internal'")
    assert [(r["project_id"], r["role"]) for r in roles] == [("*", "admin")]

    saga_env = service_env(compose["services"]["saga"], key_path)
    assert Settings.from_env(saga_env).internal_api_key == key
    gw = await start_services("gateway")
    accepted = REGISTRY.get_sample_value("awooop_saga_gateway_auth_probes_total", {"outcome": "accepted"}) or 0
    await start_services(
        "saga", internal_api_key=Settings.from_env(saga_env).internal_api_key,
        gateway_addr=f"127.0.0.1:{gw.ports['gateway']}",
    )  # fmt: skip

    async def gateway_accepted() -> bool:
        now = REGISTRY.get_sample_value("awooop_saga_gateway_auth_probes_total", {"outcome": "accepted"}) or 0
        return now > accepted

    await eventually(gateway_accepted, what="the gateway to accept the provisioned key")

    # revoked (an operator rotated it): the next run of the step replaces it
    await db.execute("UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1", key.split("_")[1])
    replaced = await asyncio.to_thread(run)
    assert replaced.returncode == 0 and "issued key" in replaced.stderr, replaced.stderr
    assert key_path.read_text().strip() != key


def test_a_missing_key_file_stops_the_process_with_its_setting_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=f"{KEY_FILE_VAR}=.*cannot be read"):
        Settings.from_env({KEY_FILE_VAR: str(tmp_path / "absent")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match=f"{KEY_FILE_VAR}=.* is empty"):
        Settings.from_env({KEY_FILE_VAR: str(tmp_path / "empty")})
    # a key given directly wins; the file is not read
    given = {KEY_FILE_VAR: str(tmp_path / "absent"), "AWOOOP_INTERNAL_API_KEY": "k"}
    assert Settings.from_env(given).internal_api_key == "k"


def compose_client() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        if subprocess.run([*argv, "version"], capture_output=True, timeout=30).returncode == 0:
            return argv
    return None


def test_compose_config_validates() -> None:
    client = compose_client()
    if client is None:  # CI installs Debian's docker-compose (.ci/install-debian): there it must run
        require_program("docker-compose")
        pytest.skip("no compose client (`docker compose` plugin or docker-compose) on this machine")
    out = subprocess.run(
        [*client, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_awooop_as_a_non_root_user() -> None:
    import json

    steps = dockerfile()
    # the base image is a build argument (a registry mirror) whose default is the official image
    base_args = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    first_from = next(rest for word, rest in steps if word == "FROM")
    assert first_from == "${BASE_IMAGE}" and base_args["BASE_IMAGE"] == "python:3.11-slim"
    assert {"PIP_INDEX_URL", "PIP_TRUSTED_HOST"} <= set(base_args)
    run = next(rest for word, rest in steps if word == "RUN")
    assert "--mount=type=secret,id=ca,required=false" in run  # the index's CA, never in a layer
    # exactly what uv.lock says: the pinned uv exports it, pip installs it hash-checked, nothing resolved
    assert "-r scripts/uv-requirements.txt" in run and "uv export --frozen" in run
    assert run.count("--require-hashes") == 2 and "pip install --no-deps ./packages/worker ." in run
    user = [rest for word, rest in steps if word == "USER"]
    assert user and user[-1] not in ("root", "0")
    exposed = {int(p) for word, rest in steps if word == "EXPOSE" for p in rest.split()}
    defaults = Settings()
    assert exposed == {
        *(defaults.port_of(s) for s in SERVED),
        defaults.metrics_port,
        defaults.http_port,
        defaults.console_port,
    }
    cmd = json.loads(next(rest for word, rest in steps if word == "CMD"))
    assert parses(cmd).func.__name__ == "cmd_serve"
    health = next(rest for word, rest in steps if word == "HEALTHCHECK")
    probe = json.loads(health.split(" CMD ", 1)[1])
    assert parses(probe).func.__name__ == "cmd_health"
    assert ("ENV", "AWOOOP_HOST=0.0.0.0") in steps


def test_the_files_the_image_copies_build_a_complete_package(tmp_path: Path) -> None:
    """Builds the wheel from exactly what the Dockerfile copies (offline, no build isolation)."""
    copied = [rest.split()[0] for word, rest in dockerfile() if word == "COPY"]
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    src = tmp_path / "src"
    src.mkdir()
    for path in copied:
        assert path not in ignored, f".dockerignore drops {path}, which the Dockerfile copies"
        origin = ROOT / path
        if origin.is_dir():
            shutil.copytree(origin, src / path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(origin, src / path)
    # the server package and the client package it requires (packages/worker), as the image installs them
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    for project in ("packages/worker", "."):
        out = subprocess.run(
            [*pip_wheel, project],
            cwd=src,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr
    (server,) = tmp_path.glob("awooop-*.whl")
    (client,) = tmp_path.glob("awooop_worker-*.whl")
    names = set(zipfile.ZipFile(server).namelist()) | set(zipfile.ZipFile(client).namelist())
    for needed in (
        "awooop/cli/main.py",
        "awooop/cli/health.py",
        "awooop/ingest/v1/ingest_pb2.py",
        "services/common/migrations/0001_initial.sql",
        *(f"services/{s}/app.py" for s in SERVED),
    ):
        assert needed in names, f"{needed} missing from the image's package"
