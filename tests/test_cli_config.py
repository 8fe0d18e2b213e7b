"""`awooop config` prints the settings as the environment it runs in configures them, each with
where it came from (environment, a key file, default), secrets and URL passwords masked; a
value that does not parse is one line naming it. Real subprocesses of the installed command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _config(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    return subprocess.run(
        [sys.executable, "-m", "awooop.cli", "config", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _lines(out: str) -> dict[str, str]:
    """AWOOOP_X -> 'value  # source' of each printed line."""
    return dict(line.split("=", 1) for line in out.splitlines())


def test_config_prints_the_effective_values_and_their_sources_with_secrets_masked(tmp_path: Path) -> None:
    key_file = tmp_path / "internal-key"
    key_file.write_text("awk_internal_secret_value\n")
    out = _config(
        AWOOOP_INGEST_PORT="1234",
        AWOOOP_DATABASE_URL="postgresql://awooop:s3cret-pw@db.internal:5432/awooop",
        AWOOOP_DATABASE_DIRECT_URL="host=db.internal user=awooop password=direct-pw",
        AWOOOP_REDIS_URL="redis://:redis-pw@cache:6379/0",
        AWOOOP_TELEGRAM_BOT_TOKEN="123456:bot-token",
        AWOOOP_INTERNAL_API_KEY_FILE=str(key_file),
        AWOOOP_ACCESS_LOG="off",
    )
    assert out.returncode == 0, out.stderr
    for secret in ("s3cret-pw", "direct-pw", "redis-pw", "bot-token", "awk_internal_secret_value"):
        assert secret not in out.stdout
    got = _lines(out.stdout)
    assert got["AWOOOP_INGEST_PORT"] == "1234  # environment"
    assert got["AWOOOP_SCHEDULER_PORT"] == "50052  # default"
    assert got["AWOOOP_ACCESS_LOG"] == "false  # environment"
    assert got["AWOOOP_DATABASE_URL"] == "'postgresql://awooop:****@db.internal:5432/awooop'  # environment"
    assert got["AWOOOP_DATABASE_DIRECT_URL"] == "'host=db.internal user=awooop password=****'  # environment"
    assert got["AWOOOP_REDIS_URL"] == "'redis://:****@cache:6379/0'  # environment"
    assert got["AWOOOP_TELEGRAM_BOT_TOKEN"] == "****  # environment"
    assert got["AWOOOP_INTERNAL_API_KEY"] == "****  # file AWOOOP_INTERNAL_API_KEY_FILE"
    assert got["AWOOOP_INTERNAL_API_KEY_FILE"] == f"{key_file}  # environment"
    # what a command changes on top of a default is said beside it
    assert got["AWOOOP_REAPER_INTERVAL"] == "60  # default; `awooop up` uses 2"
    assert got["AWOOOP_METRICS_PORT"].startswith("9464  # default; a process serving one service uses its own")

    data = json.loads(_config("--json", AWOOOP_INGEST_PORT="1234", AWOOOP_REDIS_URL="redis://:pw@r:6379").stdout)
    assert set(data) == {"settings"}
    by_name = {s["name"]: s for s in data["settings"]}
    assert by_name["AWOOOP_INGEST_PORT"] == {"name": "AWOOOP_INGEST_PORT", "value": 1234, "source": "environment"}
    assert by_name["AWOOOP_REDIS_URL"]["value"] == "redis://:****@r:6379"
    assert by_name["AWOOOP_REAPER_INTERVAL"] == {
        "name": "AWOOOP_REAPER_INTERVAL",
        "value": 60.0,
        "source": "default",
        "note": "`awooop up` uses 2",
    }


def test_config_with_a_value_that_does_not_parse_is_one_line_naming_it() -> None:
    out = _config(AWOOOP_INGEST_PORT="fifty")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "configuration error: AWOOOP_INGEST_PORT='fifty' is not a valid int\n"
