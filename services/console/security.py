"""What keeps a page that shows attacker-controlled payloads safe: response headers (a strict
Content-Security-Policy that allows no script at all), the session cookie's attributes, and
the CSRF checks every POST passes. Templates escape every value (Jinja2 autoescape, app.py)."""

from __future__ import annotations

import hmac
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

log = logging.getLogger("awooop.console")

SESSION_COOKIE = "awooop_console"
# sign-in form's double-submit token: there is no session yet to bind a CSRF token to
SIGNIN_COOKIE = "awooop_console_signin"

# No script from anywhere, no inline style, no framing, forms post only back here.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # approval links carry a token in the path: never send it to another site (same-origin, not
    # no-referrer: under no-referrer browsers post forms with `Origin: null`, which same_origin refuses)
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def secure_request(request: web.Request, force_secure: bool) -> bool:
    return force_secure or request.secure


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # redirects and errors get the headers too
        for k, v in HEADERS.items():
            exc.headers.setdefault(k, v)
        raise
    except Exception:  # a bug: answer 500 ourselves, so even this page has the headers
        log.exception("console: request failed", extra={"path": request.path})
        return web.Response(status=500, text="internal error (logged)", headers=HEADERS)
    for k, v in HEADERS.items():
        response.headers.setdefault(k, v)
    if request.secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    return response


def set_cookie(
    response: web.StreamResponse, name: str, value: str, *, secure: bool, max_age: int | None = None, path: str = "/"
) -> None:
    response.set_cookie(name, value, httponly=True, samesite="Strict", secure=secure, max_age=max_age, path=path)


def same_origin(request: web.Request) -> bool:
    """A POST must come from a page of this console: when the browser names the origin
    (Origin, else Referer), its host must be ours. (SameSite=Strict already keeps the cookie
    off cross-site requests; this also stops a forged sign-in.)"""
    source = request.headers.get("Origin") or request.headers.get("Referer")
    if not source or source == "null":
        return source is None
    return urlsplit(source).netloc == request.host


def tokens_match(given: str, expected: str) -> bool:
    """Our tokens are ASCII; anything else (a cookie's invalid UTF-8 arrives as lone surrogates)
    matches nothing."""
    if not (given and expected and given.isascii() and expected.isascii()):
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def new_signin_token() -> str:
    return secrets.token_urlsafe(24)


# A path of this console: one leading "/" (not "//", which is another host), then printable ASCII
# without backslash (browsers read a backslash as "/") and without whitespace or control characters
# (browsers drop tab and newline, so "/\t/evil.example" would become "//evil.example").
SAME_ORIGIN_PATH = re.compile(r"/(?!/)[\x21-\x5b\x5d-\x7e]*")


def safe_next(target: str) -> str:
    """Where to go after sign-in: a same-origin path, else the default page "/"."""
    return target if SAME_ORIGIN_PATH.fullmatch(target) else "/"
