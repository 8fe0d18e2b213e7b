"""deploy/kubernetes rendered by `kubectl kustomize` (the kubectl of the [dev] extra) and validated
against the Kubernetes API schemas (kubernetes-validate, strict: unknown fields are errors) of the
oldest release it supports (1.30) and the newest bundled; the KEDA ScaledObject against KEDA's CRD
schema (tests/schemas). Then the manifests against the code they run: commands the CLI parses,
variables that are settings, probes on the ports and grpc.health.v1 names the services serve,
termination grace above the drain it must cover, PodDisruptionBudgets that select the pods, the
console on its settings' port, the Ingress on ingest's HTTP routes with the callback URLs made
from its host, NetworkPolicies that admit exactly the pods whose settings name a service, /tmp
writable under every read-only root, base applying without the workers' key, and the setup
Job's internal-key script run for real against a store."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from awooop.cli.health import SERVICE_ALIASES
from awooop.cli.main import build_parser
from awooop.worker.client import DEFAULT_TIMEOUT
from services.common.principals import INTERNAL_PRINCIPAL, parse_key
from services.common.settings import Settings, env_names
from services.ingest import run_stream, wait_callbacks
from services.ingest.http import HttpIngest
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.waits import callback_url
from tests.harness.helpers import ROOT

KUBECTL = Path(sys.executable).parent / "kubectl"
DEPLOY = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("base", "worker", "keda")
VERSIONS = ("1.30", kubernetes_validate.latest_version())
SERVED = tuple(SERVICE_ALIASES)  # ingest, scheduler, saga, gateway
KEY_SECRET = "awooop-internal-key"


def render(overlay: str, deploy: Path = DEPLOY) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(deploy / overlay)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def strict(schema: Any) -> Any:
    """A CRD's structural schema made strict as kubeconform's -strict does: an object that lists its
    properties admits no others (the API server would drop them silently)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def scaled_object_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "tests" / "schemas" / "keda.sh_scaledobjects.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema: dict[str, Any] = strict(version["schema"]["openAPIV3Schema"])
    return schema


def validate(doc: dict[str, Any], scaled_object_schema: dict[str, Any]) -> None:
    """Raises on a manifest the API (or KEDA's CRD) would refuse or silently prune."""
    if doc["apiVersion"] == "keda.sh/v1alpha1":
        assert doc["kind"] == "ScaledObject", doc["kind"]
        jsonschema.validate(doc, scaled_object_schema)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_manifest_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]], scaled_object_schema: dict[str, Any]
) -> None:
    for overlay, docs in rendered.items():
        for doc in docs:
            try:
                validate(doc, scaled_object_schema)
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
                raise AssertionError(f"{overlay}: {doc['kind']}/{doc['metadata']['name']}: {exc}") from None
    kinds = {d["kind"] for d in rendered["base"]}
    assert {"Deployment", "Service", "PodDisruptionBudget", "Job", "Ingress", "NetworkPolicy"} <= kinds
    assert {d["kind"] for d in rendered["keda"]} == {"Deployment", "PodDisruptionBudget", "ScaledObject"}


def test_the_validation_refuses_a_broken_manifest(
    rendered: dict[str, list[dict[str, Any]]], scaled_object_schema: dict[str, Any]
) -> None:
    """The same validation fails on a misspelt field, a wrong type, and a ScaledObject field KEDA
    does not have: a green run above means something."""
    deployment = copy.deepcopy(one(rendered["base"], "Deployment", "awooop-ingest"))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["grpc"]["serivce"] = container["readinessProbe"]["grpc"].pop("service")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment, scaled_object_schema)
    deployment = copy.deepcopy(one(rendered["base"], "Deployment", "awooop-ingest"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "20s"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment, scaled_object_schema)
    scaled = copy.deepcopy(one(rendered["keda"], "ScaledObject", "awooop-worker"))
    scaled["spec"]["maxReplicas"] = scaled["spec"].pop("maxReplicaCount")
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled, scaled_object_schema)


def container_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The variables a container gets from its ConfigMap and its own env; the secrets' (the store's
    URLs, keys) are the operator's and not in the manifests."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= one(docs, "ConfigMap", source["configMapRef"]["name"])["data"]
    env |= {e["name"]: e["value"] for e in container.get("env", [])}
    return env


def the_container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (container,) = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return container


def parses(argv: list[str]) -> Any:
    assert argv[0] == "awooop", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"not a valid awooop command line: {argv}") from exc


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_service_is_probed_on_its_port_and_health_name(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = rendered["base"]
    # the secrets' part, as the pod gets it: the store's URL, the key file the Secret mounts
    key_file = tmp_path / "internal-api-key"
    key_file.write_text("awk_0123456789abcdef_not-a-real-secret\n")
    secrets = {"AWOOOP_DATABASE_URL": "postgresql://awooop@store/awooop"}
    known = set(env_names())
    for name in SERVED:
        deployment = one(docs, "Deployment", f"awooop-{name}")
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        args = parses(container["command"])
        assert args.func.__name__ == "cmd_serve" and args.services == [name]
        env = container_env(docs, container)
        assert not [k for k in env if k not in known], f"{name}: not settings: {set(env) - known}"
        if "AWOOOP_INTERNAL_API_KEY_FILE" in env:
            env["AWOOOP_INTERNAL_API_KEY_FILE"] = str(key_file)
        s = Settings.from_env(env | secrets)  # raises SettingsError naming a value that does not parse
        assert s.host == "0.0.0.0", f"{name} must listen beyond the pod's loopback"
        port = s.port_of(name)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["grpc"] == port and ports["metrics"] == s.metrics_port
        ready, live, start = container["readinessProbe"], container["livenessProbe"], container["startupProbe"]
        assert ready["grpc"] == {"port": port, "service": SERVICE_ALIASES[name]}
        assert live["grpc"] == {"port": port} and start["grpc"] == {"port": port}  # the whole server
        # the kubelet's SIGKILL comes after the shutdown the settings give (docs/operations.md)
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        assert grace > s.shutdown_delay + s.shutdown_grace, (name, grace)
        service = one(docs, "Service", f"awooop-{name}")
        assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
        assert {p["port"] for p in service["spec"]["ports"]} >= {port, s.metrics_port}
        pdb = one(docs, "PodDisruptionBudget", f"awooop-{name}")
        assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
        assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"], "a drain could never evict one"
    # the addresses the services are given are the Services' names and ports
    scheduler = container_env(docs, the_container(docs, "awooop-scheduler"))
    saga = container_env(docs, the_container(docs, "awooop-saga"))
    assert scheduler["AWOOOP_SAGA_ADDR"] == f"awooop-saga:{Settings().port_of('saga')}"
    assert saga["AWOOOP_GATEWAY_ADDR"] == f"awooop-gateway:{Settings().port_of('gateway')}"


def test_the_scheduler_and_saga_read_the_internal_key_from_its_secret(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["base"]
    for name in ("scheduler", "saga"):
        deployment = one(docs, "Deployment", f"awooop-{name}")
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        key_file = Path(container_env(docs, container)["AWOOOP_INTERNAL_API_KEY_FILE"])
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == key_file.parent]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == KEY_SECRET and not volume["secret"].get("optional")
        # the non-root user reads the file through the pod's fsGroup
        assert volume["secret"]["defaultMode"] & 0o040 and spec["securityContext"]["fsGroup"]
        assert key_file.name == "internal-api-key"
    role = one(docs, "Role", "awooop-setup")
    assert any(KEY_SECRET in r.get("resourceNames", []) and "patch" in r["verbs"] for r in role["rules"])


def setup_job(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    job = one(docs, "Job", "awooop-setup")
    migrate, key = job["spec"]["template"]["spec"]["initContainers"]
    (store,) = job["spec"]["template"]["spec"]["containers"]
    return migrate, key, store


def test_the_setup_job_migrates_first(rendered: dict[str, list[dict[str, Any]]]) -> None:
    migrate, _, store = setup_job(rendered["base"])
    assert parses(migrate["command"]).func.__name__ == "cmd_migrate"
    assert store["args"][0] == "apply" and store["args"][-1] == "/keys/secret.json"


async def test_the_setup_jobs_key_script_keeps_a_valid_key_in_the_secret(
    rendered: dict[str, list[dict[str, Any]]], db_dsn: str, db: Any, tmp_path: Path
) -> None:
    """The internal-key container's script, run for real against a migrated store with its
    volumes as directories: it writes the Secret the next container applies, holding a key of
    the internal principal; run again with that Secret mounted, it keeps the same key."""
    _, container, _ = setup_job(rendered["base"])
    assert container["command"][:2] == ["sh", "-ec"]
    keys, current = tmp_path / "keys", tmp_path / "current"
    keys.mkdir()
    current.mkdir()
    script = container["command"][2].replace("/keys/", f"{keys}/").replace("/current/", f"{current}/")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env |= {"AWOOOP_DATABASE_URL": db_dsn, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}

    def run() -> dict[str, Any]:
        out = subprocess.run(["sh", "-ec", script], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        secret: dict[str, Any] = json.loads((keys / "secret.json").read_text())
        kubernetes_validate.validate(secret, VERSIONS[0], strict=True)
        return secret

    secret = await asyncio.to_thread(run)
    assert secret["metadata"]["name"] == KEY_SECRET
    key = base64.b64decode(secret["data"]["internal-api-key"]).decode().strip()
    parsed = parse_key(key)
    assert parsed is not None, key
    principal = await db.fetchval(
        "SELECT principal_id FROM awooop_api_key WHERE key_id = $1 AND revoked_at IS NULL", parsed[0]
    )
    assert principal == INTERNAL_PRINCIPAL
    # the next run (a new pod: an empty keys volume) with the Secret mounted keeps that key
    (current / "internal-api-key").write_bytes(base64.b64decode(secret["data"]["internal-api-key"]))
    for leftover in keys.iterdir():
        leftover.unlink()
    again = await asyncio.to_thread(run)
    assert again["data"] == secret["data"]
    assert await db.fetchval("SELECT count(*) FROM awooop_api_key WHERE principal_id = $1", INTERNAL_PRINCIPAL) == 1


def flag(command: list[str], name: str) -> str:
    (value,) = [c.split("=", 1)[1] for c in command if c.startswith(f"--{name}=")]
    return value


def test_a_worker_pod_is_killed_only_after_the_sdks_drain(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """On SIGTERM the SDK gives handlers --shutdown-grace, then hands back what it still holds with
    retries for up to 2 call timeouts (packages/worker/src/awooop/worker/worker.py); a claim in
    flight is awaited (it ends within --claim-wait). The kubelet's SIGKILL must come after all of that."""
    docs = rendered["worker"]
    deployment = one(docs, "Deployment", "awooop-worker")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "awooop.worker.demo_worker"]
    drain = float(flag(command, "shutdown-grace")) + 2 * DEFAULT_TIMEOUT
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > drain and grace > float(flag(command, "claim-wait")), (grace, drain)
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    ports = {name: Settings().port_of(name) for name in ("scheduler", "saga", "gateway")}
    assert env == {f"AWOOOP_{n.upper()}_ADDR": f"awooop-{n}:{p}" for n, p in ports.items()} | {
        # the worker's build is its pod's version label (docs/versioning.md)
        "AWOOOP_WORKER_BUILD": "metadata.labels['app.kubernetes.io/version']"
    }
    assert pod["metadata"]["labels"]["app.kubernetes.io/version"]
    pdb = one(docs, "PodDisruptionBudget", "awooop-worker")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])


def test_keda_scales_the_workers_on_the_schedulers_queue_metrics(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["keda"]
    scaled = one(docs, "ScaledObject", "awooop-worker")
    worker = one(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    assert "replicas" not in worker["spec"], "KEDA owns the count; a replicas field resets it on apply"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert {"serverAddress", "query", "threshold"} <= set(meta)
    # the metrics the query reads are the scheduler's, with the labels it gives them
    claimable = scheduler_metrics.CLAIMABLE.describe()[0].name
    runs = scheduler_metrics.RUNS.describe()[0].name
    assert f'{claimable}{{project="demo"}}' in meta["query"]
    assert f'{runs}{{project="demo", status="RUNNING"}}' in meta["query"]
    assert "RUNNING" in scheduler_metrics.UNFINISHED
    # the target per pod is what one pod handles at once
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert meta["threshold"] == flag(container["command"], "concurrency")
    assert "--project=demo" in container["command"]


def ts_default(path: Path, pattern: str) -> float:
    """A default the TypeScript package's source sets (seconds)."""
    found = re.search(pattern, path.read_text())
    assert found, (path, pattern)
    return float(found[1])


def test_the_typescript_worker_example_runs_node_drains_before_its_sigkill_and_is_probed_on_its_health_port() -> None:
    """examples/node-worker/kubernetes.yaml (applied beside the base, not part of it) is valid for
    the API; its container runs node itself, as the example's image does, never npm (npm start's
    script execs node, for the same reason); the kubelet's SIGKILL comes after the TypeScript
    Worker's drain (shutdownGrace, then hand-backs for up to 2 call timeouts; a claim in flight
    ends within claimWait); the liveness probe asks /healthz on the port the worker serves it on."""
    example = ROOT / "examples" / "node-worker"
    docs = [d for d in yaml.safe_load_all((example / "kubernetes.yaml").read_text()) if d]
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    pod = one(docs, "Deployment", "awooop-node-worker")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    dockerfile = (example / "Dockerfile").read_text()
    image_command = [
        json.loads(line.removeprefix("CMD ")) for line in dockerfile.splitlines() if line.startswith("CMD ")
    ]
    assert container["command"] == image_command[-1] == ["node", "dist/worker.js"]
    scripts = json.loads((example / "package.json").read_text())["scripts"]
    assert scripts["start"] == "exec node dist/worker.js"
    # the example keeps the package's shutdown defaults
    assert "shutdownGrace" not in (example / "worker.ts").read_text()
    src = ROOT / "packages" / "worker-ts" / "src"
    grace = ts_default(src / "worker.ts", r"options\.shutdownGrace \?\? (\d+)")
    claim_wait = ts_default(src / "worker.ts", r"options\.claimWait \?\? (\d+)")
    call_timeout = ts_default(src / "client.ts", r"DEFAULT_TIMEOUT = (\d+)")
    kill_after = pod["spec"]["terminationGracePeriodSeconds"]
    assert kill_after > grace + 2 * call_timeout and kill_after > claim_wait, (kill_after, grace, call_timeout)
    env = {e["name"]: e["value"] for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == int(env["AWOOOP_WORKER_HTTP_PORT"])
    assert f"ENV AWOOOP_WORKER_HTTP_PORT={env['AWOOOP_WORKER_HTTP_PORT']}" in dockerfile
    for name in ("scheduler", "saga", "gateway"):
        assert env[f"AWOOOP_{name.upper()}_ADDR"] == f"awooop-{name}:{Settings().port_of(name)}"
    pdb = one(docs, "PodDisruptionBudget", "awooop-node-worker")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployment or Job name -> its pod template."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "Job")}


def test_the_console_serves_on_its_settings_port_and_calls_the_services_by_their_names(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    from aiohttp import web

    from services.console.app import make_app, templates
    from services.console.views import Console

    docs = rendered["base"]
    deployment = one(docs, "Deployment", "awooop-console")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = parses(container["command"])
    assert args.func.__name__ == "cmd_serve" and args.services == ["console"]
    env = container_env(docs, container)
    assert not set(env) - set(env_names()), f"not settings: {set(env) - set(env_names())}"
    s = Settings.from_env(env | {"AWOOOP_DATABASE_URL": "postgresql://awooop@store/awooop"})
    assert s.host == "0.0.0.0" and s.console_port == Settings().console_port
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": s.console_port, "metrics": s.metrics_port}
    assert s.console_scheduler_addr == f"awooop-scheduler:{Settings().scheduler_port}"
    assert s.console_saga_addr == f"awooop-saga:{Settings().saga_port}"
    # the probes' path is the console's own health route, which needs no session
    app = make_app(Console(templates(), None, None, trace_url="", secure=False))  # type: ignore[arg-type]
    routes = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource is not None}
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["port"] == "http" and probe["httpGet"]["path"] in routes
    assert isinstance(app, web.Application)
    service = one(docs, "Service", "awooop-console")
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    assert {p["port"] for p in service["spec"]["ports"]} == {s.console_port, s.metrics_port}
    pdb = one(docs, "PodDisruptionBudget", "awooop-console")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_the_ingress_routes_ingests_http_endpoint_and_its_host_makes_the_callback_urls(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Webhooks, the API channel, callback URLs and run event streams reach ingest's HTTP port
    through the Ingress; the callback URLs the scheduler hands out start with the Ingress's host,
    and follow it when an operator sets another."""
    docs = rendered["base"]
    ingress = one(docs, "Ingress", "awooop-ingest")
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["pathType"] == "Prefix"
    backend = path["backend"]["service"]
    assert backend["name"] == "awooop-ingest"
    service = one(docs, "Service", "awooop-ingest")
    (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == backend["port"]["name"]]
    http_port = Settings.from_env(container_env(docs, the_container(docs, "awooop-ingest"))).http_port
    assert service_port["port"] == http_port == Settings().http_port
    # ingest's HTTP routes, registered as its app registers them (nothing is called)
    app = HttpIngest(Settings(), None, None, None).app()  # type: ignore[arg-type]
    wait_callbacks.add_routes(app, None, Settings())  # type: ignore[arg-type]
    run_stream.add_routes(app, Settings())
    routes = [r.canonical for r in app.router.resources()]
    assert len(routes) == 4 and all(r.startswith(path["path"]) for r in routes), routes
    assert any(rule["host"] in t["hosts"] for t in ingress["spec"]["tls"]), "the route is served with TLS"
    assert run_stream.KEEPALIVE_SECONDS < 60  # below a proxy's usual read timeout: streams stay open

    def callback_base(docs: list[dict[str, Any]]) -> str:
        env = container_env(docs, the_container(docs, "awooop-scheduler"))
        env.pop("AWOOOP_INTERNAL_API_KEY_FILE")  # the Secret's file, mounted in the pod only
        return Settings.from_env(env).wait_callback_base_url

    url = urlsplit(callback_url(callback_base(docs), "tok"))
    assert (url.scheme, url.netloc) == ("https", rule["host"]) and url.path.startswith(path["path"])
    # an operator's host: set once, in ingress.yaml
    copied = tmp_path / "kubernetes"
    shutil.copytree(DEPLOY, copied)
    ingress_file = copied / "base" / "ingress.yaml"
    ingress_file.write_text(ingress_file.read_text().replace(rule["host"], "hooks.corp.example"))
    assert callback_base(render("base", copied)) == "https://hooks.corp.example"


def test_network_policies_admit_exactly_the_pods_whose_settings_name_the_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Who calls whom is read from the manifests' *_ADDR variables (awooop-<service>:<port>); each
    internal gRPC service's policy admits exactly those pods on its gRPC port, and anyone on /metrics."""
    pods = {**pod_templates(rendered["base"]), **pod_templates(rendered["worker"])}
    address = re.compile(r"awooop-(\w+):(\d+)")
    callers: dict[str, set[str]] = {}
    for template in pods.values():
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        for container in template["spec"]["containers"]:
            for e in container.get("env", []):
                m = address.fullmatch(e.get("value", ""))
                if e["name"].endswith("_ADDR") and m:
                    assert int(m.group(2)) == Settings().port_of(m.group(1)), e
                    callers.setdefault(m.group(1), set()).add(component)
    policies = [d for d in rendered["base"] if d["kind"] == "NetworkPolicy"]
    guarded = {}
    for policy in policies:
        target = policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        grpc_rule, metrics_rule = policy["spec"]["ingress"]
        (source,) = grpc_rule["from"]
        expressions = {x["key"]: x for x in source["podSelector"]["matchExpressions"]}
        assert expressions["app.kubernetes.io/name"]["values"] == ["awooop"]
        guarded[target] = set(expressions["app.kubernetes.io/component"]["values"])
        assert grpc_rule["ports"] == [{"port": "grpc"}] and metrics_rule == {"ports": [{"port": "metrics"}]}
        (container,) = pods[f"awooop-{target}"]["spec"]["containers"]
        names = {p["name"] for p in container["ports"]}
        assert names == {"grpc", "metrics"}, f"{target}: a port the policy would close"
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert set(guarded) == {"gateway", "saga", "scheduler"}  # ingest and the console face their users
    assert guarded == {t: callers[t] for t in guarded}, (guarded, callers)


def test_every_read_only_root_has_a_writable_tmp(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay in OVERLAYS:
        for name, template in pod_templates(rendered[overlay]).items():
            spec = template["spec"]
            empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                    tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                    assert tmp and tmp[0]["name"] in empty and not tmp[0].get("readOnly"), (name, container["name"])


def secrets_used(template: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(Secrets a pod's containers take variables from, Secrets it mounts and needs)."""
    spec = template["spec"]
    env = set()
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        env |= {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
        env |= {
            e["valueFrom"]["secretKeyRef"]["name"]
            for e in container.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
    mounted = {
        v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v and not v["secret"].get("optional")
    }
    return env, mounted


def test_base_applies_before_the_workers_key_exists(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """kustomize cannot order objects, so base holds nothing that needs the workers' key (made after
    the setup Job migrated the store): its pods take variables only from the store's Secret, made
    first, and mount only the Secret the Job makes (a pod waits for a missing secret volume in
    ContainerCreating, a missing variable source would be CreateContainerConfigError). The
    workers, which need their key, are the worker and keda overlays, applied after it."""
    for name, template in pod_templates(rendered["base"]).items():
        env, mounted = secrets_used(template)
        assert env <= {"awooop-store"} and mounted <= {KEY_SECRET}, (name, env, mounted)
    for overlay in ("worker", "keda"):
        (template,) = pod_templates(rendered[overlay]).values()
        assert secrets_used(template)[0] == {"awooop-worker-key"}
        assert not [
            d for d in rendered[overlay] if d["kind"] not in ("Deployment", "PodDisruptionBudget", "ScaledObject")
        ]


def test_every_image_but_awooops_own_is_named_where_mirrors_are_discussed(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """An operator behind a registry mirror must mirror every image the manifests pull."""
    docs = (ROOT / "docs" / "operations.md").read_text()
    mirrors = docs.split("### Containers: mirrors", 1)[1].split("\n### ", 1)[0]
    images = {
        c["image"]
        for overlay in OVERLAYS
        for template in pod_templates(rendered[overlay]).values()
        for c in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]
    }
    others = images - {"awooop:local"}
    assert others and all(f"`{image}`" in mirrors for image in others), (others, mirrors)
