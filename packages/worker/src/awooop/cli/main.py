"""`awooop`: the command line. Server-side commands (serve, up, migrate, admin) import the
services lazily so the client-side commands stay light, and so that the client-only package
(awooop-worker, packages/worker) can ship this command: there they say what to install."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from awooop.cli import admin, channels, demo, flow, health, runs, server

# each module contributes subcommands: register(subparsers) sets args.func
MODULES: list[Callable[[argparse._SubParsersAction], None]] = [  # type: ignore[type-arg]
    server.register,
    admin.register,
    health.register,
    runs.register,
    channels.register,
    flow.register,
    demo.register,
]


# top-level modules only the server package (`awooop`) installs
SERVER_MODULES = {"services", "asyncpg", "redis", "aiohttp", "jinja2", "croniter"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="awooop",
        description="Exactly-once runs, fenced leases and saga compensation on Postgres and Redis.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in MODULES:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:  # `awooop config | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        print(
            f"error: `awooop {args.command}` needs the server package (pip install awooop); "
            f"this installation is the client-only awooop-worker (missing: {exc.name})",
            file=sys.stderr,
        )
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
