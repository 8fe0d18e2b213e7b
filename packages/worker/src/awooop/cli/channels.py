"""`awooop channels ...`: webhook endpoints (admin role), through the ingest service's RPCs.

    awooop channels add CHANNEL NAME --project P [--secret S] [--url BASE]
    awooop channels list --project P
    awooop channels rotate CHANNEL NAME --project P [--secret S] [--grace SECONDS] [--url BASE]
    awooop channels remove CHANNEL NAME --project P

CHANNEL is telegram, alertmanager, gitea or line. add and rotate print the secret (the only
time it is ever shown) and the provider-side setup to paste: Alertmanager's receiver YAML, the
Telegram setWebhook call, the LINE or Gitea console settings. --url is the address providers
reach the ingest service's HTTP port at (default: AWOOOP_HTTP_PORT on AWOOOP_HOST, else
http://127.0.0.1:8080). --json on every command.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from awooop.cli.client import add_connection_args, print_json, print_table, run_command, to_json, when
from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.worker.client import Client, client_host

CHANNELS = ("telegram", "alertmanager", "gitea", "line")
DEFAULT_HTTP_PORT = "8080"


def default_url() -> str:
    """Where a local ingest service answers HTTP: the port it was configured with
    (AWOOOP_HTTP_PORT on AWOOOP_HOST), as the gRPC addresses follow AWOOOP_<SERVICE>_PORT."""
    port = os.environ.get("AWOOOP_HTTP_PORT", "").strip()
    host = client_host(os.environ.get("AWOOOP_HOST", "127.0.0.1").strip())
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if os.environ.get("AWOOOP_TLS_CERT_FILE") else "http"
    return f"{scheme}://{host}:{port if port.isdigit() and port != '0' else DEFAULT_HTTP_PORT}"


URL_HELP = "base URL providers reach (default: AWOOOP_HTTP_PORT on AWOOOP_HOST, else http://127.0.0.1:8080)"


def register(sub: Any) -> None:
    channels = sub.add_parser("channels", help="webhook endpoints: add, list, rotate, remove (admin role)")
    c = channels.add_subparsers(dest="channels_command", metavar="ACTION", required=True)

    p = _leaf(c, "add", "create a webhook endpoint; prints its secret once and the provider setup")
    _ident(p)
    p.add_argument("--secret", default="", help="the provider's secret when it issues one (LINE channel secret)")
    p.add_argument("--url", default=None, help=URL_HELP)
    p.set_defaults(func=run_command(cmd_add))

    p = _leaf(c, "list", "list a project's webhook endpoints (never their secrets)")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_list))

    p = _leaf(c, "rotate", "replace an endpoint's secret; the old one keeps working for the grace period")
    _ident(p)
    p.add_argument("--secret", default="", help="the new secret when the provider issues it (LINE)")
    p.add_argument("--grace", type=float, default=0.0, help="seconds the old secret stays valid (default: server's)")
    p.add_argument("--url", default=None, help=URL_HELP)
    p.set_defaults(func=run_command(cmd_rotate))

    p = _leaf(c, "remove", "remove a webhook endpoint (its deliveries are answered 404)")
    _ident(p)
    p.set_defaults(func=run_command(cmd_remove))


def _leaf(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_connection_args(p)
    return p


def _ident(p: argparse.ArgumentParser) -> None:
    p.add_argument("channel", choices=CHANNELS)
    p.add_argument("name", help="endpoint name (letters, digits, '.', '_', '-'), part of the URL")
    p.add_argument("--project", required=True)


def channel_type(name: str) -> common_pb2.ChannelType.ValueType:
    return common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{name.upper()}")


def channel_name(value: common_pb2.ChannelType.ValueType) -> str:
    return str(common_pb2.ChannelType.Name(value)).removeprefix("CHANNEL_TYPE_").lower()


# --- what to paste on the provider's side --------------------------------------------------------


def alertmanager_receiver(url: str, secret: str) -> str:
    """alertmanager.yml: a route to the receiver and the receiver with bearer credentials."""
    return f"""# alertmanager.yml (merge the receiver into yours; route alerts to it as you need)
route:
  receiver: awooop
receivers:
  - name: awooop
    webhook_configs:
      - url: {url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {secret}
"""


def setup_text(channel: str, url: str, secret: str) -> str:
    if channel == "alertmanager":
        return alertmanager_receiver(url, secret)
    if channel == "telegram":
        return (
            "# register the webhook with the bot's token (Telegram sends the secret back in\n"
            "# X-Telegram-Bot-Api-Secret-Token with every update)\n"
            f'curl -s "https://api.telegram.org/bot$TELEGRAM_BOT_TOKEN/setWebhook" \\\n'
            f"  -d url={url} -d secret_token={secret}\n"
        )
    if channel == "line":
        return (
            "# LINE Developers console > your Messaging API channel > Messaging API tab:\n"
            f"#   Webhook URL: {url}   (then Verify; Use webhook: on)\n"
            "# the secret is the channel's Channel secret (Basic settings tab); pass it with --secret\n"
        )
    return (
        "# Gitea: repository (or organization) Settings > Webhooks > Add Webhook > Gitea:\n"
        f"#   Target URL: {url}\n"
        "#   HTTP Method: POST   POST Content Type: application/json\n"
        f"#   Secret: {secret}\n"
    )


def _url(base: str, endpoint: ingest_pb2.Endpoint) -> str:
    return base.rstrip("/") + str(endpoint.path)


def _show_secret(args: argparse.Namespace, endpoint: ingest_pb2.Endpoint, secret: str, verb: str) -> None:
    url = _url(args.url or default_url(), endpoint)
    setup = setup_text(args.channel, url, secret)
    if args.json:
        print_json({"endpoint": to_json(endpoint), "url": url, "secret": secret, "setup": setup})
        return
    print(f"{verb} {args.channel} endpoint {args.name} in project {args.project}")
    print(f"url:    {url}")
    print(f"secret: {secret}   (shown once; `awooop channels rotate` issues a new one)")
    print()
    print(setup, end="")


async def cmd_add(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.ingest.CreateEndpoint,
        ingest_pb2.CreateEndpointRequest(
            project_id=args.project, channel_type=channel_type(args.channel), name=args.name, secret=args.secret
        ),
    )
    _show_secret(args, resp.endpoint, resp.secret, "created")
    return 0


async def cmd_rotate(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.ingest.RotateEndpointSecret,
        ingest_pb2.RotateEndpointSecretRequest(
            project_id=args.project,
            channel_type=channel_type(args.channel),
            name=args.name,
            secret=args.secret,
            grace_seconds=args.grace,
        ),
    )
    _show_secret(args, resp.endpoint, resp.secret, "rotated")
    if not args.json:
        print(f"the previous secret is accepted until {when(resp.endpoint.previous_secret_expire_time)}")
    return 0


async def cmd_list(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(client.ingest.ListEndpoints, ingest_pb2.ListEndpointsRequest(project_id=args.project))
    if args.json:
        print_json({"endpoints": [to_json(e) for e in resp.endpoints]})
        return 0
    if not resp.endpoints:
        print(f"no webhook endpoints in project {args.project}")
        return 0
    print_table(
        ["CHANNEL", "NAME", "PATH", "CREATED", "ROTATED", "PREVIOUS SECRET UNTIL"],
        [
            [
                channel_name(e.channel_type),
                e.name,
                e.path,
                when(e.create_time),
                when(e.rotate_time) or "-",
                when(e.previous_secret_expire_time) or "-",
            ]
            for e in resp.endpoints
        ],
    )
    return 0


async def cmd_remove(args: argparse.Namespace, client: Client) -> int:
    await client.call(
        client.ingest.RemoveEndpoint,
        ingest_pb2.RemoveEndpointRequest(
            project_id=args.project, channel_type=channel_type(args.channel), name=args.name
        ),
    )
    if args.json:
        print_json({"removed": True})
    else:
        print(f"removed {args.channel} endpoint {args.name} from project {args.project}")
    return 0
