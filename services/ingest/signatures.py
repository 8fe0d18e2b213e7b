"""Provider verification of webhook deliveries: does the raw body (or the credentials) prove
that the delivery came from the holder of the endpoint's secret?

| channel      | proof                                                                          |
|--------------|--------------------------------------------------------------------------------|
| telegram     | X-Telegram-Bot-Api-Secret-Token equals the secret (setWebhook's secret_token)  |
| line         | X-Line-Signature = base64(HMAC-SHA256(channel secret, raw body))               |
| gitea        | X-Gitea-Signature = hex(HMAC-SHA256(secret, raw body)), or                     |
|              | X-Hub-Signature-256 = "sha256=" + the same hex                                 |
| alertmanager | Authorization: Bearer <secret>, or Basic auth whose password is the secret     |

Every comparison is hmac.compare_digest on bytes, so timing does not reveal how much of a
guess was right. A header is compared as the bytes that were sent (aiohttp hands invalid UTF-8
over as lone surrogates; surrogateescape turns them back), so bytes that are not UTF-8 are
simply a wrong proof. Pure functions over (headers, body, secret): unit-testable without a server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Mapping

TELEGRAM_HEADER = "X-Telegram-Bot-Api-Secret-Token"
LINE_HEADER = "X-Line-Signature"
GITEA_HEADER = "X-Gitea-Signature"
HUB_HEADER = "X-Hub-Signature-256"
AUTHORIZATION = "Authorization"

Verifier = Callable[[Mapping[str, str], bytes, str], bool]


def _get(headers: Mapping[str, str], name: str) -> str:
    # aiohttp's CIMultiDictProxy is case-insensitive already; plain dicts (tests) may not be
    value = headers.get(name)
    if value is None:
        lname = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lname), "")
    return value


def _raw(headers: Mapping[str, str], name: str) -> bytes:
    """The header's value as sent on the wire; b"" when absent or not representable as bytes."""
    try:
        return _get(headers, name).encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return b""


def _hmac(secret: str, body: bytes) -> bytes:
    return hmac.new(secret.encode(), body, hashlib.sha256).digest()


def telegram(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    given = _raw(headers, TELEGRAM_HEADER)
    return bool(given) and hmac.compare_digest(given, secret.encode())


def line(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    given = _raw(headers, LINE_HEADER)
    return bool(given) and hmac.compare_digest(given, base64.b64encode(_hmac(secret, body)))


def gitea(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    given = _raw(headers, GITEA_HEADER)
    if not given:
        hub = _raw(headers, HUB_HEADER)
        given = hub[7:] if hub.lower().startswith(b"sha256=") else b""
    if not given:
        return False
    try:
        raw = bytes.fromhex(given.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        return False
    return hmac.compare_digest(raw, _hmac(secret, body))


def alertmanager(headers: Mapping[str, str], body: bytes, secret: str) -> bool:
    scheme, _, credentials = _raw(headers, AUTHORIZATION).partition(b" ")
    scheme = scheme.lower()
    credentials = credentials.strip()
    if scheme == b"bearer" and credentials:
        return hmac.compare_digest(credentials, secret.encode())
    if scheme == b"basic" and credentials:
        try:
            decoded = base64.b64decode(credentials, validate=True)
        except (binascii.Error, ValueError):
            return False
        _, sep, password = decoded.partition(b":")
        return bool(sep) and hmac.compare_digest(password, secret.encode())
    return False


VERIFIERS: dict[str, Verifier] = {"telegram": telegram, "line": line, "gitea": gitea, "alertmanager": alertmanager}


def verify(channel: str, headers: Mapping[str, str], body: bytes, candidates: tuple[str, ...]) -> bool:
    """True when the delivery proves any of the candidate secrets (current, then previous).
    Every candidate is checked, so the answer's timing does not tell which one matched."""
    fn = VERIFIERS[channel]
    ok = False
    for secret in candidates:
        ok = fn(headers, body, secret) | ok
    return ok
