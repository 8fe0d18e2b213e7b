"""Shared helpers of the client-side commands (runs, demo): connection options, the API key,
rich-error rendering, JSON and table output.

Connection options come from flags, else AWOOOP_* variables, else the `awooop up` defaults:
  --key        AWOOOP_API_KEY, else the dev admin key `awooop up` keeps in <data dir>/dev-admin.key
  --ingest     AWOOOP_INGEST_ADDR     (127.0.0.1:50051)
  --scheduler  AWOOOP_SCHEDULER_ADDR  (127.0.0.1:50052)
  --saga       AWOOOP_SAGA_ADDR       (127.0.0.1:50053)
  --gateway    AWOOOP_GATEWAY_ADDR    (127.0.0.1:50054)
  (without an *_ADDR, AWOOOP_<SERVICE>_PORT on AWOOOP_HOST: the port the service was configured with)
  --tls / --ca-file   AWOOOP_TLS / AWOOOP_TLS_CA_FILE
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from awooop.worker.client import DEFAULT_ADDRESSES, Client
from awooop.worker.errors import UNAUTHENTICATED, AwooopError
from awooop.worker.structs import ints

EXIT_RPC_ERROR = 1
EXIT_USAGE = 2


def add_connection_args(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """The connection flags. A parser whose parent has them too takes them with inherited=True:
    unset there, they leave the parent's value alone, so `runs --scheduler X list` and
    `runs list --scheduler X` mean the same."""
    unset: Any = argparse.SUPPRESS if inherited else None
    g = p.add_argument_group("connection")
    g.add_argument("--key", default=unset, help="API key (default: AWOOOP_API_KEY, else the `awooop up` dev key)")
    for service in ("ingest", "scheduler", "saga", "gateway"):
        name = service.upper()
        g.add_argument(
            f"--{service}",
            default=unset,
            metavar="ADDR",
            help=f"{service} address: HOST:PORT, a comma-separated list of replicas, or a gRPC target such as "
            f"dns:///NAME:PORT (default: AWOOOP_{name}_ADDR, else AWOOOP_{name}_PORT on AWOOOP_HOST, "
            f"else {DEFAULT_ADDRESSES[service]})",
        )
    g.add_argument(
        "--timeout",
        type=float,
        default=argparse.SUPPRESS if inherited else 10.0,
        help="deadline of each call in seconds (default 10)",
    )
    g.add_argument("--tls", action="store_true", default=unset, help="use TLS (default: AWOOOP_TLS)")
    g.add_argument("--ca-file", default=unset, help="CA bundle for TLS (default: AWOOOP_TLS_CA_FILE)")
    g.add_argument(
        "--channel-option",
        action="append",
        default=argparse.SUPPRESS if inherited else [],
        metavar="NAME=VALUE",
        type=_channel_option,
        help="a gRPC channel argument, e.g. grpc.keepalive_time_ms=30000 (repeatable)",
    )
    g.add_argument(
        "--data-dir",
        default=unset,
        help="where `awooop up` keeps dev-admin.key (default: AWOOOP_DATA_DIR or .awooop)",
    )


def _channel_option(text: str) -> tuple[str, str | int]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name.strip(), int(value) if value.strip().lstrip("-").isdigit() else value


def dev_key_file(data_dir: str | None = None) -> Path:
    return Path(data_dir or os.environ.get("AWOOOP_DATA_DIR") or ".awooop") / "dev-admin.key"


def resolve_key(args: argparse.Namespace) -> str:
    if args.key:
        return str(args.key)
    if os.environ.get("AWOOOP_API_KEY"):
        return os.environ["AWOOOP_API_KEY"]
    path = dev_key_file(args.data_dir)
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def make_client(args: argparse.Namespace) -> Client:
    return Client(
        key=resolve_key(args),
        ingest=args.ingest,
        scheduler=args.scheduler,
        saga=args.saga,
        gateway=args.gateway,
        timeout=args.timeout,
        tls=args.tls,
        ca_file=args.ca_file,
        channel_options=getattr(args, "channel_option", None),
    )


def render_error(err: AwooopError) -> str:
    """`error: <CODE> <REASON>: message`, then one line per field violation."""
    return "error: " + err.details.render()


def service_of(method: str) -> str:
    """The service a method path belongs to: /awooop.scheduler.v1.SchedulerService/GetRun -> scheduler."""
    parts = method.lstrip("/").split(".")
    area = parts[1] if len(parts) > 2 and parts[0] == "awooop" else ""
    return "gateway" if area == "tools" else area


def _address_of(err: AwooopError, client: Client) -> tuple[str, str, str, str, str] | None:
    """For an error the server did not explain (no awooop reason): the service called, its
    address, where that address came from, and the flag and variable that set it."""
    service = service_of(err.method)
    if err.reason or service not in client.sources:
        return None
    addr, source = client.sources[service]
    flag, var = f"--{service}", f"AWOOOP_{service.upper()}_ADDR"
    return service, addr, {"argument": flag, "default": "the default"}.get(source, source), flag, var


def explain_unavailable(err: AwooopError, client: Client) -> str | None:
    """For a call that never reached the service: one line saying what to change. A served
    UNAVAILABLE (STORE_UNAVAILABLE) carries a reason and is left as the server said it."""
    where = _address_of(err, client)
    if where is None:
        return None
    service, addr, origin, flag, var = where
    text = err.details.message.lower()
    if "handshake" in text and ("wrong_version_number" in text or "tsi_protocol_failure" in text):
        return (
            f"error: UNAVAILABLE: the {service} at {addr} does not speak TLS (the TLS handshake failed):"
            " drop --tls / AWOOOP_TLS, or point at a TLS port"
        )
    if "handshake" in text or "certificate" in text:
        return (
            f"error: UNAVAILABLE: TLS with the {service} at {addr} failed ({_last_error(err.details.message)}):"
            " check --ca-file / AWOOOP_TLS_CA_FILE"
        )
    return (
        f"error: UNAVAILABLE: cannot reach the {service} at {addr} ({_last_error(err.details.message)}); "
        f"that address is from {origin}: set it with {flag} or {var}"
    )


def explain_unimplemented(err: AwooopError, client: Client) -> str | None:
    """grpc's own `Method not found!` (no awooop reason): the address is most likely another
    service's port, so name the address, where it came from and how to change it."""
    where = _address_of(err, client)
    if where is None:
        return None
    service, addr, origin, flag, var = where
    method = err.method.rsplit("/", 1)[-1]
    return (
        f"error: UNIMPLEMENTED: the server at {addr} does not serve the {service} service ({method}): "
        f"is it another service's port? That address is from {origin}: set it with {flag} or {var}"
    )


def _last_error(message: str) -> str:
    """The useful tail of grpc's connect failure (`...: Connection refused`), without its `: OK`
    and the brackets grpc wraps it in; a name that does not resolve is said so."""
    if "DNS resolution failed" in message or "Domain name not found" in message:
        return "the host name does not resolve"
    tail = message.removesuffix(": OK").rsplit(": ", 1)[-1].strip(" ()[]")
    return tail or message


def run_command(
    fn: Callable[[argparse.Namespace, Client], Awaitable[int | None]],
) -> Callable[[argparse.Namespace], int]:
    """Wraps an async command: opens the client, maps RPC errors to a message and exit code 1."""

    def command(args: argparse.Namespace) -> int:
        client = make_client(args)

        async def go() -> int:
            try:
                return int(await fn(args, client) or 0)
            finally:
                await client.close()

        try:
            return asyncio.run(go())
        except AwooopError as err:
            explain = {"UNAVAILABLE": explain_unavailable, "UNIMPLEMENTED": explain_unimplemented}.get(err.code.name)
            print((explain and explain(err, client)) or render_error(err), file=sys.stderr)
            if err.reason == UNAUTHENTICATED and not resolve_key(args):
                print("hint: pass --key or set AWOOOP_API_KEY (`awooop up` prints one)", file=sys.stderr)
            return EXIT_RPC_ERROR
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `awooop runs list | head`: the reader left, nothing to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return command


def positive_int(value: str) -> int:
    """argparse type: a whole number of at least 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


# --- output ---


def to_json(msg: Message) -> dict[str, Any]:
    """A message as JSON, field names as in the .proto; whole numbers inside Structs stay ints."""
    return ints(json_format.MessageToDict(msg, preserving_proto_field_name=True))  # type: ignore[no-any-return]


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False, default=str))


def when(t: timestamp_pb2.Timestamp | None, *, date: bool = True) -> str:
    """A database timestamp as UTC text; empty when unset."""
    if t is None or (t.seconds == 0 and t.nanos == 0):
        return ""
    d = t.ToDatetime(dt.UTC)
    return d.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if date else d.strftime("%H:%M:%S.%f")[:-3]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line.rstrip())
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)
