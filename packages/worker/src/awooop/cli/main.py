"""`awooop`: the command line. This package (awooop-worker) has the client-side commands; the
server-side ones (serve, up, migrate, config, admin) come with the server package, which registers
them under the `awooop.cli_commands` entry points. Without it they say what to install."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Collection
from importlib.metadata import entry_points

from awooop.cli import builds, channels, demo, flow, health, runs, workers

# each module contributes subcommands: register(subparsers) sets args.func
Register = Callable[[argparse._SubParsersAction], None]  # type: ignore[type-arg]
MODULES: list[Register] = [
    health.register,
    runs.register,
    channels.register,
    flow.register,
    builds.register,
    workers.register,
    demo.register,
]
# the entry-point group where other packages (the server package) add commands: register functions
COMMANDS_GROUP = "awooop.cli_commands"
# what the server package adds: named so that, without it, they answer with what to install
SERVER_COMMANDS = ("serve", "up", "migrate", "config", "admin")


def installed_commands() -> list[Register]:
    """The register functions of the installed `awooop.cli_commands` entry points, by name."""
    return [ep.load() for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name)]


def build_parser() -> argparse.ArgumentParser:
    return _parser_and_commands()[0]


def _parser_and_commands() -> tuple[argparse.ArgumentParser, Collection[str]]:
    parser = argparse.ArgumentParser(
        prog="awooop",
        description="Exactly-once runs, fenced leases and saga compensation on Postgres and Redis.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in [*installed_commands(), *MODULES]:
        register(sub)
    return parser, sub.choices or {}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, commands = _parser_and_commands()
    # the top-level parser has no option taking a value: the first word is the command
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in SERVER_COMMANDS and command not in commands:
        print(
            f"error: `awooop {command}` needs the server package (pip install awooop); "
            "this installation is the client-only awooop-worker",
            file=sys.stderr,
        )
        return 2
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
