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
from tests.openai_test_server import DEFAULT_API_KEY, FACT_RE, FRONT_FAULTS, K31_EFFORTS, MISBEHAVIOURS, OpenAITestServer

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "kimi-k3.1-pro"
# Small but real: a 4,608-token haystack (twice the 2,304 tokens a fact must keep from the question), 8 short
# streams at concurrency 4, 20 agent turns, a 200-token note, and a 2 s stream-silence limit (the
# hold-tool-calls fault holds a call 3 s; a loaded test machine can stall a stream for a fraction of that).
FAST = dict(needle_tokens=4608, concurrency=4, requests=8, max_tokens=24, prompt_tokens=256, tool_turns=20,
            silence_probe_tokens=200, max_stream_silence_seconds=2.0)

EXPECTED_FAILURE = {
    "merge-tool-calls": "parallel-tools",
    "stream-merge-tool-calls": "stream-tools",
    "hold-tool-calls": "stream-silence",
    "concurrent-mixup": "concurrent-tools",
    "ignore-tool-choice": "tool-choice",
    "unforced-required": "tool-choice",
    "repeat-tool-ids": "tool-ids",
    "lose-tool-calls": "tool-reliability",
    "drop-reasoning": "round-trip",
    "drop-short-reasoning": "round-trip",
    "ignore-effort": "reasoning-effort",
    "noisy-effort": "reasoning-effort",
    "k3-efforts": "reasoning-effort",
    "miss-needle": "needle",
    "recall-recent-only": "needle",
    "reject-effort": "reasoning-effort",
    "error-stream": "throughput",
}


def run(server: OpenAITestServer, **overrides):
    opts = Options(model=MODEL, **{**FAST, **overrides})
    return {r.name: r for r in run_checks(make_client(server.base_url, server.api_key or "EMPTY", 30), opts)}


def test_every_misbehaviour_has_a_check():
    assert set(EXPECTED_FAILURE) == set(MISBEHAVIOURS)
    assert set(EXPECTED_FAILURE.values()) <= set(CHECKS)
    # The front faults are not a check's: each has its own test below (one line, no traceback; auth).
    assert set(FRONT_FAULTS) == {"html-models", "models-without-data", "empty-choices", "refuse-methods-501",
                                 "refuse-methods-405"}


def test_well_behaved_server_passes_everything():
    with OpenAITestServer() as server:
        results = run(server)
        bodies = list(server.requests)
    assert {n: r.status for n, r in results.items()} == {n: "pass" for n in CHECKS}, {n: r.reason for n, r in results.items()}
    # reasoning_effort travels as a top-level field: K3.1's four levels, the same five prompts each.
    efforts = [(b["reasoning_effort"], b["messages"][-1]["content"]) for b in bodies if "reasoning_effort" in b]
    assert sorted({e for e, _ in efforts}) == sorted(K31_EFFORTS) and len(efforts) == 4 * validate.DEFAULT_EFFORT_SAMPLES
    assert all(len({p for e, p in efforts if e == level}) == validate.DEFAULT_EFFORT_SAMPLES for level in K31_EFFORTS)
    # The round trip sends back the whole assistant message: content, the reasoning (under the field
    # the server used and the documented reasoning_content), tool_calls.
    turn2 = next(b for b in bodies if b["messages"][-1]["role"] == "tool")
    assistant = turn2["messages"][1]
    assert assistant["role"] == "assistant" and assistant["tool_calls"]
    assert assistant["reasoning_content"] == assistant["reasoning"] and assistant["reasoning"]
    assert "content" in assistant
    assert turn2["messages"][-1]["tool_call_id"] == assistant["tool_calls"][0]["id"]
    # The needle's facts are in what the server received, once each, all before the last 2,048 tokens.
    needle_body = next(b for b in bodies if "What is the code of each vault?" in b["messages"][-1]["content"])
    text = needle_body["messages"][-1]["content"]
    facts = list(FACT_RE.finditer(text))
    assert len(facts) == validate.DEFAULT_NEEDLE_FACTS and len({f.group(1) for f in facts}) == len(facts)
    assert all(len(text) - f.start() > 2_048 * 4 for f in facts)  # 4 characters per token on this server
    # Streams ask for usage; throughput figures are there for cost.py.
    streams = [b for b in bodies if b.get("stream") and not b.get("tools")]
    # stream-tools: a single and a two-call request; concurrent-tools: one stream per worker.
    # stream-silence: one; tool-reliability: the turns of its streamed (odd-numbered) conversations.
    tool_streams = [b for b in bodies if b.get("stream") and b.get("tools")]
    assert len(tool_streams) == 2 + 1 + FAST["concurrency"] + FAST["tool_turns"] // 2
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
    with OpenAITestServer(max_model_len=4_096) as server:  # too short for any haystack outside the window
        short = run(server, checks=("needle",))["needle"]
    assert short.status == "fail" and "--needle-tokens" not in short.reason and "needs 6,656" in short.reason
    assert sent == []  # decided from /v1/models, nothing sent


def test_requests_fit_a_short_max_model_len():
    """Every output budget fits the served context (vLLM refuses max_tokens > max_model_len)."""
    with OpenAITestServer(max_model_len=8_192) as server:
        results = run(server, needle_tokens=4_608)  # twice K3.1's 2,048-token window + margin
        budgets = [b["max_tokens"] for b in server.requests]
    assert {n: r.status for n, r in results.items()} == {n: "pass" for n in CHECKS}, {n: r.reason for n, r in results.items()}
    assert max(budgets) < 8_192 <= validate.CHECK_MAX_TOKENS


def test_full_128k_haystack_reaches_the_server():
    with OpenAITestServer() as server:
        result = run(server, checks=("needle",), needle_tokens=131_072)["needle"]
        received = server.requests[-1]["messages"][-1]["content"]
    assert result.status == "pass" and len(FACT_RE.findall(received)) == validate.DEFAULT_NEEDLE_FACTS
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
        assert statuses == {n: "pass" if n in ("tools", "throughput") else "skip" for n in CHECKS}
        wrong_key = _cli(*base, env={**os.environ, "VLLM_API_KEY": "nope"})
        assert wrong_key.returncode == 1 and "HTTP 401" in wrong_key.stdout
    unset = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--api-key-env", "NO_SUCH_VAR_123")
    assert unset.returncode == 2 and unset.stderr.startswith("error: --api-key-env") and "Traceback" not in unset.stderr
    bad = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--checks", "tools,bogus")
    assert bad.returncode == 2 and "--checks" in bad.stderr
    helptext = _cli("--help")
    for flag in ("--base-url", "--model", "--api-key-env", "--checks", "--json", "--needle-tokens", "--needle-facts",
                 "--concurrency", "--requests", "--max-tokens", "--timeout-seconds", "--min-output-tps",
                 "--max-ttft-p95-seconds", "--effort-samples", "--tool-turns", "--max-tool-loss-rate",
                 "--max-stream-silence-seconds", "--silence-probe-tokens"):
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


# --- tool_choice, stream silence, tool-call reliability, effort distributions, far facts ----------


def test_tool_choice_none_required_and_named_are_each_sent_and_checked():
    with OpenAITestServer() as server:
        good = run(server, checks=("tool-choice",))["tool-choice"]
        sent = [b.get("tool_choice") for b in server.requests if b.get("tools")]
    assert good.status == "pass", good.reason
    assert sent == ["none", "required", {"type": "function", "function": {"name": "get_time"}}]
    assert good.metrics["replies"]["named get_time"]["calls"] == ["get_time"]
    with OpenAITestServer(misbehave={"ignore-tool-choice"}) as server:
        ignored = run(server, checks=("tool-choice",))["tool-choice"]
    assert ignored.status == "fail" and ignored.reason.startswith("none: 1 tool call(s) (get_weather)")
    assert any("named get_time: called get_weather" in p for p in ignored.metrics["problems"])
    with OpenAITestServer(misbehave={"unforced-required"}) as server:
        unforced = run(server, checks=("tool-choice",))["tool-choice"]
    assert unforced.status == "fail" and unforced.reason.startswith("required: no tool_calls")
    assert "VLLM_ENFORCE_STRICT_TOOL_CALLING" in unforced.reason


def test_a_call_held_back_past_the_limit_fails_and_keep_alive_comments_count_as_bytes():
    with OpenAITestServer(misbehave={"hold-tool-calls"}, hold_seconds=3.0) as server:
        held = run(server, checks=("stream-silence",))["stream-silence"]
    assert held.status == "fail" and held.metrics["longest_silence_seconds"] >= 3.0
    assert "before the save_note call, which then arrived whole" in held.reason and held.metrics["call_deltas"] == 1
    assert "--sse-keep-alive-interval" in held.reason and "2 s idle" in held.reason
    # The same hold with SSE comments every 0.2 s: a proxy sees bytes, so the stream is not silent.
    with OpenAITestServer(misbehave={"hold-tool-calls"}, hold_seconds=3.0, keep_alive_seconds=0.2) as server:
        kept = run(server, checks=("stream-silence",))["stream-silence"]
        note = server.requests[-1]["messages"][-1]["content"]
    assert kept.status == "pass", kept.reason
    assert kept.metrics["keep_alive_comments"] >= 10 and kept.metrics["longest_silence_seconds"] < 2.0
    # The probe's note is about --silence-probe-tokens long in the server's tokens (4 characters each here).
    assert abs(len(note.split("Note: ", 1)[1]) / 4 - FAST["silence_probe_tokens"]) < 40


def test_the_silence_limit_is_a_flag_with_a_proxy_default():
    assert validate.DEFAULT_MAX_STREAM_SILENCE_SECONDS == 60
    with OpenAITestServer(misbehave={"hold-tool-calls"}, hold_seconds=3.0) as server:
        result = run(server, checks=("stream-silence",), max_stream_silence_seconds=60.0)["stream-silence"]
    assert result.status == "pass" and result.metrics["longest_silence_seconds"] >= 3.0


def test_lost_tool_calls_are_counted_with_where_they_went_and_a_wilson_interval():
    with OpenAITestServer(misbehave={"lose-tool-calls"}) as server:
        result = run(server, checks=("tool-reliability",))["tool-reliability"]
        agent = [b for b in server.requests if b["messages"][0]["role"] == "system"]
    m = result.metrics
    assert result.status == "fail" and m["turns"] == FAST["tool_turns"] == len(agent)
    assert m["outcomes"] == {"ok": 18, "wrong": 0, "in-reasoning": 1, "in-content": 1, "missing": 0}
    assert m["loss_rate"] == 0.1 and m["loss_rate_ci95"] == [0.0279, 0.3010]
    assert "2 of 20 agent turns lost their call (1 in-reasoning, 1 in-content" in result.reason
    # Agent-style: conversations grow with each tool result, half of them streamed.
    assert max(len(b["messages"]) for b in agent) > 10 and {bool(b.get("stream")) for b in agent} == {True, False}
    with OpenAITestServer(misbehave={"lose-tool-calls"}) as server:
        tolerant = run(server, checks=("tool-reliability",), max_tool_loss_rate=0.2)["tool-reliability"]
    assert tolerant.status == "pass" and "10.0% lost (95% CI 2.8%-30.1%)" in tolerant.reason


def test_a_noisy_server_that_one_sample_per_level_would_pass_fails_the_distribution_check():
    with OpenAITestServer(misbehave={"noisy-effort"}) as server:
        result = run(server, checks=("reasoning-effort",))["reasoning-effort"]
    values = result.metrics["values"]
    assert values["max"][0] > values["low"][0]  # one sample each (the old verdict) would say max reasons more
    assert result.status == "fail" and result.metrics["p_value"] > validate.EFFORT_ALPHA
    assert "beyond chance" in result.reason and "p = " in result.reason
    with OpenAITestServer() as server:
        good = run(server, checks=("reasoning-effort",))["reasoning-effort"]
    assert good.status == "pass" and good.metrics["p_value"] == round(1 / 252, 5)
    assert good.metrics["medians"]["low"] < good.metrics["medians"]["medium"] < good.metrics["medians"]["max"]


def test_a_server_without_k31_levels_is_named_as_older_than_the_pin():
    with OpenAITestServer(misbehave={"k3-efforts"}) as server:
        result = run(server, checks=("reasoning-effort",))["reasoning-effort"]
    assert result.status == "fail" and result.reason.startswith("reasoning_effort 'medium' rejected: HTTP 400")
    assert "vLLM's renderer accepts from 0.34.0 on" in result.reason


def test_facts_far_outside_the_sparse_window_must_all_come_back():
    with OpenAITestServer(misbehave={"recall-recent-only"}) as server:
        result = run(server, checks=("needle",), needle_facts=3)["needle"]
    assert result.status == "fail" and result.reason.startswith("3 of 3 facts not recalled")
    assert all(d > 2_048 for d in result.metrics["tokens_before_question"])
    assert validate.needle_depths(4_096, 4, 2_304) == [0.02, 0.1592, 0.2983, 0.4375]
    assert validate.needle_depths(4_096, 4, 4_096) == []
    proc = _cli("--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--needle-tokens", "4000")
    _one_line_usage_error(proc, "--needle-tokens", "pass at least 4,608")


# --- not OpenAI's shape; methods refused before the key is checked ----------------------------------


@pytest.mark.parametrize(("fault", "what"), [
    ("html-models", "answered 200 with an HTML page ('Grafana')"),
    ("models-without-data", "answered 200 with JSON with keys status, version but no `data` list"),
])
def test_a_200_that_is_not_a_model_list_is_one_line_naming_the_url(fault, what):
    with OpenAITestServer(misbehave={fault}) as server:
        with_v1 = _cli("--base-url", server.base_url, "--model", MODEL)
        root = _cli("--base-url", server.base_url.removesuffix("/v1"), "--model", MODEL, "--json")
    for proc, url in ((with_v1, server.base_url), (root, server.base_url.removesuffix("/v1"))):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: GET {url}/models {what}"), proc.stderr
    assert "is this the vLLM server's port" in with_v1.stderr and "should --base-url end in /v1?" in root.stderr
    assert json.loads(root.stdout)["ok"] is False


def test_empty_choices_fail_each_check_in_one_line_without_a_traceback():
    with OpenAITestServer(misbehave={"empty-choices"}) as server:
        proc = _cli("--base-url", server.base_url, "--model", MODEL, "--checks", "tools,round-trip,reasoning-effort,needle",
                    "--needle-tokens", "4608", "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    for name in ("tools", "round-trip", "reasoning-effort", "needle"):
        assert checks[name]["status"] == "fail" and "answered 200 with an empty choices list" in checks[name]["reason"]
        assert f"{server.base_url}/chat/completions" in checks[name]["reason"]


@pytest.mark.parametrize("fault", ["refuse-methods-501", "refuse-methods-405"])
def test_methods_refused_before_auth_are_confirmed_not_counted_open(fault):
    with OpenAITestServer(misbehave={fault}) as server:
        guarded = run(server, checks=("auth",))["auth"]
        unkeyed = [(m, p) for m, p, key in server.hits if not key]
    assert guarded.status == "pass", guarded.reason
    assert guarded.metrics["open_routes"] == [] and len(guarded.metrics["confirmed_with_own_method"]) >= 20
    # The confirming request carries a body that cannot run: malformed JSON, refused before the handler.
    assert ("POST", "/v1/chat/completions") in unkeyed
    with OpenAITestServer(api_key="", misbehave={fault}) as server:
        open_server = run(server, checks=("auth",))["auth"]
    assert open_server.status == "fail" and {"/v1/chat/completions", "/invocations"} <= set(open_server.metrics["open_routes"])


def test_statistics_against_known_values():
    from scripts.ops.validating.stats import median, rank_sum_test, wilson_interval

    low, high = wilson_interval(5, 100)
    assert (round(low, 4), round(high, 4)) == (0.0215, 0.1118)  # the textbook Wilson interval of 5/100
    assert wilson_interval(0, 100)[0] == 0.0 and round(wilson_interval(0, 100)[1], 4) == 0.037
    assert rank_sum_test([5, 6, 7, 8, 9], [0, 1, 2, 3, 4]).p_value == 1 / 252  # total separation, 5 each
    assert rank_sum_test([1, 1, 1], [1, 1, 1]).p_value == 1.0
    tie = rank_sum_test([2, 3], [1, 2])  # mid-ranks: U = 3.5 of 4; 2 of the 6 relabellings reach it
    assert tie.u_statistic == 3.5 and tie.p_value == 2 / 6 and tie.exact
    big = rank_sum_test(list(range(11, 22)), list(range(11)))  # C(22, 11) > EXACT_LIMIT: Monte Carlo
    assert not big.exact and big.p_value < 1e-3
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_a_finish_reason_on_the_last_call_delta_is_read():
    """vLLM 0.34.0 may send the last tool call and the finish reason in one chunk (no empty finish delta)."""
    with OpenAITestServer(finish_with_last_call=True) as server:
        results = run(server, checks=("stream-tools", "stream-silence", "concurrent-tools", "tool-reliability"))
    assert {n: results[n].status for n in ("stream-tools", "stream-silence", "concurrent-tools", "tool-reliability")} == {
        "stream-tools": "pass", "stream-silence": "pass", "concurrent-tools": "pass", "tool-reliability": "pass"}, {
        n: r.reason for n, r in results.items()}


# --- redirects and error bodies ----------------------------------------------------------------------


class _Recorder:
    """Two plain HTTP servers on 127.0.0.1: ``front`` lists the model and answers every other request
    with ``status`` (a redirect to ``elsewhere``, or an error with a body); ``elsewhere`` records
    what reaches it (a redirect followed with the key would arrive there)."""

    def __init__(self, status: int):
        import http.server
        import threading

        self.elsewhere_hits: list[dict[str, str]] = []
        recorder = self

        class Elsewhere(http.server.BaseHTTPRequestHandler):
            def _any(self):
                recorder.elsewhere_hits.append(dict(self.headers))
                self.send_response(200)
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args):
                pass

        class Front(http.server.BaseHTTPRequestHandler):
            def _any(self):
                if self.command == "GET" and self.path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                elif status == 302:
                    body = b""
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{recorder.elsewhere.server_port}/steal")
                else:
                    body = b'{"error": "engine dead: CUDA error"}'
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args):
                pass

        self.front = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
        self.elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
        for server in (self.front, self.elsewhere):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.front.server_port}/v1"

    def close(self):
        for server in (self.front, self.elsewhere):
            server.shutdown()
            server.server_close()


def test_a_redirect_is_reported_and_never_followed_with_the_key():
    """New-user trial: a 302 was followed (the POST turned into a GET) and blamed on the server's
    flags; urllib's auth probe would have sent the key to wherever it pointed."""
    recorder = _Recorder(302)
    try:
        proc = _cli("--base-url", recorder.base_url, "--model", MODEL, "--checks", "auth,tools", "--json")
    finally:
        recorder.close()
    assert "Traceback" not in proc.stderr, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["tools"]["status"] == "fail" and "HTTP 302, a redirect to http://127.0.0.1:" in checks["tools"]["reason"]
    assert "does not follow it" in checks["tools"]["reason"]
    assert recorder.elsewhere_hits == []  # nothing followed the redirect, with or without the key


def test_an_error_status_shows_the_start_of_the_servers_body():
    recorder = _Recorder(500)
    try:
        proc = _cli("--base-url", recorder.base_url, "--model", MODEL, "--checks", "tools", "--json")
    finally:
        recorder.close()
    tools = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["tools"]
    assert tools["status"] == "fail" and "HTTP 500: engine dead: CUDA error" in tools["reason"], tools
