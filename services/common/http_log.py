"""The logger our aiohttp servers (ingest's HTTP endpoints, the console) hand to aiohttp.

aiohttp answers a request it cannot parse (a header, cookie or request line over its limits,
bytes that are not HTTP) with 400 and logs it at ERROR with a traceback, through the logger a
runner is given (`web.AppRunner(..., logger=...)`). Such a request is the client's mistake, or a
hostile client's, not ours: a flood of them filled the error log. They are logged here as one
INFO line naming the peer and what was wrong, without a traceback; every other record aiohttp
logs (a handler that raised) keeps its level and traceback.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

LOGGER_NAME = "awooop.http"


class _MalformedRequests(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "refused a malformed HTTP request from %s: %s %s", (peer, exc.code, exc.message)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


def server_logger() -> logging.Logger:
    """The logger for web.AppRunner(logger=...): aiohttp's server records, malformed requests in one line."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, _MalformedRequests) for f in logger.filters):
        logger.addFilter(_MalformedRequests())
    return logger
