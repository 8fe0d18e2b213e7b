"""The error reasons are declared once, in the ErrorReason enum of
protos/awooop/common/v1/errors.proto: the services' constants, the SDK's and the README's
error table all name exactly those values."""

from __future__ import annotations

import re

from awooop.common.v1 import errors_pb2
from awooop.worker import errors as sdk_errors
from services.common import errors
from tests.harness.helpers import ROOT

REASONS = {n.removeprefix("ERROR_REASON_") for n in errors_pb2.ErrorReason.keys()} - {"UNSPECIFIED"}


def _constants(module: object) -> dict[str, str]:
    return {k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[A-Z_]+", v)}


def test_the_services_reason_constants_are_the_enum_values() -> None:
    consts = _constants(errors)
    consts.pop("DOMAIN", None)
    assert set(consts.values()) == REASONS
    assert all(name == value for name, value in consts.items())


def test_the_sdk_names_its_reasons_from_the_enum_too() -> None:
    consts = _constants(sdk_errors)
    assert consts and set(consts.values()) <= REASONS
    assert all(getattr(errors, name) == value for name, value in consts.items())


def test_the_readme_error_table_lists_every_reason() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| case | status | reason |") :]
    listed = set(re.findall(r"\| `([A-Z_]+)`", table.split("\n\n")[0]))
    assert listed == REASONS
