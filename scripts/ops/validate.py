#!/usr/bin/env python3
"""Validate a deployed endpoint the way the model card asks before scaling up.

    python scripts/ops/validate.py --base-url http://10.0.1.23:8000/v1 --model kimi-k3.1-pro [--json]

Checks (``--checks`` picks some; all by default), built on the official ``openai`` client:
  tools             a request with tools returns tool_calls whose arguments are JSON matching the
                    schema, and no raw chat markup of the model profile in content or reasoning
  parallel-tools    a request that needs two calls gets two separate calls
  stream-tools      the same two requests streamed (as agents send them): tool_calls rebuilt from
                    the deltas are complete, separate, valid JSON, with no raw markup in the text
  stream-silence    a streamed call with a long argument (--silence-probe-tokens), read byte by
                    byte: the longest time without a byte must stay under --max-stream-silence-
                    seconds (a proxy's idle timeout; a parser that holds a call back until it
                    closes is silent for the whole argument)
  concurrent-tools  --concurrency streams with tools at once, one city each: every stream gets a
                    complete call for its own city
  tool-choice       tool_choice none gets no call, required gets at least one valid call, a named
                    function gets a call of that function (vLLM decides these outside the parser)
  round-trip        the complete assistant message (content, reasoning, tool_calls) goes back with
                    the tool results; the next turn succeeds and uses them; the same turn 2 sent
                    without the reasoning must count fewer prompt tokens (else the server drops it)
  tool-ids          a second tool turn in the same conversation gets ids that differ from the
                    first turn's (agents key tool results by id)
  tool-reliability  --tool-turns agent-style turns (conversations that grow with each tool result,
                    half of them streamed), each needing a call: the rate of turns whose call was
                    lost (into the reasoning, the content, or nowhere) with its 95% Wilson
                    interval; fails above --max-tool-loss-rate
  reasoning-effort  every reasoning_effort level of the model profile is accepted as a top-level
                    field, and over --effort-samples prompts per level the highest level reasons
                    more than the lowest by a one-sided rank test at p <= 0.01 (a server that
                    ignores the field passes with probability at most 1%)
  needle            --needle-facts facts spread through a long haystack (default 128k tokens), all
                    farther from the question than the model's sparse-attention window (K3.1's
                    top 2,048 tokens), asked for together: every one must come back; fails when
                    the served max_model_len cannot hold the haystack
  throughput        N concurrent streams: time to first token p50/p95, inter-token latency,
                    output tokens per second
  auth              without the API key, every route the server serves is refused (401/403) except
                    /health and /metrics: /v1, /invocations, /tokenize and the rest. Routes come from
                    the server's /openapi.json (read with the key), else a list of vLLM's; each is
                    probed with a method it does not accept, so nothing runs even where it is open;
                    an answer that cannot tell (405 or 501: a server may refuse a method before it
                    checks the key) is confirmed with the route's own method and a body that cannot
                    run (malformed JSON)
Request sizes follow the server: output budgets fit the max_model_len that /v1/models reports, and
prompt sizes in tokens use the server's own count (usage.prompt_tokens of two short probes).
Chat markup comes from the model profile (--model-profile; components/core/model.py), and each
failure names the server flag that most likely causes it.
Only the given base URL's server is contacted: first one GET /v1/models, so an endpoint that cannot
be reached fails at once with the reason (exit 1), a 404 there, or a 200 that is not OpenAI's model
list (an HTML page, JSON without ``data``: a proxy, a web UI, the wrong port), says in one line what
came back and that --base-url should probably end in /v1, and a model name the server does not
serve fails every check with the names it does serve. A reply that is not in OpenAI's shape (no
``choices``) fails its check in one line; nothing ends in a traceback. A password in the URL is
shown as ***.
Exit codes: 0 all passed, 1 a check failed or the endpoint cannot be reached, 2 usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import random
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.model import MODELS, ChatMarkup, ModelProfile
from components.core.naming import VLLM_CLIENT_SERVICE
from scripts.ops._cli import (
    EXIT_CHECK_FAILED,
    FAIL,
    PASS,
    SKIP,
    CliParser,
    UsageError,
    exit_code,
    one_line,
    print_json,
    print_table,
    prog_name,
    run_cli,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

CHECKS: tuple[str, ...] = (
    "tools", "parallel-tools", "stream-tools", "stream-silence", "concurrent-tools", "tool-choice", "round-trip",
    "tool-ids", "tool-reliability", "reasoning-effort", "needle", "throughput", "auth",
)
DEFAULT_API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_PROFILE = "kimi-k3.1-pro"
DEFAULT_NEEDLE_TOKENS = 128 * 1024
# Before the server's own count is known (estimate for English prose).
CHARS_PER_TOKEN = 4
# Output budget of the functional checks: room for the reasoning at the default effort (max),
# never more than the server's max_model_len leaves (fit_output_tokens).
CHECK_MAX_TOKENS = 8192
# Room the needle's answer (reasoning + the facts) needs besides the haystack.
NEEDLE_ANSWER_TOKENS = 2048
DEFAULT_NEEDLE_FACTS = 4
# No fact lies in the last sparse-attention window (ModelProfile.sparse_attention_tokens) plus this
# margin before the question (the question and the chat template's tail are in it too).
NEEDLE_WINDOW_MARGIN_TOKENS = 256
# A proxy's idle timeout: 60 s is the default of an AWS ALB (idle_timeout.timeout_seconds) and of
# nginx's proxy_read_timeout; a stream silent that long is cut.
DEFAULT_MAX_STREAM_SILENCE_SECONDS = 60.0
# The long argument of the stream-silence probe, in the server's tokens.
DEFAULT_SILENCE_PROBE_TOKENS = 1000
# Agent-style turns of the tool-reliability check and the loss rate it tolerates: at a 5% loss rate
# (public reports on K3 tool parsers) 100 turns lose at least 2 calls with probability 0.96.
DEFAULT_TOOL_TURNS = 100
DEFAULT_MAX_TOOL_LOSS_RATE = 0.01
TOOL_LOSS_CONFIDENCE = 0.95
# reasoning-effort: prompts per level, and the one-sided significance the lowest-vs-highest rank
# test must reach (five samples each: at least 24 of the 25 pairs ordered, p = 2/252).
DEFAULT_EFFORT_SAMPLES = 5
EFFORT_ALPHA = 0.01
# What the chat template adds around the messages, at most (estimate; vLLM clamps max_tokens to
# what the context leaves, vllm/entrypoints/serve/utils/api_utils.py get_max_tokens).
TEMPLATE_ALLOWANCE_TOKENS = 256

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather of one city.", "parameters": WEATHER_SCHEMA},
}
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current local time of one city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Paris"}},
        "required": ["city"], "additionalProperties": False}},
}
# The stream-silence probe's tool: one long string argument, copied from the prompt.
NOTE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "save_note", "description": "Save a note verbatim.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "description": "The note, verbatim"}},
        "required": ["text"], "additionalProperties": False}},
}

# Routes reachable without the key in a kimi-deploy server: the probes' health and Prometheus' scrape
# (scripts/node/kimi_vllm_api_guard.py OPEN_PATHS).
OPEN_PATHS: frozenset[str] = frozenset({"/health", "/metrics"})
# Inference routes of vLLM 0.33.0 (vllm/entrypoints/**/api_router.py), probed when the server does
# not publish /openapi.json (--disable-fastapi-docs). Method: the one each accepts.
KNOWN_ENGINE_ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",), "/v1/completions": ("POST",), "/v1/responses": ("POST",),
    "/v1/messages": ("POST",), "/v1/embeddings": ("POST",), "/inference/v1/generate": ("POST",),
    "/invocations": ("POST",), "/tokenize": ("POST",), "/detokenize": ("POST",), "/pooling": ("POST",),
    "/classify": ("POST",), "/score": ("POST",), "/rerank": ("POST",), "/v1/score": ("POST",), "/v1/rerank": ("POST",),
    "/v2/rerank": ("POST",), "/v2/embed": ("POST",), "/cohere/v2/chat": ("POST",), "/generative_scoring": ("POST",),
    "/abort_requests": ("POST",),
}
GUARD_FLAG = "--middleware kimi_vllm_api_guard.RequireApiKey"


@dataclass
class CheckResult:
    """One check's outcome.

    Attributes:
        name: the check (``CHECKS``).
        status: ``pass``, ``fail`` or ``skip``.
        reason: one line saying why.
        metrics: figures measured (latencies in seconds, throughput in tokens/s).
    """

    name: str
    status: str
    reason: str
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServerFacts:
    """What the server says about itself, learned once per run.

    Attributes:
        max_model_len: the served model's context in tokens (``/v1/models``), None when not reported.
        chars_per_token: characters of the validate prose per prompt token on this server (measured
            by ``measure_chars_per_token``), None until measured.
    """

    max_model_len: int | None = None
    chars_per_token: float | None = None


@dataclass(frozen=True)
class Options:
    """What to run and how hard (see ``--help``); ``facts`` is filled in by ``run_checks``."""

    model: str
    checks: tuple[str, ...] = CHECKS
    profile: str = DEFAULT_PROFILE
    needle_tokens: int = DEFAULT_NEEDLE_TOKENS
    needle_facts: int = DEFAULT_NEEDLE_FACTS
    concurrency: int = 8
    requests: int = 16
    max_tokens: int = 256
    prompt_tokens: int = 1024
    min_output_tps: float | None = None
    max_ttft_p95_seconds: float | None = None
    max_stream_silence_seconds: float = DEFAULT_MAX_STREAM_SILENCE_SECONDS
    silence_probe_tokens: int = DEFAULT_SILENCE_PROBE_TOKENS
    tool_turns: int = DEFAULT_TOOL_TURNS
    max_tool_loss_rate: float = DEFAULT_MAX_TOOL_LOSS_RATE
    effort_samples: int = DEFAULT_EFFORT_SAMPLES
    seed: int = 0
    api_key: str | None = None
    base_url: str | None = None
    timeout_seconds: float = 600
    facts: ServerFacts = field(default_factory=ServerFacts, compare=False)

    @property
    def model_profile(self) -> ModelProfile:
        return MODELS[self.profile]


class CheckFailed(Exception):
    """A check's request failed; ``str(err)`` is the one-line reason."""


# -- causes ------------------------------------------------------------------------------------


def markup_pattern(markup: ChatMarkup) -> re.Pattern[str]:
    """A regex matching any special token of the profile's chat format (with or without the
    spaces vLLM's detokenizer may put around added tokens)."""
    return re.compile("|".join(re.escape(t) for t in sorted(markup.special_tokens, key=len, reverse=True)))


def _channel(text: str, start: int, markup: ChatMarkup) -> str:
    """Which channel's markup sits at ``start``: ``reasoning``, ``tools`` or ``other``."""
    squeezed = re.sub(r"\s+", "", text[start : start + 64])
    for marker, name in ((markup.reasoning_open, "reasoning"), (markup.reasoning_close, "reasoning"),
                         (markup.tools_open, "tools"), (markup.tools_close, "tools")):
        if squeezed.startswith(marker):
            return name
    return "other"


def markup_leak(profile: ModelProfile, content: str | None, reasoning: str | None) -> str | None:
    """One line naming raw chat markup of ``profile`` found in the reply text and the server flag that
    should have consumed it, or None."""
    markup = profile.chat_markup
    pattern = markup_pattern(markup)
    for where, text in (("content", content or ""), ("reasoning", reasoning or "")):
        found = pattern.search(text)
        if not found:
            continue
        excerpt = one_line(text[found.start() : found.start() + 40])
        channel = _channel(text, found.start(), markup)
        if where == "reasoning":
            cause = (f"the reasoning parser does not know this format: is --reasoning-parser {profile.reasoning_parser} "
                     f"(and --tool-call-parser {profile.tool_call_parser}) set?")
        elif channel == "reasoning":
            cause = f"the reasoning channel was not parsed: is --reasoning-parser {profile.reasoning_parser} set?"
        elif channel == "tools":
            cause = (f"the tool calls were not parsed: are --enable-auto-tool-choice and --tool-call-parser "
                     f"{profile.tool_call_parser} set?")
        else:
            cause = (f"a parser does not know this format: are --tool-call-parser {profile.tool_call_parser} and "
                     f"--reasoning-parser {profile.reasoning_parser} set?")
        return f"raw {profile.display_name} chat markup in {where} ({excerpt!r}): {cause}"
    return None


def no_reasoning_cause(profile: ModelProfile) -> str:
    return f"is --reasoning-parser {profile.reasoning_parser} set?"


def _describe_error(err: Exception) -> str:
    import openai

    if isinstance(err, openai.APIStatusError):
        if 300 <= err.status_code < 400:
            return status_error_reason(err)
        # The client hands over the body's "error" member when there is one: a dict, or a plain string.
        message = err.body if isinstance(err.body, str) else ""
        body = err.body if isinstance(err.body, dict) else {}
        if isinstance(body.get("error"), dict):
            message = body["error"].get("message", "")
        elif body.get("message"):
            message = body["message"]
        elif isinstance(body.get("error"), str):
            message = body["error"]
        if not message and not body and err.response is not None and err.response.text:
            message = err.response.text
        text = f"HTTP {err.status_code}: {one_line(message or err.message)[:200]}"
        if err.status_code == 401:
            text += f" (the server wants an API key: set {DEFAULT_API_KEY_ENV} or --api-key-env)"
        elif err.status_code == 400 and "context length" in (message or "").lower():
            text += " (is the server's --max-model-len shorter than planned?)"
        return text
    if isinstance(err, openai.APITimeoutError):
        return "request timed out"
    if isinstance(err, openai.APIConnectionError):
        return f"cannot connect: {one_line(err.__cause__ or err)[:160]}"
    return f"{type(err).__name__}: {one_line(err)[:200]}"


# -- request sizes -------------------------------------------------------------------------------


def _prompt_chars(kwargs: dict[str, Any]) -> int:
    return len(json.dumps(kwargs.get("messages") or [])) + len(json.dumps(kwargs.get("tools") or []))


def fit_output_tokens(opts: Options, prompt_chars: int, wanted: int = CHECK_MAX_TOKENS) -> int:
    """``wanted`` output tokens, or less so that prompt + output fit the served ``max_model_len``.

    The prompt's size is bounded by its characters (a token is at least one byte of ASCII text)
    plus ``TEMPLATE_ALLOWANCE_TOKENS``; at least 16 tokens are always asked for."""
    limit = opts.facts.max_model_len
    if limit is None:
        return wanted
    cpt = opts.facts.chars_per_token or 1.0
    prompt_tokens = math.ceil(prompt_chars / max(cpt, 1.0)) + TEMPLATE_ALLOWANCE_TOKENS
    return max(16, min(wanted, limit - prompt_tokens))


def _excerpt(value: Any) -> str:
    """A short one-line view of what a server sent (a JSON body's keys, an HTML page's title)."""
    if isinstance(value, dict):
        return "JSON with keys " + (", ".join(sorted(str(k) for k in value)[:8]) or "(none)")
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode(errors="replace")
    text = str(value)
    title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    if title or re.match(r"\s*<(!doctype|html)", text, re.IGNORECASE):
        return f"an HTML page ({one_line(title.group(1))[:60]!r})" if title else "an HTML page"
    return repr(one_line(text)[:80])


def _reply_problem(resp: Any, url: str) -> str | None:
    """One line when a chat reply is not an OpenAI chat completion (no ``choices`` with a
    ``message``), naming the URL, what came back and the likely cause; else None."""
    choices = getattr(resp, "choices", None)
    if isinstance(choices, list) and choices and getattr(choices[0], "message", None) is not None:
        return None
    if isinstance(choices, list):
        what = "an empty choices list" if not choices else "choices without a message"
    else:
        extra = getattr(resp, "model_extra", None)
        what = _excerpt(extra if isinstance(extra, dict) and extra else resp)
    return (f"POST {url} answered 200 with {what}, not an OpenAI chat completion: is --base-url the vLLM server "
            "(its port, ending in /v1), not a proxy or another service?")


def _chat(client: Any, opts: Options, **kwargs: Any) -> Any:
    """One chat completion; a failed request or a reply that is not OpenAI's shape raises CheckFailed
    with the one-line reason (so every check can read ``resp.choices[0].message``)."""
    import openai

    if "max_tokens" not in kwargs:
        kwargs["max_tokens"] = fit_output_tokens(opts, _prompt_chars(kwargs))
    try:
        resp = client.chat.completions.create(model=opts.model, **kwargs)
    except openai.OpenAIError as err:
        raise CheckFailed(_describe_error(err)) from None
    problem = _reply_problem(resp, f"{mask_url(str(client.base_url)).rstrip('/')}/chat/completions")
    if problem:
        raise CheckFailed(problem)
    return resp


def served_models(client: Any) -> dict[str, int | None] | None:
    """``{model id: max_model_len or None}`` from ``/v1/models``, or None when it cannot be read."""
    out: dict[str, int | None] = {}
    try:
        for item in client.models.list().data:
            value = (item.model_extra or {}).get("max_model_len")
            out[str(item.id)] = int(value) if value else None
    except Exception:  # noqa: BLE001 - no /v1/models, a 401, or not OpenAI's shape: the checks say why
        return None
    return out


def served_max_model_len(client: Any, model: str) -> int | None:
    """``max_model_len`` vLLM reports in /v1/models for ``model``, or None."""
    return (served_models(client) or {}).get(model)


def measure_chars_per_token(client: Any, opts: Options) -> float:
    """Characters of validate's filler prose per prompt token on this server: the difference in
    ``usage.prompt_tokens`` of two one-token requests whose prompts differ by a known text.
    Falls back to ``CHARS_PER_TOKEN`` when the server reports no usage."""
    if opts.facts.chars_per_token is not None:
        return opts.facts.chars_per_token
    filler = haystack(2000, "", 0, opts.seed + 9)
    counts: list[int] = []
    for text in ("Say ok.", filler + "\n\nSay ok."):
        resp = _chat(client, opts, messages=[{"role": "user", "content": text}], max_tokens=1)
        if resp.usage:
            counts.append(int(resp.usage.prompt_tokens))
    if len(counts) < 2 or counts[1] <= counts[0]:
        value = float(CHARS_PER_TOKEN)
    else:
        value = round(len(filler) / (counts[1] - counts[0]), 3)
    opts.facts.chars_per_token = value
    return value


def reasoning_of(message: Any) -> tuple[str | None, str | None]:
    """``(field name, text)`` of the reasoning in a response message or delta: vLLM's ``reasoning``
    (0.32 and later) or the older ``reasoning_content``; ``(None, None)`` when absent."""
    extra = getattr(message, "model_extra", None) or {}
    for name in ("reasoning", "reasoning_content"):
        value = extra.get(name, getattr(message, name, None) if name not in extra else None)
        if isinstance(value, str) and value:
            return name, value
    return None, None


def _validate_calls(calls: Sequence[Any],
                    tools: Sequence[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse and schema-check tool calls against ``tools`` (default: the weather tool alone):
    (argument dicts, problems)."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (tools or [WEATHER_TOOL])}
    parsed, problems = [], []
    for call in calls:
        fn = call.function
        if fn.name not in schemas:
            problems.append(f"unknown function {fn.name!r}")
            continue
        try:
            args = json.loads(fn.arguments)
        except (TypeError, ValueError):
            problems.append(f"arguments are not JSON: {one_line(fn.arguments)[:80]!r}")
            continue
        try:
            jsonschema.validate(args, schemas[fn.name])
        except jsonschema.ValidationError as err:
            problems.append(f"arguments {one_line(json.dumps(args))[:80]} do not match the schema: {one_line(err.message)[:80]}")
            continue
        parsed.append(args)
    return parsed, problems


def _no_calls(profile: ModelProfile, finish_reason: str | None, content: str) -> str:
    return (f"no tool_calls (finish_reason {finish_reason}); content: {one_line(content)[:80]!r}: are "
            f"--enable-auto-tool-choice and --tool-call-parser {profile.tool_call_parser} set?")


def check_tools(client: Any, opts: Options) -> CheckResult:
    name = "tools"
    resp = _chat(
        client,
        opts,
        messages=[{"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    choice = resp.choices[0]
    msg = choice.message
    content = msg.content or ""
    leak = markup_leak(opts.model_profile, content, reasoning_of(msg)[1])
    if leak:
        return CheckResult(name, FAIL, leak)
    calls = msg.tool_calls or []
    if not calls:
        return CheckResult(name, FAIL, _no_calls(opts.model_profile, choice.finish_reason, content))
    parsed, problems = _validate_calls(calls)
    if problems:
        return CheckResult(name, FAIL, problems[0])
    if not any(a.get("city", "").lower() == "paris" for a in parsed):
        return CheckResult(name, FAIL, f"the call does not ask for Paris: {json.dumps(parsed)[:100]}")
    return CheckResult(
        name, PASS, f"{len(calls)} tool call(s), arguments valid JSON matching the schema, finish_reason {choice.finish_reason}"
    )


TWO_CITY_PROMPT = ("Compare the current weather in Paris and in Tokyo. Call get_weather once for each city, both calls in "
                   "this turn.")


def check_parallel_tools(client: Any, opts: Options) -> CheckResult:
    name = "parallel-tools"
    resp = _chat(client, opts, messages=[{"role": "user", "content": TWO_CITY_PROMPT}], tools=[WEATHER_TOOL], tool_choice="auto")
    msg = resp.choices[0].message
    leak = markup_leak(opts.model_profile, msg.content, reasoning_of(msg)[1])
    if leak:
        return CheckResult(name, FAIL, leak)
    calls = msg.tool_calls or []
    if len(calls) < 2:
        detail = f": {one_line(calls[0].function.arguments)[:100]!r}" if calls else ""
        return CheckResult(name, FAIL, f"{len(calls)} tool call(s) where two were needed (merged calls?){detail}")
    parsed, problems = _validate_calls(calls)
    if problems:
        return CheckResult(name, FAIL, problems[0])
    ids = [c.id for c in calls]
    if len(set(ids)) != len(ids) or not all(ids):
        return CheckResult(name, FAIL, f"tool call ids are not distinct: {ids}")
    cities = {a.get("city", "").lower() for a in parsed}
    if not {"paris", "tokyo"} <= cities:
        return CheckResult(name, FAIL, f"the calls cover {sorted(cities)}, not Paris and Tokyo")
    return CheckResult(name, PASS, f"{len(calls)} separate calls with distinct ids ({', '.join(sorted(cities))})")


def _assistant_turn(msg: Any) -> dict[str, Any]:
    """The complete assistant message to send back: content, reasoning (under both names), tool_calls."""
    field_name, reasoning = reasoning_of(msg)
    turn: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if reasoning:
        turn["reasoning_content"] = reasoning
        if field_name != "reasoning_content":
            turn[field_name or "reasoning"] = reasoning  # whichever field the server used, too
    if msg.tool_calls:
        turn["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in msg.tool_calls
        ]
    return turn


PARIS_ROUND_TRIP = ("What is the weather in Paris? Use get_weather, then tell me the temperature and the observation_id it "
                    "returns.")


def check_round_trip(client: Any, opts: Options) -> CheckResult:
    name = "round-trip"
    rng = random.Random(opts.seed + 1)
    observation = f"WX-{rng.randrange(1000, 9999)}"
    user = {"role": "user", "content": PARIS_ROUND_TRIP}
    first = _chat(client, opts, messages=[user], tools=[WEATHER_TOOL], tool_choice="auto")
    msg = first.choices[0].message
    calls = msg.tool_calls or []
    leak = markup_leak(opts.model_profile, msg.content, reasoning_of(msg)[1])
    if leak:
        return CheckResult(name, FAIL, f"turn 1: {leak}")
    if not calls:
        return CheckResult(name, FAIL, "turn 1 returned no tool_calls (see the tools check)")
    field_name, reasoning = reasoning_of(msg)
    if field_name is None or not reasoning:  # reasoning_of gives both or neither
        return CheckResult(name, FAIL, f"turn 1 returned no reasoning: {no_reasoning_cause(opts.model_profile)}")
    assistant = _assistant_turn(msg)
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": 17.5, "observation_id": observation})}
        for c in calls
    ]
    second = _chat(client, opts, messages=[user, assistant, *results], tools=[WEATHER_TOOL], tool_choice="auto")
    reply = second.choices[0].message
    leak = markup_leak(opts.model_profile, reply.content, reasoning_of(reply)[1])
    if leak:
        return CheckResult(name, FAIL, f"turn 2: {leak}")
    if reply.tool_calls:
        return CheckResult(name, FAIL, "turn 2 asked for the tool again instead of using its result")
    if observation not in (reply.content or ""):
        return CheckResult(
            name, FAIL, f"turn 2 does not use the tool result ({observation} missing): {one_line(reply.content or '')[:80]!r}"
        )
    # The same turn 2 without the reasoning: a server that reads it counts more prompt tokens with
    # it; one that drops it counts the same, however short the reasoning is.
    stripped = {k: v for k, v in assistant.items() if k not in ("reasoning_content", "reasoning")}
    without = _chat(client, opts, messages=[user, stripped, *results], tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=1)
    with_tokens = second.usage.prompt_tokens if second.usage else None
    without_tokens = without.usage.prompt_tokens if without.usage else None
    metrics: dict[str, Any] = {"turn2_prompt_tokens": with_tokens, "turn2_prompt_tokens_without_reasoning": without_tokens,
                               "reasoning_chars": len(reasoning), "reasoning_field": field_name}
    if with_tokens is None or without_tokens is None:
        return CheckResult(name, FAIL, "no usage in the turn-2 responses: cannot tell whether the reasoning is kept", metrics)
    if with_tokens <= without_tokens:
        return CheckResult(
            name, FAIL,
            f"turn 2 counts {with_tokens} prompt tokens with the reasoning (reasoning_content) and {without_tokens} "
            "without: the server drops the returned reasoning_content (its chat template does not render it)",
            metrics,
        )
    return CheckResult(
        name, PASS, f"{len(calls)} tool result(s) returned with reasoning ({field_name}); turn 2 used them", metrics
    )


def check_tool_ids(client: Any, opts: Options) -> CheckResult:
    name = "tool-ids"
    user = {"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."}
    first = _chat(client, opts, messages=[user], tools=[WEATHER_TOOL], tool_choice="auto").choices[0].message
    if not first.tool_calls:
        return CheckResult(name, FAIL, "turn 1 returned no tool_calls (see the tools check)")
    results = [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": 17.5})} for c in first.tool_calls]
    follow_up = {"role": "user", "content": "Now what is the weather in Tokyo? Use the get_weather tool."}
    second = _chat(client, opts, messages=[user, _assistant_turn(first), *results, follow_up], tools=[WEATHER_TOOL],
                   tool_choice="auto").choices[0].message
    if not second.tool_calls:
        return CheckResult(name, FAIL, "the second tool turn returned no tool_calls")
    before, after = [c.id for c in first.tool_calls], [c.id for c in second.tool_calls]
    repeated = sorted(set(before) & set(after))
    if repeated or not all(after):
        return CheckResult(
            name, FAIL,
            f"tool-call id {repeated[0] if repeated else '(empty)'!r} of turn 1 comes back in turn 3 (ids {before} then "
            f"{after}): agents key tool results by id; the server's tool-call id scheme repeats per reply",
        )
    return CheckResult(name, PASS, f"ids differ across turns ({before[0]} then {after[0]})")


# Prompts of the reasoning-effort samples: the same set at every level (sample i of each level is
# prompt i), so the levels differ in the field alone.
EFFORT_PROMPTS: tuple[str, ...] = tuple(
    f"What is {a} times {b}? Reply with the number only."
    for a, b in ((17, 23), (29, 31), (43, 47), (53, 59), (61, 67), (71, 73), (79, 83), (89, 97), (101, 103), (107, 109),
                 (113, 127), (131, 137), (139, 149), (151, 157), (163, 167), (173, 179))
)


def _effort_sample(client: Any, opts: Options, effort: str, prompt: str) -> tuple[int | None, int]:
    """(reasoning tokens from usage or None, reasoning characters) of one reply at ``effort``.

    Raises:
        CheckFailed: the request failed (its one-line reason) or raw chat markup reached the text.
    """
    resp = _chat(client, opts, messages=[{"role": "user", "content": prompt}], reasoning_effort=effort)
    msg = resp.choices[0].message
    leak = markup_leak(opts.model_profile, msg.content, reasoning_of(msg)[1])
    if leak:
        raise CheckFailed(leak)
    details = getattr(resp.usage, "completion_tokens_details", None) if resp.usage else None
    tokens = getattr(details, "reasoning_tokens", None) if details else None
    return (int(tokens) if tokens is not None else None), len(reasoning_of(msg)[1] or "")


def check_reasoning_effort(client: Any, opts: Options) -> CheckResult:
    """Every level of the profile's ``reasoning_efforts`` accepted, and the highest reasoning more
    than the lowest over ``opts.effort_samples`` prompts each (``stats.rank_sum_test``, one-sided,
    p <= ``EFFORT_ALPHA``): a server that ignores the field passes with probability <= 1%."""
    from scripts.ops.validating.stats import median, rank_sum_test

    name = "reasoning-effort"
    profile = opts.model_profile
    levels = profile.reasoning_efforts
    if len(levels) < 2:
        return CheckResult(name, SKIP, f"the {profile.display_name} profile lists no reasoning_effort levels")
    prompts = [EFFORT_PROMPTS[i % len(EFFORT_PROMPTS)] for i in range(opts.effort_samples)]
    samples: dict[str, list[tuple[int | None, int]]] = {level: [(None, 0)] * len(prompts) for level in levels}
    rejected: dict[str, str] = {}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, opts.concurrency)) as pool:
        futures = {pool.submit(_effort_sample, client, opts, level, prompt): (level, i)
                   for level in levels for i, prompt in enumerate(prompts)}
        for future in as_completed(futures):
            level, i = futures[future]
            try:
                samples[level][i] = future.result()  # in prompt order: sample i of each level is prompt i
            except CheckFailed as err:
                rejected.setdefault(level, str(err))
    metrics: dict[str, Any] = {"levels": list(levels), "samples_per_level": opts.effort_samples,
                               "seconds": round(time.monotonic() - started, 2)}
    if rejected:
        first = next(level for level in levels if level in rejected)
        cause = ""
        if first not in ("low", "high", "max") and set(rejected) == {first}:
            cause = (f": {first!r} is a {profile.display_name} level that vLLM's renderer accepts from 0.34.0 on "
                     "(renderers/kimi_k3.py): is the server's vLLM older than the pin?")
        metrics["rejected"] = rejected
        return CheckResult(name, FAIL, f"reasoning_effort {first!r} rejected: {rejected[first]}{cause}", metrics)
    by_tokens = all(t is not None for level in levels for t, _ in samples[level])
    unit = "reasoning tokens" if by_tokens else "reasoning characters"
    values = {level: [float(t if by_tokens and t is not None else c) for t, c in samples[level]] for level in levels}
    medians = {level: median(values[level]) for level in levels}
    metrics["unit"] = unit
    metrics["medians"] = medians
    metrics["values"] = values
    if not any(any(v) for v in values.values()):
        return CheckResult(name, FAIL, f"no reasoning at any effort: {no_reasoning_cause(profile)}", metrics)
    low, high = levels[0], levels[-1]
    test = rank_sum_test(values[high], values[low])
    metrics["p_value"] = round(test.p_value, 5)
    metrics["u_statistic"] = test.u_statistic
    shown = ", ".join(f"{level} {medians[level]:g}" for level in levels)
    summary = f"median {unit} over {opts.effort_samples} prompts per level: {shown}"
    if test.p_value > EFFORT_ALPHA or medians[high] <= medians[low]:
        return CheckResult(
            name, FAIL,
            f"reasoning_effort {high} does not reason more than {low} beyond chance ({summary}; one-sided rank test "
            f"p = {test.p_value:.3g}, needs <= {EFFORT_ALPHA}): the server ignores the field (for Kimi K3 vLLM maps it "
            "to thinking_effort in tokenizer mode kimi_k3, which the checkpoint's architecture selects; is "
            "--tokenizer-mode overridden?) or --effort-samples is too small to tell",
            metrics,
        )
    return CheckResult(name, PASS, f"{', '.join(levels)} accepted; {summary}; {high} > {low} at p = {test.p_value:.3g}",
                       metrics)


_WORDS = (
    "river harbor lantern meadow copper signal orchard valley engine canvas granite ledger beacon "
    "compass thunder willow marble circuit window garden silver market bridge planet quiet rapid "
    "gentle narrow ancient modern distant bright hollow steady cloud forest paper stone winter summer "
    "morning evening station village railway journey letter theory measure pattern"
).split()


# Names of the needle check's facts (none is a filler word, so the filler never mentions a vault).
VAULT_NAMES: tuple[str, ...] = ("Amber", "Birch", "Cedar", "Dune", "Ember", "Fjord", "Garnet", "Heron", "Iris", "Juniper",
                                "Kestrel", "Lotus")


def haystack(chars: int, needle: str, depth: float, seed: int) -> str:
    """About ``chars`` characters of filler prose with ``needle`` at ``depth`` (0 start, 1 end)."""
    return haystack_with_facts(chars, [(depth, needle)] if needle else [], seed)[0]


def haystack_with_facts(chars: int, facts: Sequence[tuple[float, str]], seed: int) -> tuple[str, list[int]]:
    """About ``chars`` characters of filler prose with each ``(depth, sentence)`` of ``facts`` at its
    depth (0 start, 1 end): the text and the character offset where each fact starts."""
    rng = random.Random(seed)
    sentences, size = [], 0
    while size < chars:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 16))]
        sentence = " ".join(words).capitalize() + ". "
        sentences.append(sentence)
        size += len(sentence)
    slots = [int(len(sentences) * depth) for depth, _ in facts]
    for slot, (_, sentence) in sorted(zip(slots, facts, strict=True), key=lambda pair: pair[0], reverse=True):
        sentences.insert(slot, sentence + " ")
    text = "".join(sentences)
    offsets = [text.index(sentence) for _, sentence in facts]
    return text, offsets


def needle_depths(target_tokens: int, facts: int, window_tokens: int) -> list[float]:
    """Where the needle check's ``facts`` sit (fractions of the haystack, evenly spaced from 2% to
    the last point that keeps ``window_tokens`` between a fact and the question); empty when the
    haystack is too short to hold any fact outside the window (the check asks for at least twice
    the window, so the facts spread over half the haystack or more)."""
    usable = 1 - window_tokens / target_tokens
    if usable <= 0.02 or facts < 1:
        return []
    if facts == 1:
        return [round(usable / 2, 4)]
    return [round(0.02 + (usable - 0.02) * i / (facts - 1), 4) for i in range(facts)]


def check_needle(client: Any, opts: Options) -> CheckResult:
    """``opts.needle_facts`` facts spread through an ``opts.needle_tokens`` haystack, every one
    farther from the question than the profile's sparse-attention window, asked for together: all
    must come back (the sparse top-k must select each from far context, not only the last tokens)."""
    name = "needle"
    rng = random.Random(opts.seed + 2)
    target = opts.needle_tokens
    limit = opts.facts.max_model_len
    window = (opts.model_profile.sparse_attention_tokens or 0) + NEEDLE_WINDOW_MARGIN_TOKENS
    if limit is not None and target + NEEDLE_ANSWER_TOKENS > limit:
        fits = limit - NEEDLE_ANSWER_TOKENS
        other = (f"or pass --needle-tokens {fits:,}" if fits >= 2 * window else
                 f"the smallest haystack that keeps every fact outside the {window:,}-token window needs "
                 f"{2 * window + NEEDLE_ANSWER_TOKENS:,}")
        return CheckResult(
            name, FAIL,
            f"the served max_model_len is {limit:,} tokens, below the {target:,}-token haystack + {NEEDLE_ANSWER_TOKENS:,} for "
            f"the answer: is the server's --max-model-len the planned one? ({other})",
            {"target_tokens": target, "max_model_len": limit},
        )
    depths = needle_depths(target, opts.needle_facts, window)
    if target < 2 * window or not depths:
        return CheckResult(name, FAIL, f"--needle-tokens {target:,} leaves no room for a fact outside the last "
                                       f"{window:,} tokens before the question (pass at least {2 * window:,})")
    names = [VAULT_NAMES[i % len(VAULT_NAMES)] + ("" if i < len(VAULT_NAMES) else str(i)) for i in range(len(depths))]
    codes = [f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(1000, 9999)}" for _ in names]
    cpt = measure_chars_per_token(client, opts)
    text, offsets = haystack_with_facts(
        int(target * cpt), [(d, f"The code for vault {n} is {c}.") for d, n, c in zip(depths, names, codes, strict=True)],
        opts.seed)
    question = (f"\n\nThe text above gives the codes of the vaults {', '.join(names)}. What is the code of each vault? "
                "Reply with one line per vault: NAME: CODE.")
    started = time.monotonic()
    resp = _chat(client, opts, messages=[{"role": "user", "content": text + question}],
                 max_tokens=fit_output_tokens(opts, len(text), CHECK_MAX_TOKENS))
    seconds = round(time.monotonic() - started, 2)
    msg = resp.choices[0].message
    answer = (msg.content or "").lower()
    prompt_tokens = resp.usage.prompt_tokens if resp.usage else None
    before_question = [round((len(text) - offset) / cpt) for offset in offsets]
    found = [code.lower() in answer for code in codes]
    metrics = {"target_tokens": target, "prompt_tokens": prompt_tokens, "chars_per_token": cpt, "depths": depths,
               "tokens_before_question": before_question, "found": found, "window_tokens": window, "seconds": seconds}
    leak = markup_leak(opts.model_profile, msg.content, reasoning_of(msg)[1])
    if leak:
        return CheckResult(name, FAIL, leak, metrics)
    size = f"{prompt_tokens:,} prompt tokens" if prompt_tokens else f"~{target:,} tokens"
    missing = [f"{n} ({d:,} tokens before the question)" for n, d, ok in zip(names, before_question, found, strict=True)
               if not ok]
    if missing:
        return CheckResult(
            name, FAIL,
            f"{len(missing)} of {len(names)} facts not recalled from {size}: {', '.join(missing)}; answered "
            f"{one_line(msg.content or '')[:60]!r} (every fact lies outside the last {window:,} tokens, where the "
            "sparse attention's top-k must select it)",
            metrics,
        )
    return CheckResult(
        name, PASS,
        f"all {len(names)} facts recalled from {size}, {min(before_question):,} to {max(before_question):,} tokens before "
        f"the question ({seconds:.1f} s)",
        metrics,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _one_stream(client: Any, opts: Options, prompt: str) -> dict[str, Any]:
    import openai

    started = time.monotonic()
    first = last = None
    chunks = 0
    usage_tokens = None
    try:
        stream = client.chat.completions.create(
            model=opts.model, messages=[{"role": "user", "content": prompt}],
            max_tokens=fit_output_tokens(opts, len(prompt), opts.max_tokens),
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                delta = choice.delta
                if delta is None:
                    continue
                if delta.content or reasoning_of(delta)[1] or delta.tool_calls:
                    now = time.monotonic()
                    first = first or now
                    last = now
                    chunks += 1
    except openai.OpenAIError as err:
        return {"error": _describe_error(err)}
    if first is None or last is None:  # both are set by the first token
        return {"error": "the stream produced no tokens"}
    tokens = usage_tokens if usage_tokens is not None else chunks
    itl = (last - first) / (tokens - 1) if tokens > 1 else None
    return {"ttft": first - started, "itl": itl, "tokens": tokens, "usage": usage_tokens is not None,
            "decode_tps": (tokens - 1) / (last - first) if tokens > 1 and last > first else None}


def check_throughput(client: Any, opts: Options, progress: Callable[[int, int], None] | None = None) -> CheckResult:
    name = "throughput"
    cpt = measure_chars_per_token(client, opts)
    filler = haystack(int(opts.prompt_tokens * cpt), "", 0, opts.seed + 3)
    prompt = filler + "\n\nWrite a long, detailed story inspired by the words above."
    started = time.monotonic()
    results = []
    with ThreadPoolExecutor(max_workers=opts.concurrency) as pool:
        futures = [pool.submit(_one_stream, client, opts, f"[{i}] {prompt}") for i in range(opts.requests)]
        for done, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            if progress:
                progress(done, opts.requests)
    wall = time.monotonic() - started
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    if errors:
        return CheckResult(name, FAIL, f"{len(errors)} of {opts.requests} streams failed: {errors[0]}", {"failed": len(errors)})
    ttfts = [r["ttft"] for r in ok]
    itls = [r["itl"] for r in ok if r["itl"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    metrics = {
        "concurrency": opts.concurrency,
        "requests": opts.requests,
        "max_tokens": opts.max_tokens,
        "prompt_tokens_estimate": opts.prompt_tokens,
        "chars_per_token": cpt,
        "output_tokens": tokens,
        "wall_seconds": round(wall, 3),
        "output_tokens_per_second": round(tokens / wall, 2) if wall > 0 else None,
        "ttft_p50_seconds": round(percentile(ttfts, 50), 4),
        "ttft_p95_seconds": round(percentile(ttfts, 95), 4),
        "itl_mean_seconds": round(sum(itls) / len(itls), 5) if itls else None,
        "itl_p95_seconds": round(percentile(itls, 95), 5) if itls else None,
        "usage_reported": all(r["usage"] for r in ok),
    }
    summary = (
        f"{opts.requests} streams at concurrency {opts.concurrency}: {metrics['output_tokens_per_second']:,} output tok/s, "
        f"TTFT p50 {metrics['ttft_p50_seconds']:.3f} s p95 {metrics['ttft_p95_seconds']:.3f} s, "
        f"ITL {'n/a' if metrics['itl_mean_seconds'] is None else format(metrics['itl_mean_seconds'] * 1000, '.1f') + ' ms'}"
    )
    if opts.min_output_tps is not None and (metrics["output_tokens_per_second"] or 0) < opts.min_output_tps:
        return CheckResult(name, FAIL, f"{summary}: below --min-output-tps {opts.min_output_tps}", metrics)
    if opts.max_ttft_p95_seconds is not None and metrics["ttft_p95_seconds"] > opts.max_ttft_p95_seconds:
        return CheckResult(name, FAIL, f"{summary}: TTFT p95 above --max-ttft-p95-seconds {opts.max_ttft_p95_seconds}", metrics)
    if not metrics["usage_reported"]:
        summary += " (no usage in the stream: tokens counted from chunks)"
    return CheckResult(name, PASS, summary, metrics)


def stream_tool_calls(client: Any, opts: Options, messages: list[dict[str, Any]],
                      tools: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One streamed chat request with ``tools`` (default the weather tool); the reply rebuilt from its deltas.

    Returns:
        ``{"calls": [{"id", "name", "arguments"}] (by delta index), "content": str,
        "reasoning": str, "finish_reason": str | None}``.

    Raises:
        CheckFailed: the request failed.
    """
    import openai

    calls: dict[int, dict[str, str]] = {}
    content, reasoning, finish = [], [], None
    try:
        tool_list = list(tools or [WEATHER_TOOL])
        stream = client.chat.completions.create(
            model=opts.model, messages=messages, tools=tool_list, tool_choice="auto", stream=True,
            max_tokens=fit_output_tokens(opts, _prompt_chars({"messages": messages, "tools": tool_list})),
        )
        for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                finish = choice.finish_reason or finish
                if delta is None:
                    continue
                content.append(delta.content or "")
                reasoning.append(reasoning_of(delta)[1] or "")
                for tc in delta.tool_calls or []:
                    call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function is not None:
                        call["name"] = tc.function.name or call["name"]
                        call["arguments"] += tc.function.arguments or ""
    except openai.OpenAIError as err:
        raise CheckFailed(_describe_error(err)) from None
    return {"calls": [calls[i] for i in sorted(calls)], "content": "".join(content), "reasoning": "".join(reasoning),
            "finish_reason": finish}


def streamed_call_problem(reply: dict[str, Any], cities: Sequence[str], profile: ModelProfile | None = None) -> str | None:
    """Why a streamed reply is not one complete call per city in ``cities`` (None when it is):
    raw chat markup of ``profile`` in the text, no call, an empty call (no id, name or arguments),
    merged or broken arguments (not JSON, not the schema), a city missing or asked for twice."""
    profile = profile or MODELS[DEFAULT_PROFILE]
    leak = markup_leak(profile, reply["content"], reply["reasoning"])
    if leak:
        return leak.replace(" in content", " in the streamed content").replace(" in reasoning", " in the streamed reasoning")
    calls = reply["calls"]
    if not calls:
        missing = _no_calls(profile, reply["finish_reason"], reply["content"])
        return missing.replace("no tool_calls", "no tool_calls in the stream")
    for call in calls:
        if not call["id"] or not call["name"] or not call["arguments"].strip():
            return f"an empty tool call in the stream: {json.dumps(call)[:100]}"
    ids = [c["id"] for c in calls]
    if len(set(ids)) != len(ids):
        return f"tool call ids are not distinct: {ids}"
    from types import SimpleNamespace

    parsed, problems = _validate_calls(
        [SimpleNamespace(function=SimpleNamespace(name=c["name"], arguments=c["arguments"])) for c in calls]
    )
    if problems:
        return f"{problems[0]} (merged calls?)" if len(calls) < len(cities) else problems[0]
    asked = sorted(a.get("city", "").lower() for a in parsed)
    if asked != sorted(c.lower() for c in cities):
        return f"{len(calls)} streamed call(s) for {asked}, expected one each for {sorted(c.lower() for c in cities)}"
    return None


def check_stream_tools(client: Any, opts: Options) -> CheckResult:
    name = "stream-tools"
    cases = (
        (("Paris",), "What is the weather in Paris right now? Use the get_weather tool."),
        (("Paris", "Tokyo"), TWO_CITY_PROMPT),
    )
    for cities, prompt in cases:
        reply = stream_tool_calls(client, opts, [{"role": "user", "content": prompt}])
        problem = streamed_call_problem(reply, cities, opts.model_profile)
        if problem:
            return CheckResult(name, FAIL, f"{len(cities)}-call stream: {problem}")
    return CheckResult(
        name, PASS, "streamed single and two-call requests: tool_calls rebuilt from the deltas are complete and separate"
    )


CONCURRENT_CITIES: tuple[str, ...] = ("Paris", "Tokyo", "Berlin", "Lima")


def check_concurrent_tools(client: Any, opts: Options) -> CheckResult:
    name = "concurrent-tools"
    n = max(2, opts.concurrency)
    cities = [CONCURRENT_CITIES[i % len(CONCURRENT_CITIES)] for i in range(n)]
    problems: list[str] = []
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = {
            pool.submit(
                stream_tool_calls,
                client,
                opts,
                [{"role": "user", "content": f"What is the weather in {city} right now? Use the get_weather tool."}],
            ): (i, city)
            for i, city in enumerate(cities)
        }
        for future in as_completed(futures):
            i, city = futures[future]
            try:
                problem = streamed_call_problem(future.result(), (city,), opts.model_profile)
            except CheckFailed as err:
                problem = str(err)
            if problem:
                problems.append(f"stream {i + 1} ({city}): {problem}")
    if problems:
        return CheckResult(
            name, FAIL, f"{len(problems)} of {n} concurrent tool streams wrong; first: {sorted(problems)[0]}", {"streams": n}
        )
    return CheckResult(name, PASS, f"{n} concurrent tool streams, each a complete call for its own city", {"streams": n})


# -- tool_choice, stream silence, tool-call reliability ----------------------------------------------


def _named(function: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": function}}


def check_tool_choice(client: Any, opts: Options) -> CheckResult:
    """tool_choice ``none``: no call although the prompt asks for one; ``required``: at least one
    valid call although the prompt does not ask; a named function: calls of that function only,
    although the prompt asks for the other tool. vLLM decides these outside the K3 tool parser (it
    parses them like ``auto``; the structural tag of VLLM_ENFORCE_STRICT_TOOL_CALLING forces the
    call), so a parser check says nothing about them."""
    name = "tool-choice"
    profile = opts.model_profile
    tools = [WEATHER_TOOL, TIME_TOOL]
    problems: list[str] = []
    seen: dict[str, Any] = {}
    strict = ("is VLLM_ENFORCE_STRICT_TOOL_CALLING (default on) unset or 1 in the server's environment, and "
              f"--enable-auto-tool-choice --tool-call-parser {profile.tool_call_parser} set?")
    cases: tuple[tuple[str, str, Any], ...] = (
        ("none", "What is the weather in Paris right now? Use the get_weather tool.", "none"),
        ("required", "I am flying to Lima tomorrow.", "required"),
        ("named get_time", "What is the weather in Paris right now?", _named("get_time")),
    )
    for label, prompt, choice in cases:
        try:
            resp = _chat(client, opts, messages=[{"role": "user", "content": prompt}], tools=tools, tool_choice=choice)
        except CheckFailed as err:
            cause = f": {strict}" if "strict" in str(err).lower() or "tool_choice" in str(err) else ""
            problems.append(f"{label}: {err}{cause}")
            continue
        choice0 = resp.choices[0]
        msg = choice0.message
        calls = msg.tool_calls or []
        seen[label] = {"finish_reason": choice0.finish_reason, "calls": [c.function.name for c in calls]}
        leak = markup_leak(profile, msg.content, reasoning_of(msg)[1])
        if leak:
            problems.append(f"{label}: {leak}")
            continue
        if label == "none":
            if calls:
                problems.append(f"none: {len(calls)} tool call(s) ({calls[0].function.name}) where tool_choice none allows "
                                "none: the server ignores tool_choice none")
            continue
        if not calls:
            problems.append(f"{label}: no tool_calls (finish_reason {choice0.finish_reason}, content "
                            f"{one_line(msg.content or '')[:60]!r}): the server does not force the call; {strict}")
            continue
        parsed, bad = _validate_calls(calls, tools)
        if bad:
            problems.append(f"{label}: {bad[0]}")
            continue
        if label.startswith("named") and {c.function.name for c in calls} != {"get_time"}:
            problems.append(f"named get_time: called {', '.join(c.function.name for c in calls)}: the server does not "
                            f"honour a named tool_choice; {strict}")
    metrics = {"replies": seen}
    if problems:
        return CheckResult(name, FAIL, f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                           metrics | {"problems": problems})
    return CheckResult(name, PASS, "tool_choice none: no call; required: a valid call unasked; named get_time: only get_time",
                       metrics)


def _note_text(tokens: int, cpt: float, seed: int) -> str:
    """Filler prose of about ``tokens`` tokens at ``cpt`` characters per token (the note to save)."""
    return haystack(max(40, int(tokens * cpt)), "", 0, seed).strip()


def check_stream_silence(client: Any, opts: Options) -> CheckResult:
    """A streamed call whose argument is long (``opts.silence_probe_tokens``), read byte by byte
    (``validating.sse``): the longest time without a byte, the wait for the first included, must
    stay at most ``opts.max_stream_silence_seconds``, the idle timeout of a proxy in front of the
    server. A tool parser that holds a call back until its close marker (vLLM's K3 parser does) is
    silent for the whole argument; SSE keep-alive comments (``--sse-keep-alive-interval``) count as
    bytes, as they do for a proxy."""
    from scripts.ops.validating.sse import post_stream

    name = "stream-silence"
    cpt = measure_chars_per_token(client, opts)
    note = _note_text(opts.silence_probe_tokens, cpt, opts.seed + 5)
    messages = [{"role": "user", "content": "Save the following note verbatim with the save_note tool. Note: " + note}]
    body = {"model": opts.model, "messages": messages, "tools": [NOTE_TOOL], "tool_choice": "auto", "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": fit_output_tokens(opts, _prompt_chars({"messages": messages, "tools": [NOTE_TOOL]}))}
    url = f"{(opts.base_url or str(client.base_url)).rstrip('/')}/chat/completions"
    record = post_stream(url, body, api_key=opts.api_key if opts.api_key != "EMPTY" else None,
                         timeout_seconds=opts.timeout_seconds)
    if record.status != 200:
        raise CheckFailed(record.error or f"HTTP {record.status}")
    arguments, call_event, usage, call_deltas = "", None, None, 0
    for index, event in enumerate(record.events):
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                arguments += (tc.get("function") or {}).get("arguments") or ""
                call_deltas += 1
                call_event = index if call_event is None else call_event
    silence = record.longest_silence_seconds
    after = record.silence_before_event
    metrics: dict[str, Any] = {
        "longest_silence_seconds": round(silence, 3), "first_byte_seconds": round(record.first_byte_seconds or 0, 3),
        "limit_seconds": opts.max_stream_silence_seconds, "events": len(record.events), "keep_alive_comments": record.comments,
        "note_tokens": opts.silence_probe_tokens, "completion_tokens": (usage or {}).get("completion_tokens"),
        # How the call came: in how many deltas, and after how long a wait since the event before it.
        "call_deltas": call_deltas, "argument_chars": len(arguments),
        "silence_before_call_seconds": round(record.event_seconds[call_event] - record.event_seconds[call_event - 1], 3)
        if call_event else None,
    }
    if record.error:
        metrics["error"] = record.error
    if after is None:
        where = "before the first byte (queueing and prefill)"
    elif after == call_event:
        where = (f"before the save_note call, which then arrived whole ({len(arguments):,} characters of arguments in "
                 "one delta): the tool parser holds a call back until its close marker")
    else:
        where = f"between stream events {after} and {after + 1}"
    held = None
    if after is not None and after == call_event and usage and usage.get("completion_tokens"):
        held = round(silence / max(1, usage["completion_tokens"]) * 1000, 2)
        metrics["silence_seconds_per_1k_tokens"] = held
    summary = f"longest silence {silence:.1f} s {where}"
    if record.comments:
        summary += f"; {record.comments} keep-alive comment(s) received"
    if silence > opts.max_stream_silence_seconds or record.error:
        return CheckResult(
            name, FAIL,
            f"{summary}{': ' + record.error if record.error else ''}: a proxy with a {opts.max_stream_silence_seconds:g} s idle "
            "timeout (--max-stream-silence-seconds) cuts this stream; set vLLM's --sse-keep-alive-interval (e.g. 15) "
            "or raise the proxy's idle timeout",
            metrics,
        )
    if not arguments:
        return CheckResult(name, FAIL, f"no save_note call in the stream ({summary}): "
                                       f"{_no_calls(opts.model_profile, None, '')}", metrics)
    projection = ""
    if held:
        projection = (f"; at {held:g} s per 1,000 tokens a {opts.max_stream_silence_seconds:g} s idle timeout cuts calls "
                      f"longer than about {int(opts.max_stream_silence_seconds / held * 1000):,} tokens")
    return CheckResult(name, PASS, f"{summary} (limit {opts.max_stream_silence_seconds:g} s){projection}", metrics)


# Markup or a call spelled out in text: a call that went into the reasoning or the content instead
# of tool_calls (raw XTML, or the function and its arguments as JSON or as a call).
def _call_text_pattern(function: str) -> re.Pattern[str]:
    name = re.escape(function)
    return re.compile(rf'tool="{name}"|"name"\s*:\s*"{name}"|\b{name}\s*\(\s*[{{"\w]|<\|open\|>\s*(tools|call)\b')


@dataclass(frozen=True)
class TurnOutcome:
    """One agent-style turn of ``check_tool_reliability``.

    Attributes:
        kind: ``ok`` (a valid call of the expected function for the city), ``wrong`` (calls, but
            not that one or not valid), ``in-reasoning`` / ``in-content`` (no call; the call's
            text is in that field), ``missing`` (no call anywhere).
        streamed: whether the turn was streamed.
        detail: one line for the report.
    """

    kind: str
    streamed: bool
    detail: str = ""


def classify_turn(reply: dict[str, Any], function: str, city: str, streamed: bool) -> TurnOutcome:
    """What happened to the call one turn needed (``reply`` as ``stream_tool_calls`` returns it)."""
    from types import SimpleNamespace

    calls = reply["calls"]
    if calls:
        parsed, problems = _validate_calls(
            [SimpleNamespace(function=SimpleNamespace(name=c["name"], arguments=c["arguments"])) for c in calls],
            [WEATHER_TOOL, TIME_TOOL])
        if not problems and any(c["name"] == function for c in calls) and any(
                a.get("city", "").lower() == city.lower() for a in parsed):
            return TurnOutcome("ok", streamed)
        return TurnOutcome("wrong", streamed, problems[0] if problems else
                           f"called {[c['name'] for c in calls]} for {[a.get('city') for a in parsed]}, "
                           f"not {function} for {city}")
    pattern = _call_text_pattern(function)
    for kind, text in (("in-reasoning", reply["reasoning"]), ("in-content", reply["content"])):
        found = pattern.search(text or "")
        if found:
            return TurnOutcome(kind, streamed, one_line((text or "")[max(0, found.start() - 10): found.start() + 60]))
    return TurnOutcome("missing", streamed, f"finish_reason {reply['finish_reason']}, content "
                                            f"{one_line(reply['content'] or '')[:40]!r}")


def _plain_reply(client: Any, opts: Options, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A non-streamed request with both tools, in ``stream_tool_calls``' shape."""
    resp = _chat(client, opts, messages=messages, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="auto")
    msg = resp.choices[0].message
    return {"calls": [{"id": c.id or "", "name": c.function.name, "arguments": c.function.arguments}
                      for c in msg.tool_calls or []],
            "content": msg.content or "", "reasoning": reasoning_of(msg)[1] or "",
            "finish_reason": resp.choices[0].finish_reason}


AGENT_SYSTEM_PROMPT = ("You are a travel assistant with two tools. Answer every question with a tool call: get_weather for "
                       "the weather, get_time for the local time.")


def _agent_conversation(client: Any, opts: Options, index: int, turns: int) -> list[TurnOutcome]:
    """``turns`` turns of one agent conversation: each asks about a city, gets (or not) a call, and
    the call's result goes back before the next question, so the context grows as an agent's does.
    Odd-numbered conversations stream."""
    streamed = index % 2 == 1
    messages: list[dict[str, Any]] = [{"role": "system", "content": AGENT_SYSTEM_PROMPT}]
    outcomes = []
    for turn in range(turns):
        city = CONCURRENT_CITIES[(index + turn) % len(CONCURRENT_CITIES)]
        function = ("get_weather", "get_time")[(index + turn) % 2]
        what = "weather" if function == "get_weather" else "local time"
        messages.append({"role": "user", "content": f"What is the {what} in {city} right now? Use the {function} tool."})
        try:
            if streamed:
                reply = stream_tool_calls(client, opts, messages, [WEATHER_TOOL, TIME_TOOL])
            else:
                reply = _plain_reply(client, opts, messages)
        except CheckFailed as err:
            outcomes.append(TurnOutcome("missing", streamed, f"request failed: {err}"))
            break
        outcomes.append(classify_turn(reply, function, city, streamed))
        assistant: dict[str, Any] = {"role": "assistant", "content": reply["content"]}
        if reply["reasoning"]:
            assistant["reasoning_content"] = reply["reasoning"]
        if reply["calls"]:
            assistant["tool_calls"] = [{"id": c["id"] or f"call-{index}-{turn}-{i}", "type": "function",
                                        "function": {"name": c["name"], "arguments": c["arguments"]}}
                                       for i, c in enumerate(reply["calls"])]
        messages.append(assistant)
        for call in assistant.get("tool_calls", []):
            result = {"city": city, "temperature_c": 17.5} if call["function"]["name"] == "get_weather" else {
                "city": city, "local_time": "14:05"}
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    return outcomes


def check_tool_reliability(client: Any, opts: Options) -> CheckResult:
    """``opts.tool_turns`` agent-style turns that each need a call, over ``opts.concurrency``
    conversations at once (half streamed): the share of turns whose call was lost, with its 95%
    Wilson interval (``validating.stats``); fails when the share exceeds ``opts.max_tool_loss_rate``.
    At a 5% loss rate (public reports on K3 tool parsers) 100 turns lose at least 2 calls with
    probability 0.96."""
    from scripts.ops.validating.stats import wilson_interval

    name = "tool-reliability"
    conversations = max(1, min(opts.concurrency, opts.tool_turns))
    per_conversation = [opts.tool_turns // conversations + (1 if i < opts.tool_turns % conversations else 0)
                        for i in range(conversations)]
    outcomes: list[TurnOutcome] = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=conversations) as pool:
        for result in pool.map(lambda i: _agent_conversation(client, opts, i, per_conversation[i]), range(conversations)):
            outcomes.extend(result)
    kinds = {kind: sum(1 for o in outcomes if o.kind == kind) for kind in ("ok", "wrong", "in-reasoning", "in-content",
                                                                          "missing")}
    turns = len(outcomes)
    lost = turns - kinds["ok"]
    low, high = wilson_interval(lost, turns, TOOL_LOSS_CONFIDENCE) if turns else (0.0, 1.0)
    rate = lost / turns if turns else 1.0
    streamed_lost = sum(1 for o in outcomes if o.kind != "ok" and o.streamed)
    examples = [f"{o.kind}{' (streamed)' if o.streamed else ''}: {o.detail}" for o in outcomes if o.kind != "ok"]
    metrics: dict[str, Any] = {"turns": turns, "conversations": conversations, "outcomes": kinds, "loss_rate": round(rate, 4),
               "loss_rate_ci95": [round(low, 4), round(high, 4)], "lost_streamed": streamed_lost,
               "lost_not_streamed": lost - streamed_lost, "threshold": opts.max_tool_loss_rate,
               "seconds": round(time.monotonic() - started, 2), "examples": examples[:5]}
    interval = f"{rate:.1%} lost (95% CI {low:.1%}-{high:.1%})"
    where = ", ".join(f"{kinds[k]} {k}" for k in ("in-reasoning", "in-content", "missing", "wrong") if kinds[k])
    if turns < opts.tool_turns:
        return CheckResult(name, FAIL, f"only {turns} of {opts.tool_turns} turns ran: {examples[-1]}", metrics)
    if rate > opts.max_tool_loss_rate:
        return CheckResult(
            name, FAIL,
            f"{lost} of {turns} agent turns lost their call ({where}; {streamed_lost} streamed): {interval}, above "
            f"--max-tool-loss-rate {opts.max_tool_loss_rate:g}; first: {examples[0]}",
            metrics,
        )
    return CheckResult(name, PASS, f"{kinds['ok']} of {turns} agent turns got their call: {interval}"
                                   + (f" ({where})" if where else ""), metrics)


# -- auth ------------------------------------------------------------------------------------------


def root_url(base_url: str) -> str:
    """The server's root: ``base_url`` without a trailing ``/v1``."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _http(method: str, url: str, *, api_key: str | None = None, body: dict[str, Any] | bytes | None = None,
          timeout_seconds: float = 30) -> tuple[int, bytes]:
    """(status, body) of one request (``body``: a dict sent as JSON, or raw bytes sent as
    ``application/json``); 0 when the connection failed."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, method=method, data=data)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with _NO_REDIRECT_OPENER.open(request, timeout=timeout_seconds) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def served_routes(opts: Options) -> tuple[dict[str, tuple[str, ...]], str]:
    """``{path: methods}`` the server serves and where the list came from: its ``/openapi.json``
    (read with the key) merged with ``KNOWN_ENGINE_ROUTES``."""
    routes = dict(KNOWN_ENGINE_ROUTES)
    status, body = _http("GET", root_url(opts.base_url or "") + "/openapi.json", api_key=opts.api_key,
                         timeout_seconds=min(opts.timeout_seconds, 30))
    source = "vLLM 0.33.0's route list (no /openapi.json)"
    if status == 200:
        try:
            paths = json.loads(body).get("paths", {})
            for path, ops in paths.items():
                routes[path] = tuple(sorted(m.upper() for m in ops if m.lower() in ("get", "post", "put", "delete", "patch")))
            source = f"/openapi.json ({len(paths)} paths) and vLLM 0.33.0's route list"
        except (ValueError, AttributeError):
            pass
    return routes, source


# Answers to a method a route does not accept that cannot tell a guard from an open route: the
# router's 405 (the route exists, the method does not) and a 501 from a server that refuses a method
# it does not implement before anything else (Python's http.server, some proxies), maybe before auth.
UNDECIDED_METHOD_STATUSES = frozenset({405, 501})
# The body of the confirming request: malformed JSON, which a route rejects (400/422) before it runs.
MALFORMED_JSON = b"{"


def probe_route(url: str, methods: Sequence[str], timeout_seconds: float) -> tuple[str, list[str]]:
    """Whether the route at ``url`` (accepting ``methods``) answers without the API key.

    First a method the route does not accept: a guard answers 401/403 before routing (``guarded``),
    a 404 means no such route (``absent``), any other answer but 405/501 means the request got past
    the guard (``open``); nothing runs either way. A 405 or 501 cannot tell, so the route's own
    method confirms it: GET as is, any other with a body that is not JSON, which an open route
    refuses (400/422) before its handler runs. 401/403 then means ``guarded``, 404 ``absent``,
    another 405/501 ``undecided`` (counted as not open), anything else ``open``.

    Returns:
        ``(verdict, evidence)``: the verdict and ``"METHOD status"`` of each request sent.

    Raises:
        CheckFailed: the server cannot be reached.
    """
    evidence: list[str] = []

    def ask(method: str, body: bytes | None = None) -> int:
        status, _ = _http(method, url, body=body, timeout_seconds=timeout_seconds)
        if status == 0:
            raise CheckFailed(f"cannot connect to {url} for the route probes")
        evidence.append(f"{method} {status}")
        return status

    def verdict(status: int) -> str | None:
        if status in (401, 403):
            return "guarded"
        if status == 404:
            return "absent"
        return None if status in UNDECIDED_METHOD_STATUSES else "open"

    probe_method = next(m for m in ("DELETE", "PUT", "PATCH", "GET", "POST") if m not in methods)
    first = verdict(ask(probe_method))
    if first is not None:
        return first, evidence
    own = next((m for m in ("GET", "POST", "PUT", "PATCH", "DELETE") if m in methods), "POST")
    second = verdict(ask(own, None if own == "GET" else MALFORMED_JSON))
    return second or "undecided", evidence


def check_auth(client: Any, opts: Options) -> CheckResult:  # noqa: ARG001 - plain HTTP, no OpenAI client
    name = "auth"
    root = root_url(opts.base_url or "")
    routes, source = served_routes(opts)
    open_routes: list[str] = []
    probed = 0
    confirmed: list[str] = []
    for path, methods in sorted(routes.items()):
        if path in OPEN_PATHS:
            continue
        verdict, evidence = probe_route(root + re.sub(r"\{[^}]+\}", "validate-probe", path), methods,
                                        min(opts.timeout_seconds, 30))
        probed += 1
        if len(evidence) > 1:
            confirmed.append(f"{path} ({', '.join(evidence)})")
        if verdict == "open":
            open_routes.append(path)
    # And inference itself, without the key, on the two routes that serve chat.
    chat = {"model": opts.model, "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 1}
    served = [path for path in ("/v1/chat/completions", "/invocations")
              if _http("POST", root + path, body=chat, timeout_seconds=opts.timeout_seconds)[0] == 200]
    metrics = {"routes_probed": probed, "open_routes": open_routes, "served_without_key": served, "source": source,
               "confirmed_with_own_method": confirmed}
    if served or open_routes:
        if "/v1/chat/completions" in served:
            cause = ("the server has no API key: is VLLM_API_KEY (the stack's apiKey secret) in the server's environment? "
                     "(validate asks these routes without the key on purpose)")
        else:
            cause = (f"vLLM's --api-key guards only /v1, /v2, /inference and /cohere: is {GUARD_FLAG} "
                     "(with its module on PYTHONPATH) in the server's command?")
        others = [p for p in open_routes if p not in served]
        listed = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        head = (f"served inference without the API key on {', '.join(served)}" if served
                else f"{len(others)} route(s) answer without the API key")
        tail = f"; {len(others)} route(s) answer without it ({listed})" if served and others else (
            f" ({listed})" if not served else "")
        return CheckResult(name, FAIL, f"{head}{tail}: {cause}", metrics)
    return CheckResult(
        name, PASS,
        f"{probed} routes refuse requests without the API key (only {', '.join(sorted(OPEN_PATHS))} are open); "
        f"routes from {source}",
        metrics,
    )


def base_url_problem(client: Any, shown_url: str) -> str | None:
    """One line when ``GET <base-url>/models`` shows that the base URL is not an OpenAI server's:
    a 404 (a base URL without ``/v1`` is the usual cause) or a 200 whose body is not OpenAI's model
    list (an HTML page, JSON without a ``data`` list: a web UI, a proxy's page, another service on
    that port). The line names the URL, what came back and the likely cause. Else None: other
    answers (401, 5xx) are left to the checks."""
    import openai

    url = f"{shown_url.rstrip('/')}/models"
    hint = ("should --base-url end in /v1? (e.g. http://HOST:8000/v1)" if not shown_url.rstrip("/").endswith("/v1")
            else "is this the vLLM server's port, not a proxy or another service? (e.g. http://HOST:8000/v1)")
    try:
        raw = client.models.with_raw_response.list()
    except openai.NotFoundError:
        return f"GET {url} answered 404: {hint}"
    except openai.OpenAIError:
        return None
    text = raw.http_response.text
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("data"), list) and all(
            isinstance(item, dict) and "id" in item for item in body["data"]):
        return None
    if isinstance(body, dict):
        what = f"{_excerpt(body)} but no `data` list of models"
    elif body is not None:
        what = f"JSON that is not an object ({one_line(text)[:40]!r})"
    else:
        what = _excerpt(text) if text.strip() else "an empty body"
    return f"GET {url} answered {raw.http_response.status_code} with {what}, not OpenAI's model list: {hint}"


def model_problem(models: dict[str, int | None] | None, model: str) -> str | None:
    """One line when the server serves other model names than ``model``, else None."""
    if not models or model in models:
        return None
    return (f"the server serves {sorted(models)}, not {model!r}: is the server's --served-model-name the stack's "
            f"model.servedModelName (or pass --model {sorted(models)[0]})?")


RUNNERS: dict[str, Callable[..., CheckResult]] = {
    "tools": check_tools,
    "parallel-tools": check_parallel_tools,
    "stream-tools": check_stream_tools,
    "stream-silence": check_stream_silence,
    "concurrent-tools": check_concurrent_tools,
    "tool-choice": check_tool_choice,
    "round-trip": check_round_trip,
    "tool-ids": check_tool_ids,
    "tool-reliability": check_tool_reliability,
    "reasoning-effort": check_reasoning_effort,
    "needle": check_needle,
    "throughput": check_throughput,
    "auth": check_auth,
}


def run_checks(client: Any, opts: Options, *, progress: Callable[[str, int, int], None] | None = None) -> list[CheckResult]:
    """Run ``opts.checks`` in ``CHECKS`` order; a check that cannot complete fails with its reason.

    First reads ``/v1/models`` once: a model name the server does not serve fails every selected
    check with that one reason; its ``max_model_len`` sizes the requests (``opts.facts``).
    """
    import openai

    models = served_models(client)
    if models is not None and opts.model in models:
        opts.facts.max_model_len = models[opts.model]
    wrong_model = model_problem(models, opts.model)
    opts = dataclasses.replace(opts, base_url=opts.base_url or str(client.base_url),
                               api_key=opts.api_key if opts.api_key is not None else client.api_key)
    results = []
    for name in CHECKS:
        if name not in opts.checks:
            results.append(CheckResult(name, SKIP, "not selected (--checks)"))
            continue
        if wrong_model and name != "auth":
            results.append(CheckResult(name, FAIL, wrong_model))
            continue
        started = time.monotonic()
        try:
            if name == "throughput":
                result = check_throughput(client, opts, functools.partial(progress, name) if progress else None)
            else:
                if progress:
                    progress(name, 0, 1)
                result = RUNNERS[name](client, opts)
        except CheckFailed as err:
            result = CheckResult(name, FAIL, str(err))
        except openai.APIStatusError as err:
            result = CheckResult(name, FAIL, status_error_reason(err))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError, openai.OpenAIError) as err:
            # A reply whose shape the check did not expect (a stream of something else, a field
            # missing): one line, never a traceback.
            result = CheckResult(name, FAIL, f"the server's reply is not in OpenAI's shape ({type(err).__name__}: "
                                             f"{one_line(err)[:120]}): is --base-url the vLLM server (its port, ending "
                                             "in /v1), not a proxy or another service?")
        result.metrics.setdefault("check_seconds", round(time.monotonic() - started, 2))
        results.append(result)
    return results


def status_error_reason(err: Any) -> str:
    """One line for an HTTP error a check met that its own logic did not expect (``openai.APIStatusError``):
    a redirect names where it pointed (validate contacts ``--base-url`` only and never follows one);
    another status shows the start of the server's body, which usually says why."""
    response = err.response
    if 300 <= response.status_code < 400:
        where = response.headers.get("location", "(no Location)")
        return (f"the server answered HTTP {response.status_code}, a redirect to {mask_url(where)[:120]}: validate "
                "contacts only --base-url and does not follow it (the key stays there); point --base-url at the vLLM "
                "server itself")
    body = " ".join(response.text.split())[:160] if response.text else "(empty body)"
    return f"the server answered HTTP {response.status_code}: {body}"


def make_client(base_url: str, api_key: str, timeout_seconds: float) -> Any:
    """The official OpenAI client for ``base_url`` (no retries: a failure is the result; no
    redirects followed: a redirect is reported, and the key is sent to ``base_url`` only)."""
    from openai import DefaultHttpxClient, OpenAI

    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_seconds,
                  http_client=DefaultHttpxClient(follow_redirects=False, timeout=timeout_seconds))


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows a redirect by default and copies the Authorization header to wherever it points,
    another host included (``HTTPRedirectHandler.redirect_request``); here a 3xx is the answer."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's signature)
        return None


_NO_REDIRECT_OPENER = urllib.request.build_opener(_RefuseRedirects)



# Reachability probe: one short request before any check, so a dead endpoint is one clear
# reason instead of six failed checks (each waiting for its own timeout).
PROBE_TIMEOUT_SECONDS = 10.0


def check_base_url(url: str) -> str:
    """``url`` if it is a usable http(s) base URL.

    Raises:
        UsageError: not http(s), no host, a malformed host or port (``http://[::1``), or a URL
            the HTTP client rejects; the message shows the URL with any password masked.
    """
    from urllib.parse import urlsplit

    shown = mask_url(url)
    allowed = "an http(s) URL such as http://10.0.1.23:8000/v1"
    if not re.match(r"^https?://[^\s/]+", url) or any(c.isspace() for c in url):
        raise UsageError(f"--base-url: {shown!r} is not {allowed}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number or out of range
        if not parts.hostname:
            raise ValueError("no host")
    except ValueError as err:
        raise UsageError(f"--base-url: {shown!r} is not a valid URL ({one_line(err)[:80]}); expected {allowed}") from None
    return url


def mask_url(url: str) -> str:
    """``url`` with the password of ``user:password@`` replaced by ``***`` (for tables, JSON, errors)."""
    match = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/@?#]*)@", url)
    if not match or ":" not in match.group(2):
        return url
    user = match.group(2).split(":", 1)[0]
    return f"{match.group(1)}{user}:***@{url[match.end():]}"


def probe(client: Any, timeout_seconds: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """None when the endpoint answers at all (any HTTP status: the checks then say what is
    wrong), else the one-line reason it cannot be reached (refused, DNS, timeout)."""
    import openai

    try:  # the raw response: a 200 whose body is not OpenAI's is still an answer (base_url_problem says why)
        client.with_options(timeout=timeout_seconds).models.with_raw_response.list()
    except openai.APITimeoutError:
        return f"no answer within {timeout_seconds:g} s"
    except openai.APIConnectionError as err:
        return one_line(err.__cause__ or err)[:160] or "connection failed"
    except openai.OpenAIError:
        return None
    except Exception as err:  # the HTTP client's InvalidURL and the like: the URL is the user's
        if "URL" in type(err).__name__ or isinstance(err, ValueError):
            raise UsageError(
                f"--base-url: {mask_url(str(client.base_url))!r} is not a valid URL ({one_line(err)[:80]})"
            ) from None
        raise
    return None


def _positive(kind: type, low: float, high: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=prog_name("scripts/ops/validate.py"),
        description="Validate a deployed OpenAI-compatible endpoint: tool calls (single, parallel, streamed, concurrent, "
        "tool_choice none/required/named), the longest silence in a stream, the multi-turn reasoning round trip, tool-call "
        "ids across turns, the rate of tool calls lost over agent-style turns, reasoning_effort over repeated samples, "
        "facts recalled from far in a long context, throughput and latency, and that every route but /health and /metrics "
        "needs the API key.",
        epilog="Exit codes: 0 all selected checks passed, 1 a check failed or the endpoint cannot be reached "
        "(one GET /v1/models is tried first), 2 usage error. "
        "Example: kimi-deploy validate --base-url http://10.0.1.23:8000/v1 --model kimi-k3.1-pro "
        "--json > validate.json",
    )
    parser.add_argument(
        "--base-url", required=True, help="the endpoint's OpenAI base URL, e.g. http://HOST:8000/v1 (the only address contacted)"
    )
    parser.add_argument(
        "--model", required=True, help="the served model name clients send (stack's model.servedModelName, e.g. kimi-k3.1-pro)"
    )
    parser.add_argument(
        "--model-profile",
        default=DEFAULT_PROFILE,
        choices=sorted(MODELS),
        help=f"the model profile whose chat markup must never reach reply text, and whose parsers the failures name "
        f"(default {DEFAULT_PROFILE}; components/core/model.py)",
    )
    parser.add_argument(
        "--api-key-env", metavar="VAR",
        help=f"environment variable holding the API key (default {DEFAULT_API_KEY_ENV} when set, else no key); "
        "the key is never a flag, so it stays out of shell history",
    )
    parser.add_argument(
        "--checks",
        default=",".join(CHECKS),
        metavar="LIST",
        help=f"comma-separated checks to run (default all: {','.join(CHECKS)})",
    )
    parser.add_argument(
        "--needle-tokens",
        type=_positive(int, 1024, 1_048_576),
        default=DEFAULT_NEEDLE_TOKENS,
        metavar="N",
        help=f"haystack length in tokens, counted as the server counts them (default {DEFAULT_NEEDLE_TOKENS:,}); the "
             f"check fails when the served max_model_len cannot hold it plus {NEEDLE_ANSWER_TOKENS:,} for the answer",
    )
    parser.add_argument(
        "--needle-facts",
        type=_positive(int, 1, len(VAULT_NAMES)),
        default=DEFAULT_NEEDLE_FACTS,
        metavar="N",
        help=f"facts spread through the haystack and asked for together, all outside the model's sparse-attention "
             f"window before the question (default {DEFAULT_NEEDLE_FACTS}); every one must come back",
    )
    parser.add_argument(
        "--effort-samples",
        type=_positive(int, 3, len(EFFORT_PROMPTS)),
        default=DEFAULT_EFFORT_SAMPLES,
        metavar="N",
        help=f"prompts per reasoning_effort level (default {DEFAULT_EFFORT_SAMPLES}); the highest level must reason more "
             f"than the lowest at p <= {EFFORT_ALPHA} (one-sided rank test), so fewer than 5 cannot pass",
    )
    parser.add_argument(
        "--tool-turns",
        type=_positive(int, 1, 10_000),
        default=DEFAULT_TOOL_TURNS,
        metavar="N",
        help=f"agent-style turns of the tool-reliability check, over --concurrency conversations (default "
             f"{DEFAULT_TOOL_TURNS}: a 5%% loss rate shows as 2 or more lost calls with probability 0.96)",
    )
    parser.add_argument(
        "--max-tool-loss-rate",
        type=_positive(float, 0, 1),
        default=DEFAULT_MAX_TOOL_LOSS_RATE,
        metavar="R",
        help=f"fail the tool-reliability check when more than this share of turns lose their call (default "
             f"{DEFAULT_MAX_TOOL_LOSS_RATE:g}); the report gives the rate and its 95%% Wilson interval",
    )
    parser.add_argument(
        "--max-stream-silence-seconds",
        type=_positive(float, 0.01, 86_400),
        default=DEFAULT_MAX_STREAM_SILENCE_SECONDS,
        metavar="S",
        help=f"fail the stream-silence check when a stream is silent (no byte) longer than this: the idle timeout of "
             f"the proxy or load balancer in front of the server (default {DEFAULT_MAX_STREAM_SILENCE_SECONDS:g}, an "
             "AWS ALB's and nginx's default)",
    )
    parser.add_argument(
        "--silence-probe-tokens",
        type=_positive(int, 16, 65_536),
        default=DEFAULT_SILENCE_PROBE_TOKENS,
        metavar="N",
        help=f"length of the note the stream-silence check asks the model to save with a tool call, in the server's "
             f"tokens (default {DEFAULT_SILENCE_PROBE_TOKENS:,}); a parser that holds a call back is silent while the "
             "model writes it",
    )
    parser.add_argument(
        "--concurrency",
        type=_positive(int, 1, 256),
        default=8,
        metavar="N",
        help="concurrent streams of the throughput check (default 8)",
    )
    parser.add_argument(
        "--requests",
        type=_positive(int, 1, 1024),
        default=16,
        metavar="N",
        help="streams in all for the throughput check (default 16)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_positive(int, 1, 32_768),
        default=256,
        metavar="N",
        help="output tokens per throughput stream (default 256; EOS ignored)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=_positive(int, 1, 131_072),
        default=1024,
        metavar="N",
        help="prompt length per throughput stream, estimated tokens (default 1,024)",
    )
    parser.add_argument(
        "--min-output-tps",
        type=_positive(float, 0, 1e9),
        metavar="TPS",
        help="fail the throughput check below this many output tokens/s",
    )
    parser.add_argument(
        "--max-ttft-p95-seconds",
        type=_positive(float, 0, 1e6),
        metavar="S",
        help="fail the throughput check when TTFT p95 is above this",
    )
    parser.add_argument(
        "--timeout-seconds",
        type=_positive(float, 1, 86_400),
        default=600,
        metavar="S",
        help="timeout of each request (default 600; a long needle takes a while)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON for machines (cost.py --throughput-json reads it) instead of a table"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.model.strip():
        raise UsageError(f"--model: {args.model!r} is empty; give the served model name clients send (model.servedModelName)")
    check_base_url(args.base_url)
    shown_url = mask_url(args.base_url)
    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip())
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise UsageError(
            f"--checks: {args.checks!r} names no known check or an unknown one {unknown} (allowed: {', '.join(CHECKS)})"
        )
    window = (MODELS[args.model_profile].sparse_attention_tokens or 0) + NEEDLE_WINDOW_MARGIN_TOKENS
    if "needle" in checks and args.needle_tokens < 2 * window:
        raise UsageError(f"--needle-tokens: {args.needle_tokens:,} leaves no room for a fact outside the last {window:,} "
                         f"tokens before the question ({args.model_profile}'s sparse-attention window and a margin); "
                         f"pass at least {2 * window:,}")
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env: {args.api_key_env} is not set in the environment")
    else:
        api_key = os.environ.get(DEFAULT_API_KEY_ENV) or "EMPTY"
    opts = Options(
        model=args.model, checks=checks, profile=args.model_profile, api_key=api_key, base_url=args.base_url,
        timeout_seconds=args.timeout_seconds, needle_tokens=args.needle_tokens, needle_facts=args.needle_facts,
        effort_samples=args.effort_samples, tool_turns=args.tool_turns, max_tool_loss_rate=args.max_tool_loss_rate,
        max_stream_silence_seconds=args.max_stream_silence_seconds, silence_probe_tokens=args.silence_probe_tokens,
        concurrency=args.concurrency, requests=args.requests, max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
        min_output_tps=args.min_output_tps, max_ttft_p95_seconds=args.max_ttft_p95_seconds,
    )
    try:
        client = make_client(args.base_url, api_key, args.timeout_seconds)
    except Exception as err:  # noqa: BLE001 - the HTTP client rejects the URL (InvalidURL)
        if "URL" in type(err).__name__ or isinstance(err, ValueError):
            raise UsageError(f"--base-url: {shown_url!r} is not a valid URL ({one_line(err)[:80]})") from None
        raise
    unreachable = probe(client, min(PROBE_TIMEOUT_SECONDS, args.timeout_seconds))
    if unreachable is not None:
        message = (f"cannot connect to {shown_url}: {unreachable}. Is the server up and reachable from here? "
                   "An EC2 endpoint is private: start the Session Manager port forward (README, \"First day\") "
                   "and pass --base-url http://localhost:8000/v1; on the node, "
                   "`journalctl -u kimi-vllm.service -f` shows whether vLLM is still loading. On Kubernetes: "
                   f"`kubectl -n <namespace> port-forward svc/{VLLM_CLIENT_SERVICE} 8000:8000` (the client Service)")
        if args.json:
            print_json({"base_url": shown_url, "model": args.model, "ok": False, "error": message,
                        "checks": [asdict(CheckResult(n, SKIP, "not run: the endpoint cannot be reached")) for n in CHECKS]})
        print(f"error: {message}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    wrong_url = base_url_problem(client, shown_url)
    if wrong_url is not None:
        if args.json:
            print_json({"base_url": shown_url, "model": args.model, "ok": False, "error": wrong_url,
                        "checks": [asdict(CheckResult(n, SKIP, "not run: wrong base URL")) for n in CHECKS]})
        print(f"error: {wrong_url}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    if sys.stderr.isatty() and not args.json:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("validate", total=None)
            results = run_checks(client, opts, progress=lambda n, d, t: bar.update(task, description=n, completed=d, total=t))
    else:
        results = run_checks(client, opts)
    code = exit_code(r.status for r in results)
    if args.json:
        print_json({"base_url": shown_url, "model": args.model, "ok": code == 0, "checks": [asdict(r) for r in results]})
    else:
        print_table(f"Validate: {args.model} at {shown_url}", ("check", "status", "reason"),
                    [(r.name, r.status, r.reason) for r in results], status_column=1,
                    caption="result: " + ("FAILED" if code else "all selected checks passed"))
    return code


if __name__ == "__main__":
    sys.exit(run_cli(main))
