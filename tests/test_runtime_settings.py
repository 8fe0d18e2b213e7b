"""Settings from AWOOOP_* variables: types, strict parsing, typo warnings, and the
configuration doc that is generated from the Settings class."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from services.common.settings import Settings, SettingsError, markdown, problems, setting_docs, unknown_env

ROOT = Path(__file__).resolve().parent.parent


def test_variables_are_parsed_to_the_field_types() -> None:
    s = Settings.from_env(
        {
            "AWOOOP_LEASE_TTL": "1.5",
            "AWOOOP_DB_POOL_MAX": " 25 ",
            "AWOOOP_ACCESS_LOG": "off",
            "AWOOOP_MIGRATE_ON_START": "TRUE",
            "AWOOOP_UVLOOP": "1",
            "AWOOOP_HOST": "0.0.0.0",
            "AWOOOP_REDIS_URL": "",  # empty means: the default
        }
    )
    assert s.lease_ttl == 1.5 and isinstance(s.lease_ttl, float)
    assert s.db_pool_max == 25
    assert s.access_log is False and s.migrate_on_start is True and s.uvloop is True
    assert s.host == "0.0.0.0" and s.redis_url == ""
    assert s.heartbeat_interval == 30.0 and s.max_attempts == 3  # untouched defaults (seed 000)


def test_overrides_win_over_the_environment() -> None:
    s = Settings.from_env({"AWOOOP_LEASE_TTL": "9"}, lease_ttl=2.0)
    assert s.lease_ttl == 2.0


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("AWOOOP_LEASE_TTL", "5m", "AWOOOP_LEASE_TTL='5m' is not a valid float"),
        ("AWOOOP_DB_POOL_MAX", "ten", "AWOOOP_DB_POOL_MAX='ten' is not a valid int"),
        ("AWOOOP_ACCESS_LOG", "maybe", "AWOOOP_ACCESS_LOG='maybe' is not a boolean"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({name: value})


def test_unknown_variables_are_reported_as_likely_typos() -> None:
    env = {"AWOOOP_LEASE_TLL": "1", "AWOOOP_LEASE_TTL": "1", "AWOOOP_API_KEY": "k", "PATH": "/bin"}
    assert unknown_env(env) == ["AWOOOP_LEASE_TLL"]


def test_self_defeating_combinations_are_flagged() -> None:
    assert problems(Settings()) == []
    found = problems(Settings(lease_ttl=10, heartbeat_interval=30, tls_cert_file="c.pem"))
    assert any("HEARTBEAT_INTERVAL" in p for p in found) and any("TLS" in p for p in found)


def test_every_setting_has_a_meaning() -> None:
    docs = setting_docs()
    missing = [f.name for f in fields(Settings) if f.name != "extra" and not docs.get(f.name, ("", ""))[1]]
    assert not missing, f"give these Settings fields a comment (it becomes docs/configuration.md): {missing}"


def test_configuration_doc_is_current() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    fix = "python -m services.common.settings > docs/configuration.md"
    assert doc == markdown(), f"docs/configuration.md is stale; regenerate it: {fix}"
    for f in fields(Settings):
        if f.name != "extra":
            assert f"`AWOOOP_{f.name.upper()}`" in doc
