"""A local stand-in for the Telegram Bot API: a real HTTP server (http.server in a thread) that
answers POST /bot<token>/sendMessage like Telegram does and records every request.

    stub = TelegramStub(fail_first=1)   # the first request gets HTTP 502, later ones succeed
    stub.start(); settings.with_(telegram_api_base=stub.base_url, ...); ...; stub.stop()
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    answered: int  # HTTP status the stub answered with


class TelegramStub:
    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def delivered(self) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.answered == 200]

    def start(self) -> TelegramStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode(errors="replace")}
                with stub._lock:
                    failing = stub.fail_first > 0
                    if failing:
                        stub.fail_first -= 1
                    status = 502 if failing else (200 if self.path.endswith("/sendMessage") else 404)
                    stub.received.append(Received(self.path, body, status))
                answer = (
                    {"ok": True, "result": {"message_id": len(stub.received), "text": body.get("text", "")}}
                    if status == 200
                    else {"ok": False, "error_code": status, "description": "stub failure"}
                )
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
