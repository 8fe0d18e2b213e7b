"""`awooop`: the command line. Server-side commands (serve, up, migrate, admin) import the
services lazily so the client-side commands stay light."""

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
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
