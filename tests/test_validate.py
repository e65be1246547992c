"""scripts/ops/validate.py against the local OpenAI-compatible test server, for the faults the real
engine cannot be made to show (the real engine, well configured and misconfigured:
tests/test_real_engine.py): a well-behaved server passes every check; each misbehaviour fails the
matching check and only that one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.ops import validate
from scripts.ops.validate import CHECKS, Options, make_client, run_checks
from tests.openai_test_server import DEFAULT_API_KEY, MISBEHAVIOURS, NEEDLE_RE, OpenAITestServer

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "kimi-k3.1-pro"
# Small but real: a 4k-token haystack, 8 short streams at concurrency 4.
FAST = dict(needle_tokens=4096, concurrency=4, requests=8, max_tokens=24, prompt_tokens=256)

EXPECTED_FAILURE = {
    "merge-tool-calls": "parallel-tools",
    "stream-merge-tool-calls": "stream-tools",
    "concurrent-mixup": "concurrent-tools",
    "repeat-tool-ids": "tool-ids",
    "drop-reasoning": "round-trip",
    "drop-short-reasoning": "round-trip",
    "ignore-effort": "reasoning-effort",
    "miss-needle": "needle",
    "reject-effort": "reasoning-effort",
    "error-stream": "throughput",
}


def run(server: OpenAITestServer, **overrides):
    opts = Options(model=MODEL, **{**FAST, **overrides})
    return {r.name: r for r in run_checks(make_client(server.base_url, server.api_key or "EMPTY", 30), opts)}


def test_every_misbehaviour_has_a_check():
    assert set(EXPECTED_FAILURE) == set(MISBEHAVIOURS)
    assert set(EXPECTED_FAILURE.values()) <= set(CHECKS)


def test_well_behaved_server_passes_everything():
    with OpenAITestServer() as server:
        results = run(server)
        bodies = list(server.requests)
    assert {n: r.status for n, r in results.items()} == {n: "pass" for n in CHECKS}, {n: r.reason for n, r in results.items()}
    # reasoning_effort travels as a top-level field.
    assert [b["reasoning_effort"] for b in bodies if "reasoning_effort" in b] == ["low", "high", "max"]
    # The round trip sends back the whole assistant message: content, the reasoning (under the field
    # the server used and the documented reasoning_content), tool_calls.
    turn2 = next(b for b in bodies if b["messages"][-1]["role"] == "tool")
    assistant = turn2["messages"][1]
    assert assistant["role"] == "assistant" and assistant["tool_calls"]
    assert assistant["reasoning_content"] == assistant["reasoning"] and assistant["reasoning"]
    assert "content" in assistant
    assert turn2["messages"][-1]["tool_call_id"] == assistant["tool_calls"][0]["id"]
    # The needle is in what the server received, once.
    needle_body = next(b for b in bodies if "passphrase for the vault mentioned" in b["messages"][-1]["content"])
    assert len(NEEDLE_RE.findall(needle_body["messages"][-1]["content"])) == 1
    # Streams ask for usage; throughput figures are there for cost.py.
    streams = [b for b in bodies if b.get("stream") and not b.get("tools")]
    # stream-tools: a single and a two-call request; concurrent-tools: one stream per worker.
    tool_streams = [b for b in bodies if b.get("stream") and b.get("tools")]
    assert len(tool_streams) == 2 + FAST["concurrency"]
    assert len(streams) == FAST["requests"] and all(b["stream_options"] == {"include_usage": True} for b in streams)
    metrics = results["throughput"].metrics
    assert metrics["output_tokens_per_second"] > 0 and metrics["ttft_p95_seconds"] >= metrics["ttft_p50_seconds"]
    assert metrics["concurrency"] == 4 and metrics["usage_reported"] is True


@pytest.mark.parametrize("misbehaviour", MISBEHAVIOURS)
def test_each_misbehaviour_fails_only_its_check(misbehaviour):
    with OpenAITestServer(misbehave={misbehaviour}) as server:
        results = run(server)
    failed = {n for n, r in results.items() if r.status == "fail"}
    assert failed == {EXPECTED_FAILURE[misbehaviour]}, {n: r.reason for n, r in results.items()}


def test_a_needle_the_served_context_cannot_hold_fails_naming_max_model_len():
    assert validate.DEFAULT_NEEDLE_TOKENS == 131_072
    with OpenAITestServer(max_model_len=16_384) as server:
        result = run(server, checks=("needle",), needle_tokens=validate.DEFAULT_NEEDLE_TOKENS)["needle"]
        sent = list(server.requests)
    assert result.status == "fail" and "--max-model-len" in result.reason and "--needle-tokens 14,336" in result.reason
    assert sent == []  # decided from /v1/models, nothing sent


def test_requests_fit_a_short_max_model_len():
    """Every output budget fits the served context (vLLM refuses max_tokens > max_model_len)."""
    with OpenAITestServer(max_model_len=4_096) as server:
        results = run(server, needle_tokens=1_024)
        budgets = [b["max_tokens"] for b in server.requests]
    assert {n: r.status for n, r in results.items()} == {n: "pass" for n in CHECKS}, {n: r.reason for n, r in results.items()}
    assert max(budgets) < 4_096 and validate.CHECK_MAX_TOKENS > 4_096


def test_full_128k_haystack_reaches_the_server():
    with OpenAITestServer() as server:
        result = run(server, checks=("needle",), needle_tokens=131_072)["needle"]
        received = server.requests[-1]["messages"][-1]["content"]
    assert result.status == "pass" and len(NEEDLE_RE.findall(received)) == 1
    # Sized in the server's own tokens (chars per token measured on it, about 4 for this server).
    assert abs(result.metrics["prompt_tokens"] - 131_072) < 131_072 * 0.01
    assert abs(result.metrics["chars_per_token"] - 4) < 0.1


def test_thresholds_fail_the_throughput_check():
    with OpenAITestServer() as server:
        result = run(server, checks=("throughput",), min_output_tps=1e9)["throughput"]
    assert result.status == "fail" and "--min-output-tps" in result.reason


def _cli(*args, env=None):
    import os

    env = env if env is not None else {**os.environ, "VLLM_API_KEY": DEFAULT_API_KEY}  # the fake server's key
    return subprocess.run([sys.executable, "scripts/ops/validate.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


def test_cli_json_api_key_and_exit_codes():
    import os

    with OpenAITestServer(api_key="sk-test-key") as server:
        env = {**os.environ, "MY_KEY": "sk-test-key"}
        base = [
            "--base-url",
            server.base_url,
            "--model",
            MODEL,
            "--checks",
            "tools,throughput",
            "--requests",
            "4",
            "--max-tokens",
            "8",
            "--json",
        ]
        ok = _cli(*base, "--api-key-env", "MY_KEY", env=env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        report = json.loads(ok.stdout)
        assert report["ok"] is True
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert statuses == {"tools": "pass", "throughput": "pass", "parallel-tools": "skip", "round-trip": "skip",
                            "reasoning-effort": "skip", "needle": "skip", "stream-tools": "skip", "concurrent-tools": "skip",
                            "tool-ids": "skip", "auth": "skip"}
        wrong_key = _cli(*base, env={**os.environ, "VLLM_API_KEY": "nope"})
        assert wrong_key.returncode == 1 and "HTTP 401" in wrong_key.stdout
    unset = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--api-key-env", "NO_SUCH_VAR_123")
    assert unset.returncode == 2 and unset.stderr.startswith("error: --api-key-env") and "Traceback" not in unset.stderr
    bad = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--checks", "tools,bogus")
    assert bad.returncode == 2 and "--checks" in bad.stderr
    helptext = _cli("--help")
    for flag in ("--base-url", "--model", "--api-key-env", "--checks", "--json", "--needle-tokens", "--concurrency",
                 "--requests", "--max-tokens", "--timeout-seconds", "--min-output-tps", "--max-ttft-p95-seconds"):
        assert flag in helptext.stdout


def test_unreachable_endpoint_fails_checks_without_crashing():
    results = run_checks(
        make_client("http://127.0.0.1:9/v1", "EMPTY", 2),
        Options(model=MODEL, checks=("tools",), **{k: v for k, v in FAST.items()}),
    )
    tools = {r.name: r for r in results}["tools"]
    assert tools.status == "fail" and "cannot connect" in tools.reason


# --- new-user trial defects: one-line usage errors, URL handling, fail fast ----------------------


def _one_line_usage_error(proc, *needles):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: ")
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_abbreviated_flags_are_rejected_and_values_never_echoed():
    # --api-key was taken as --api-key-env and the key echoed back in the error.
    out = _cli("--api-key", "sk-secret-123", "--base-url", "http://127.0.0.1:9/v1", "--model", MODEL)
    _one_line_usage_error(out, "--api-key", "--help")
    assert "sk-secret-123" not in out.stderr + out.stdout
    _one_line_usage_error(_cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--conc", "2"), "--conc")
    _one_line_usage_error(_cli("--model", MODEL), "--base-url")  # missing required flag: one line, no usage block


@pytest.mark.parametrize("url, needle", [("http://[::1", "Invalid IPv6 URL"), ("http://host:99999/v1", "Port"),
                                         ("ftp://host/v1", "http(s) URL"), ("http://exa mple/v1", "http(s) URL")])
def test_malformed_base_url_is_a_usage_error(url, needle):
    _one_line_usage_error(_cli("--base-url", url, "--model", MODEL), "--base-url", needle)


def test_password_in_base_url_is_masked_everywhere():
    assert validate.mask_url("http://user:pa55@h:8000/v1") == "http://user:***@h:8000/v1"
    assert validate.mask_url("http://h:8000/v1") == "http://h:8000/v1"
    assert validate.mask_url("http://token@h/v1") == "http://token@h/v1"  # no password part
    with OpenAITestServer(api_key="") as server:  # the URL's user:password goes out as Basic auth, not the key
        url = server.base_url.replace("http://", "http://user:pa55word@")
        base = ["--base-url", url, "--model", MODEL, "--checks", "tools"]
        as_json = _cli(*base, "--json")
        table = _cli(*base)
    assert as_json.returncode == 0 and table.returncode == 0, as_json.stderr + table.stderr
    assert json.loads(as_json.stdout)["base_url"] == url.replace("pa55word", "***")
    assert "pa55word" not in as_json.stdout + as_json.stderr + table.stdout + table.stderr
    assert "user:***@" in table.stdout


def test_dead_endpoint_fails_fast_with_one_reason():
    import time

    started = time.monotonic()
    out = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--json")
    assert time.monotonic() - started < 20
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("error: cannot connect to http://127.0.0.1:9/v1: ")
    report = json.loads(out.stdout)
    assert report["ok"] is False and report["error"].startswith("cannot connect to")
    assert {c["status"] for c in report["checks"]} == {"skip"}  # no check ran: one reason, not six failures


def test_probe_is_one_request_and_an_http_error_still_runs_the_checks():
    with OpenAITestServer(api_key="right") as server:
        assert validate.probe(make_client(server.base_url, "wrong", 30)) is None  # 401 answers: reachable
    assert "refused" in validate.probe(make_client("http://127.0.0.1:9/v1", "EMPTY", 30)).lower()


def test_a_base_url_without_v1_is_named_in_one_line():
    with OpenAITestServer() as server:
        root = server.base_url.removesuffix("/v1")
        proc = _cli("--base-url", root, "--model", MODEL, "--checks", "tools")
        right = _cli("--base-url", server.base_url, "--model", MODEL, "--checks", "tools")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "404" in proc.stderr and "should --base-url end in /v1?" in proc.stderr and "Traceback" not in proc.stderr
    assert right.returncode == 0, right.stdout + right.stderr


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        ({"calls": [], "content": "", "reasoning": "", "finish_reason": "stop"}, "no tool_calls"),
        (
            {
                "calls": [{"id": "a", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
                "content": "<|open|>tools<|sep|>",
                "reasoning": "",
                "finish_reason": "tool_calls",
            },
            "raw Kimi K3.1-Pro chat markup in the streamed content",
        ),
        (
            {
                "calls": [{"id": "a", "name": "get_weather", "arguments": ""}],
                "content": "",
                "reasoning": "",
                "finish_reason": "tool_calls",
            },
            "empty tool call",
        ),
        (
            {
                "calls": [{"id": "b", "name": "get_weather", "arguments": '{"city": "Paris"}{"city": "Tokyo"}'}],
                "content": "",
                "reasoning": "",
                "finish_reason": "tool_calls",
            },
            "merged calls",
        ),
    ],
)
def test_streamed_reply_problems_are_named(reply, needle):
    problem = validate.streamed_call_problem(reply, ("Paris", "Tokyo") if "merged" in needle else ("Paris",))
    assert problem and needle in problem


def test_short_reasoning_drop_is_caught_by_comparing_turn_2_with_and_without_it():
    """The tool result in turn 2 is bigger than the short reasoning: only the A/B comparison sees it."""
    with OpenAITestServer(misbehave={"drop-short-reasoning"}) as server:
        result = run(server, checks=("round-trip",))["round-trip"]
        turn2 = [b for b in server.requests if b["messages"][-1]["role"] == "tool"]
    assert result.status == "fail" and "drops the returned reasoning_content" in result.reason
    assert (
        len(turn2) == 2 and "reasoning_content" in turn2[0]["messages"][1] and "reasoning_content" not in turn2[1]["messages"][1]
    )
    assert result.metrics["reasoning_chars"] < 400


def test_auth_probes_every_route_without_running_it_and_names_a_missing_key():
    with OpenAITestServer() as server:
        guarded = run(server, checks=("auth",))["auth"]
        hits = [h for h in server.hits if not h[2]]
    assert guarded.status == "pass" and guarded.metrics["routes_probed"] >= len(validate.KNOWN_ENGINE_ROUTES) - 1
    # Without the key, only the two deliberate chat requests use a method the route accepts.
    accepted = [(m, p) for m, p, _ in hits if m in validate.KNOWN_ENGINE_ROUTES.get(p, ())]
    assert sorted(accepted) == [("POST", "/invocations"), ("POST", "/v1/chat/completions")]
    with OpenAITestServer(api_key="") as server:
        open_server = run(server, checks=("auth",))["auth"]
    assert open_server.status == "fail" and "VLLM_API_KEY" in open_server.reason
    assert open_server.reason.startswith("served inference without the API key on /v1/chat/completions, /invocations")
