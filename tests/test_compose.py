"""docker-compose.yml and the Dockerfile, checked without a Docker engine (none on this
machine): every command is a real `awooop` command line, every AWOOOP_* variable a real
setting whose value parses, healthchecks use `awooop health` on the port the service
listens on, and the files the image is built from make a complete package. When a compose
client is installed, `config -q` validates the file too."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from awooop.cli.main import build_parser
from awooop.cli.server import SERVICE_CHOICES
from services.common.settings import Settings, env_names

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SERVED = ("ingest", "scheduler", "saga", "gateway")
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any) -> str:
    """A compose value as compose would pass it with no host variables set."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


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
    assert set(services) == {"postgres", "redis", "migrate", *SERVED}
    assert services["postgres"]["image"] == "postgres:16"
    assert services["redis"]["image"] == "redis:7"
    images = {services[name]["image"] for name in ("migrate", *SERVED)}
    assert images == {"awooop:local"}  # one image, built from the Dockerfile
    assert all(services[name]["build"] == "." for name in ("migrate", *SERVED))


def test_every_command_is_a_real_awooop_command(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert parses(services["migrate"]["command"]).func.__name__ == "cmd_migrate"
    for name in SERVED:
        args = parses(services[name]["command"])
        assert args.func.__name__ == "cmd_serve" and args.services == [name]
        assert name in SERVICE_CHOICES


def test_every_variable_is_a_setting_and_parses(compose: dict[str, Any]) -> None:
    known = set(env_names())
    for name in ("migrate", *SERVED):
        env = {k: interpolate(v) for k, v in compose["services"][name]["environment"].items()}
        unknown = [k for k in env if k.startswith("AWOOOP_") and k not in known]
        assert not unknown, f"{name}: not settings: {unknown}"
        s = Settings.from_env(env)  # raises SettingsError naming a value that does not parse
        assert urlsplit(s.database_url).hostname == "postgres"
        assert urlsplit(s.redis_url).hostname == "redis"
        if name in SERVED:
            assert s.host == "0.0.0.0", f"{name} must listen beyond the container's loopback"


def test_healthchecks_and_ports_match_the_settings(compose: dict[str, Any]) -> None:
    published: list[str] = []
    for name in SERVED:
        svc = compose["services"][name]
        s = Settings.from_env({k: interpolate(v) for k, v in svc["environment"].items()})
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
        assert deps["redis"]["condition"] == "service_healthy"
    assert len(published) == len(set(published)), "two services publish the same host port"
    assert compose["services"]["saga"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert compose["services"]["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_saga_reaches_the_gateway_by_its_compose_name(compose: dict[str, Any]) -> None:
    env = compose["services"]["saga"]["environment"]
    gateway_port = Settings.from_env(
        {k: interpolate(v) for k, v in compose["services"]["gateway"]["environment"].items()}
    ).gateway_port
    assert env["AWOOOP_GATEWAY_ADDR"] == f"gateway:{gateway_port}"


def compose_client() -> list[str] | None:
    for argv in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(argv[0]) is None:
            continue
        if subprocess.run([*argv, "version"], capture_output=True, timeout=30).returncode == 0:
            return argv
    return None


def test_compose_config_validates() -> None:
    client = compose_client()
    if client is None:
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
    user = [rest for word, rest in steps if word == "USER"]
    assert user and user[-1] not in ("root", "0")
    exposed = {int(p) for word, rest in steps if word == "EXPOSE" for p in rest.split()}
    defaults = Settings()
    assert exposed == {*(defaults.port_of(s) for s in SERVED), defaults.metrics_port, defaults.http_port}
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
            shutil.copy(origin, src / path)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("awooop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "awooop/cli/main.py",
        "awooop/cli/health.py",
        "awooop/ingest/v1/ingest_pb2.py",
        "services/common/migrations/0001_initial.sql",
        *(f"services/{s}/app.py" for s in SERVED),
    ):
        assert needed in names, f"{needed} missing from the image's package"
