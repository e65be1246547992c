"""The API guard (scripts/node/kimi_vllm_api_guard.py): every route needs the key except /health and
/metrics, and every platform loads it: the rendered command, the Kubernetes pod and ConfigMap, the
EC2 boot (fetched from the mirror's _tools/, mounted read-only). The real engine with and without it:
tests/test_real_engine.py."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from components.core.load import load_stack
from components.core.vllm import (
    API_GUARD_CONTAINER_DIR,
    API_GUARD_FILENAME,
    API_GUARD_MIDDLEWARE,
    API_GUARD_SOURCE,
    API_OPEN_PATHS,
)
from scripts.node.kimi_vllm_api_guard import MIN_API_KEY_CHARS, OPEN_PATHS, RequireApiKey
from tests.conftest import STACKS, plan_for

KEY = "sk-guard-test-0123456789"


def call(path: str, *, method: str = "POST", key: str | None = None, kind: str = "http", root_path: str = "",
         api_key: str | None = KEY, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int | str, bool]:
    """(status or websocket close, whether the wrapped app ran) of one request through the guard;
    ``headers`` (raw ASGI header pairs) replace the ``Authorization: Bearer <key>`` one."""
    ran = []

    async def app(scope, receive, send):
        ran.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    if headers is None:
        headers = [(b"authorization", f"Bearer {key}".encode())] if key is not None else []
    scope = {"type": kind, "path": path, "method": method, "headers": headers, "root_path": root_path}
    first = exchange(RequireApiKey(app, api_key=api_key), scope)[0]
    return (first.get("status") or first.get("type")), bool(ran)


def exchange(guard, scope: dict) -> list[dict]:
    """The ASGI messages ``guard`` (an ASGI app, e.g. ``RequireApiKey(app, ...)``) sends for one body-less
    request ``scope``."""
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    loop = asyncio.new_event_loop()  # not asyncio.run: it clears the thread's loop, which Pulumi's mocks use
    try:
        loop.run_until_complete(guard(scope, receive, send))
    finally:
        loop.close()
    return sent


@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/chat/completions", "/ping", "/version", "/openapi.json",
                                  "/docs", "/scale_elastic_ep", "/abort_requests", "/anything/new"])
def test_every_route_needs_the_key(path):
    assert call(path) == (401, False)
    assert call(path, key="wrong") == (401, False)
    assert call(path, key=KEY) == (200, True)


def _auth(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", v.encode("latin-1")) for v in values]


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(_auth(f"Bearer {KEY}xyz"), id="key-then-more"),
        pytest.param(_auth(f"Bearer {KEY[:-1]}"), id="key-minus-last-char"),
        pytest.param(_auth(f"Bearer {KEY[:1]}"), id="first-char-only"),
        pytest.param(_auth(f"Bearer x{KEY}"), id="more-then-key"),
        pytest.param(_auth(f"Bearer {KEY.upper()}"), id="key-in-upper-case"),
        pytest.param(_auth(f"Bearer {KEY} {KEY}"), id="key-twice"),
        pytest.param(_auth(f"Bearer {KEY} extra"), id="key-then-a-word"),
        pytest.param(_auth(f"Bearer\t{KEY}"), id="tab-not-space"),
        pytest.param(_auth(f"Bearer{KEY}"), id="no-space"),
        pytest.param(_auth(f"Basic {KEY}"), id="basic-scheme"),
        pytest.param(_auth(f"Token {KEY}"), id="token-scheme"),
        pytest.param(_auth(f"Bearer-{KEY}"), id="scheme-glued"),
        pytest.param(_auth(KEY), id="key-without-scheme"),
        pytest.param(_auth("Bearer "), id="empty-token"),
        pytest.param(_auth("Bearer"), id="scheme-only"),
        pytest.param(_auth(""), id="empty-header"),
        pytest.param([(b"x-api-key", KEY.encode())], id="key-in-another-header"),
        pytest.param([(b"authorization-x", f"Bearer {KEY}".encode())], id="header-name-with-a-suffix"),
        pytest.param(_auth("Bearer wrong", f"Bearer {KEY}"), id="first-of-two-headers-wrong"),
    ],
)
def test_near_misses_of_the_key_are_refused(headers):
    """Anything but the key itself after the Bearer scheme is refused: a prefix, a suffix, another
    case, another scheme or header, nothing at all (a guard that compared prefixes, ignored case or
    took the last header would pass one of these)."""
    assert call("/v1/chat/completions", headers=headers) == (401, False)
    assert call("/invocations", headers=headers) == (401, False)


@pytest.mark.parametrize(
    "value",
    [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"Bearer  {KEY}", f"Bearer {KEY} "],
    ids=["exact", "scheme-lower-case", "scheme-upper-case", "two-spaces", "trailing-space"],
)
def test_the_key_is_accepted_as_http_allows_writing_it(value):
    """RFC 7235 section 2.1: the scheme is case-insensitive; RFC 6750 section 2.1: ``Bearer 1*SP
    token``; header values lose surrounding whitespace (RFC 9110 section 5.5)."""
    assert call("/v1/chat/completions", headers=_auth(value)) == (200, True)


def test_health_and_metrics_are_open_and_nothing_else():
    assert OPEN_PATHS == set(API_OPEN_PATHS) == {"/health", "/metrics"}
    for path in OPEN_PATHS:
        assert call(path, method="GET") == (200, True)
    assert call("/health/extra", method="GET") == (401, False)  # exact paths, not prefixes


def test_preflight_root_path_websocket_and_no_key():
    assert call("/invocations", method="OPTIONS") == (200, True)  # CORS preflight passes, as in vLLM's middleware
    assert call("/api/health", root_path="/api", method="GET") == (200, True)
    assert call("/api/invocations", root_path="/api") == (401, False)
    assert call("/v1/realtime", kind="websocket") == ("websocket.close", False)


@pytest.mark.parametrize("api_key", ["", "x" * (MIN_API_KEY_CHARS - 1), None], ids=["empty", "one-short", "unset"])
def test_no_usable_key_fails_closed(api_key, monkeypatch):
    """An empty, short or unset key opens nothing: every route, the probes' too, gets 503 and the
    wrapped app never runs (the old guard let every request through on an empty key)."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for path in ("/invocations", "/v1/chat/completions", "/health"):
        assert call(path, api_key=api_key) == (503, False)
        assert call(path, api_key=api_key, key=api_key or "") == (503, False)
    assert call("/v1/realtime", kind="websocket", api_key=api_key) == ("websocket.close", False)
    assert call("/invocations", api_key="x" * MIN_API_KEY_CHARS, key="x" * MIN_API_KEY_CHARS) == (200, True)


def _lifespan(api_key: str) -> list[dict]:
    """The messages the guard sends for a lifespan startup (what uvicorn reads)."""
    sent: list[dict] = []
    inbox = [{"type": "lifespan.startup"}]

    async def app(scope, receive, send):
        await receive()
        await send({"type": "lifespan.startup.complete"})

    async def send(message):
        sent.append(message)

    async def receive():
        return inbox.pop(0)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(RequireApiKey(app, api_key=api_key)({"type": "lifespan"}, receive, send))
    finally:
        loop.close()
    return sent


def test_lifespan_startup_fails_with_a_reason_that_never_shows_the_key():
    short = "q7Zr" * 3  # 12 characters
    (failed,) = _lifespan(short)
    assert failed["type"] == "lifespan.startup.failed"
    assert "VLLM_API_KEY" in failed["message"] and str(MIN_API_KEY_CHARS) in failed["message"]
    assert short not in failed["message"]
    assert "empty" in _lifespan("")[0]["message"]
    assert _lifespan(KEY) == [{"type": "lifespan.startup.complete"}]


def test_the_minimum_is_one_figure():
    from components.core.config.raw import API_KEY_MIN_CHARS

    assert MIN_API_KEY_CHARS == API_KEY_MIN_CHARS == 15


def test_the_guard_reads_the_key_from_vllm_api_key(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert call("/invocations", key=KEY, api_key=None) == (200, True)
    assert call("/invocations", api_key=None) == (401, False)


def test_the_guard_is_standard_library_only():
    """It runs inside the vLLM image with whatever packages that has: nothing beyond the stdlib."""
    import ast
    import sys

    tree = ast.parse(API_GUARD_SOURCE.read_text())
    imported = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


@pytest.mark.parametrize("stack", STACKS)
def test_every_serving_role_loads_the_guard_and_no_worker_does(stack):
    from components.core.vllm import build_vllm_command

    spec = plan_for(stack).context.spec
    for role in build_vllm_command(spec).roles:
        argv = list(role.argv)
        if role.serves_http:
            assert argv[argv.index("--middleware") + 1] == API_GUARD_MIDDLEWARE
            assert role.env["PYTHONPATH"] == API_GUARD_CONTAINER_DIR
        else:
            assert "--middleware" not in argv and "PYTHONPATH" not in role.env


def _k8s(run, kind):
    return [r for r in run.resources if r.type == f"kubernetes:{kind}"]


# The stacks whose workloads run on Kubernetes (the EC2 one: test_ec2_fetches_verifies_and_mounts_the_guard).
K8S_STACKS = [s for s in STACKS if load_stack(s).platform != "aws-ec2"]


def test_every_platform_is_covered():
    assert K8S_STACKS and len(K8S_STACKS) < len(STACKS)


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_kubernetes_pods_mount_the_guard_from_an_immutable_configmap(stack):
    run = plan_for(stack)
    assert _k8s(run, "core/v1:Namespace")
    maps = [r for r in _k8s(run, "core/v1:ConfigMap") if API_GUARD_FILENAME in (r.inputs.get("data") or {})]
    assert len(maps) == 1
    cm = maps[0].inputs
    assert cm["data"][API_GUARD_FILENAME] == API_GUARD_SOURCE.read_text() and cm["immutable"] is True
    name = cm["metadata"]["name"]
    workloads = [r for r in run.resources if r.inputs.get("kind") in ("Deployment", "LeaderWorkerSet")]
    templates = []
    for w in workloads:
        spec = w.inputs["spec"]
        templates += [spec["template"]] if "template" in spec else [
            spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]
    serving = 0
    for template in templates:
        pod = template["spec"]
        vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
        mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
        if "--middleware" in vllm["command"]:
            serving += 1
            mount = mounts[API_GUARD_CONTAINER_DIR]
            assert mount["readOnly"] is True
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert volume["configMap"]["name"] == name
        else:
            assert API_GUARD_CONTAINER_DIR not in mounts
    assert serving >= 1


def test_ec2_fetches_verifies_and_mounts_the_guard():
    import base64

    import yaml

    from components.aws.userdata import API_GUARD_HOST_DIR, VLLM_SCRIPT

    text = base64.b64decode(plan_for("b300").named("gpu-lt").inputs["userData"]).decode()
    run_vllm = {f["path"]: f["content"] for f in yaml.safe_load(text)["write_files"]}[VLLM_SCRIPT]
    sha = hashlib.sha256(API_GUARD_SOURCE.read_text().encode()).hexdigest()
    fetch, docker = run_vllm.index(sha), run_vllm.index("exec docker run")
    assert fetch < docker and f"_tools/{API_GUARD_FILENAME}" in run_vllm and "sha256sum -c" in run_vllm
    assert f"-v {API_GUARD_HOST_DIR}:{API_GUARD_CONTAINER_DIR}:ro" in run_vllm
    run = plan_for("b300")
    uploads = [r for r in run.resources if r.type == "aws:s3/bucketObjectv2:BucketObjectv2"
               and str(r.inputs.get("key", "")).endswith(API_GUARD_FILENAME)]
    assert len(uploads) == 1 and uploads[0].inputs["content"] == API_GUARD_SOURCE.read_text()
    assert json.dumps(uploads[0].inputs["key"]) == json.dumps(f"_tools/{API_GUARD_FILENAME}")


@pytest.mark.parametrize("key", ["", "x" * (MIN_API_KEY_CHARS - 1)], ids=["empty", "one-short"])
def test_the_pinned_vllm_server_exits_at_start_without_a_usable_key(key):
    """vLLM's own app and serve_http (uvicorn's default lifespan "auto", which swallows an exception
    raised while the middleware is built): the guard's failed lifespan startup stops the server with
    uvicorn's startup-failure status 3 and the guard's reason in the log; the old guard served."""
    import os
    import subprocess

    from components.core.vllm import build_vllm_command
    from tests.conftest import REPO_ROOT
    from tests.vllm_contract import require_vllm_python

    python = require_vllm_python()
    server = next(r for r in build_vllm_command(plan_for("b300").context.spec).roles if r.serves_http)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), str(REPO_ROOT / "tests" / "vllm_guard_startup_probe.py")],
                          input=json.dumps({"argv": list(server.argv[2:]), "key": key}),
                          env={**env, "PYTHONPATH": str(API_GUARD_SOURCE.parent)}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert "served" not in proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "VLLM_API_KEY" in proc.stderr and "refusing to serve" in proc.stderr


@pytest.mark.parametrize("value", ["", "k" * (MIN_API_KEY_CHARS - 1)], ids=["empty", "one-short"])
def test_pulumi_up_refuses_an_empty_or_short_api_key_without_showing_it(value):
    """The program's config read (`pulumi up`, decrypted secrets) refuses the key in one line that
    names the key and the minimum, never the value; the old reader passed an empty key on as an
    empty Secret (every route open) and any short one."""
    from components.core.config.reader import SECURE_PLACEHOLDER, read_config_strings
    from components.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        read_config_strings({"kimi-deploy:apiKey": value}, {"kimi-deploy:apiKey"})
    message = str(err.value)
    assert message.startswith("kimi-deploy:apiKey: '[secret]' ") and str(MIN_API_KEY_CHARS) in message
    assert "\n" not in message and (not value or value not in message)
    _, secrets = read_config_strings({"kimi-deploy:apiKey": "k" * MIN_API_KEY_CHARS}, {"kimi-deploy:apiKey"})
    assert secrets == {"apiKey"}
    # Offline the plan sees only the placeholder of an encrypted value: nothing to measure.
    assert read_config_strings({"kimi-deploy:apiKey": SECURE_PLACEHOLDER}, {"kimi-deploy:apiKey"})[1] == {"apiKey"}
