"""`awooop builds ...`: a project's worker builds (docs/versioning.md), through the gRPC API.

    awooop builds list --project P                 the builds: live, draining, newest, runs on each
    awooop builds drain --project P BUILD [--reason R]     no new runs go to BUILD (admin)
    awooop builds undrain --project P BUILD [--reason R]   it takes new runs again (admin)
    awooop builds patches --project P              the patches unfinished runs met, by path taken

Every command takes --json; errors as `awooop runs`.
"""

from __future__ import annotations

import argparse
from typing import Any

from awooop.cli.client import add_connection_args, print_json, print_table, run_command, to_json, when
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client


def register(sub: Any) -> None:
    builds = sub.add_parser("builds", help="a project's worker builds: live, draining, runs on each; patches")
    b = builds.add_subparsers(dest="builds_command", metavar="ACTION", required=True)

    p = _leaf(b, "list", "the project's builds, newest first, with the unfinished runs on each")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_list))

    for name, text in (
        ("drain", "drain a build: no new runs go to it, runs already on it still do (admin role)"),
        ("undrain", "undrain a build: it takes new runs again (admin role)"),
    ):
        p = _leaf(b, name, text)
        p.add_argument("--project", required=True)
        p.add_argument("build")
        p.add_argument("--reason", default="", help="why (audit log)")
        p.set_defaults(func=run_command(cmd_drain), undrain=name == "undrain")

    p = _leaf(b, "patches", "the patches (ctx.patched) the project's unfinished runs met, by the path each took")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_patches))


def _leaf(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_connection_args(p)
    return p


def _state(b: scheduler_pb2.Build) -> str:
    words = ["live" if b.live else "gone"]
    if b.draining:
        words.append("draining")
    if b.newest:
        words.append("newest")
    return ", ".join(words)


async def cmd_list(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(client.scheduler.ListBuilds, scheduler_pb2.ListBuildsRequest(project_id=args.project))
    if args.json:  # the list under its key even when empty (docs/cli.md)
        print_json({"builds": [to_json(b) for b in resp.builds]})
        return 0
    if not resp.builds:
        print(f"no builds in project {args.project} (workers that declare none are not listed)")
        return 0
    print_table(
        ["BUILD", "STATE", "QUEUED", "HELD", "LEASED", "PARKED", "WAITING_FOR_IT", "FIRST_SEEN", "LAST_SEEN"],
        [
            [
                b.build_id,
                _state(b),
                b.queued,
                b.held,
                b.leased,
                b.parked,
                b.waiting_for_build,
                when(b.first_seen_at) or "-",
                when(b.last_seen_at) or "-",
            ]
            for b in resp.builds
        ],
    )
    return 0


async def cmd_drain(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.scheduler.DrainBuild,
        scheduler_pb2.DrainBuildRequest(
            project_id=args.project, build_id=args.build, undrain=args.undrain, reason=args.reason
        ),
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    b = resp.build
    on = b.queued + b.held + b.leased + b.parked
    if b.draining:
        print(f"build {b.build_id} of {b.project_id} drains: no new runs; {on} unfinished runs on it")
    else:
        print(f"build {b.build_id} of {b.project_id} takes new runs again")
    return 0


async def cmd_patches(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(client.scheduler.ListPatches, scheduler_pb2.ListPatchesRequest(project_id=args.project))
    if args.json:
        print_json({"patches": [to_json(p) for p in resp.patches]})
        return 0
    if not resp.patches:
        print(f"no unfinished run of project {args.project} met a patch")
        return 0
    print_table(
        ["CHANGE_ID", "NEW_PATH", "OLD_PATH", "OLD_PATH_DELETABLE"],
        [[p.change_id, p.patched, p.unpatched, "yes" if p.unpatched == 0 else "no"] for p in resp.patches],
    )
    return 0
