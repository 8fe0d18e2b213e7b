"""Console sessions, kept in Postgres (awooop_console_session, migration 0100).

Sign-in exchanges an API key for a session: the browser gets a random token in an HttpOnly
cookie; the store keeps sha256(token) and the API key encrypted with AES-GCM under a key
derived from the token (HKDF-SHA256). The API key therefore exists in clear only in the
request that presents the cookie, never in the table or in a page. A session ends at
expires_at, at sign-out (revoked_at), or when the key stops working in the services.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass

import asyncpg
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from services.console import sessions_sql

TOKEN_BYTES = 32
# token_urlsafe(32): 43 characters of base64url. A cookie of anything else (longer, or bytes that
# are not UTF-8, which aiohttp hands over as lone surrogates) is not ours: no session, no query.
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PRUNE_BATCH = 1000


@dataclass(frozen=True)
class Session:
    api_key: str
    label: str  # public id of the key, e.g. "awk_3f2a…"
    expires_at: dt.datetime
    csrf: str  # the token every form of this session carries


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _aead(token: str) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"awooop-console-session").derive(token.encode())
    return AESGCM(key)


def csrf_for(token: str) -> str:
    """The session's CSRF token: bound to the session, useless without its cookie, and never
    the cookie itself (a page can show it, the cookie is HttpOnly)."""
    return hmac.new(token.encode(), b"awooop-console-csrf", hashlib.sha256).hexdigest()


def key_label(api_key: str) -> str:
    """The non-secret part of a key (awk_<key_id>_<secret> -> awk_<key_id>_…)."""
    parts = api_key.split("_")
    if len(parts) == 3 and parts[0] == "awk" and parts[1]:
        return f"awk_{parts[1][:40]}_…"
    return "an API key"


class SessionStore:
    def __init__(self, pool: asyncpg.Pool, ttl: float) -> None:
        self.pool = pool
        self.ttl = ttl

    async def create(self, api_key: str) -> tuple[str, Session]:
        """A new session for api_key (already verified by the caller); returns (cookie token, session)."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        nonce = os.urandom(12)
        ciphertext = _aead(token).encrypt(nonce, api_key.encode(), _digest(token))
        label = key_label(api_key)
        expires = await sessions_sql.create_session(
            self.pool,
            session_hash=_digest(token),
            key_ciphertext=ciphertext,
            key_nonce=nonce,
            key_label=label,
            ttl=self.ttl,
        )
        return token, Session(api_key, label, expires, csrf_for(token))

    async def get(self, token: str) -> Session | None:
        if not TOKEN_RE.fullmatch(token):
            return None
        row = await sessions_sql.touch_session(self.pool, session_hash=_digest(token))
        if row is None:
            return None
        try:
            api_key = _aead(token).decrypt(row["key_nonce"], row["key_ciphertext"], _digest(token)).decode()
        except Exception:  # cryptography's InvalidTag: not a session this token opened
            return None
        return Session(api_key, row["key_label"], row["expires_at"], csrf_for(token))

    async def revoke(self, token: str) -> None:
        if TOKEN_RE.fullmatch(token):
            await sessions_sql.revoke_session(self.pool, session_hash=_digest(token))

    async def prune(self) -> int:
        """Deletes sessions that ended more than a day ago; returns how many."""
        total = 0
        while True:
            status = await sessions_sql.prune_sessions(self.pool, batch=PRUNE_BATCH)
            n = int(status.split()[-1])
            total += n
            if n < PRUNE_BATCH:
                return total
