#!/usr/bin/env python3
"""Validate a deployed endpoint the way the model card asks before scaling up.

    python scripts/ops/validate.py --base-url http://10.0.1.23:8000/v1 --model kimi-k3.1-pro [--json]

Checks (``--checks`` picks some; all by default), built on the official ``openai`` client:
  tools             a request with tools returns tool_calls whose arguments are JSON matching the
                    schema, and no raw chat markup of the model profile in content or reasoning
  parallel-tools    a request that needs two calls gets two separate calls
  stream-tools      the same two requests streamed (as agents send them): tool_calls rebuilt from
                    the deltas are complete, separate, valid JSON, with no raw markup in the text
  concurrent-tools  --concurrency streams with tools at once, one city each: every stream gets a
                    complete call for its own city
  round-trip        the complete assistant message (content, reasoning, tool_calls) goes back with
                    the tool results; the next turn succeeds and uses them; the same turn 2 sent
                    without the reasoning must count fewer prompt tokens (else the server drops it)
  tool-ids          a second tool turn in the same conversation gets ids that differ from the
                    first turn's (agents key tool results by id)
  reasoning-effort  reasoning_effort low, high and max are accepted as a top-level field, and max
                    reasons more than low (else the server ignores the field)
  needle            one fact retrieved from a long haystack (default 128k tokens); fails when the
                    served max_model_len cannot hold it
  throughput        N concurrent streams: time to first token p50/p95, inter-token latency,
                    output tokens per second
  auth              without the API key, every route the server serves is refused (401/403) except
                    /health and /metrics: /v1, /invocations, /tokenize and the rest. Routes come from
                    the server's /openapi.json (read with the key), else a list of vLLM's; each is
                    probed with a method it does not accept, so nothing runs even where it is open
Request sizes follow the server: output budgets fit the max_model_len that /v1/models reports, and
prompt sizes in tokens use the server's own count (usage.prompt_tokens of two short probes).
Chat markup comes from the model profile (--model-profile; components/core/model.py), and each
failure names the server flag that most likely causes it.
Only the given base URL's server is contacted: first one GET /v1/models, so an endpoint that cannot
be reached fails at once with the reason (exit 1), a 404 there says in one line that --base-url
should probably end in /v1, and a model name the server does not serve fails every check with the
names it does serve. A password in the URL is shown as ***.
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
    "tools", "parallel-tools", "stream-tools", "concurrent-tools", "round-trip", "tool-ids", "reasoning-effort", "needle",
    "throughput", "auth",
)
EFFORTS: tuple[str, ...] = ("low", "high", "max")
DEFAULT_API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_PROFILE = "kimi-k3.1-pro"
DEFAULT_NEEDLE_TOKENS = 128 * 1024
# Before the server's own count is known (estimate for English prose).
CHARS_PER_TOKEN = 4
# Output budget of the functional checks: room for the reasoning at the default effort (max),
# never more than the server's max_model_len leaves (fit_output_tokens).
CHECK_MAX_TOKENS = 8192
# Room the needle's answer (reasoning + passphrase) needs besides the haystack.
NEEDLE_ANSWER_TOKENS = 2048
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
    needle_depth: float = 0.5
    concurrency: int = 8
    requests: int = 16
    max_tokens: int = 256
    prompt_tokens: int = 1024
    min_output_tps: float | None = None
    max_ttft_p95_seconds: float | None = None
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
        message = ""
        body = err.body if isinstance(err.body, dict) else {}
        if isinstance(body.get("error"), dict):
            message = body["error"].get("message", "")
        elif body.get("message"):
            message = body["message"]
        elif isinstance(body.get("error"), str):
            message = body["error"]
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


def _chat(client: Any, opts: Options, **kwargs: Any) -> Any:
    import openai

    if "max_tokens" not in kwargs:
        kwargs["max_tokens"] = fit_output_tokens(opts, _prompt_chars(kwargs))
    try:
        return client.chat.completions.create(model=opts.model, **kwargs)
    except openai.OpenAIError as err:
        raise CheckFailed(_describe_error(err)) from None


def served_models(client: Any) -> dict[str, int | None] | None:
    """``{model id: max_model_len or None}`` from ``/v1/models``, or None when it cannot be read."""
    try:
        data = client.models.list().data
    except Exception:  # noqa: BLE001 - an endpoint without /v1/models (or a 401): the checks say why
        return None
    out: dict[str, int | None] = {}
    for item in data:
        value = (item.model_extra or {}).get("max_model_len")
        out[item.id] = int(value) if value else None
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


def _validate_calls(calls: Sequence[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Parse and schema-check tool calls: (argument dicts, problems)."""
    import jsonschema

    parsed, problems = [], []
    for call in calls:
        fn = call.function
        if fn.name != "get_weather":
            problems.append(f"unknown function {fn.name!r}")
            continue
        try:
            args = json.loads(fn.arguments)
        except (TypeError, ValueError):
            problems.append(f"arguments are not JSON: {one_line(fn.arguments)[:80]!r}")
            continue
        try:
            jsonschema.validate(args, WEATHER_SCHEMA)
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


EFFORT_PROMPT = "What is 17 times 23? Reply with the number only."


def check_reasoning_effort(client: Any, opts: Options) -> CheckResult:
    name = "reasoning-effort"
    failures, seconds, reasoning = [], {}, {}
    for effort in EFFORTS:
        started = time.monotonic()
        try:
            resp = _chat(client, opts, messages=[{"role": "user", "content": EFFORT_PROMPT}], reasoning_effort=effort)
            if not resp.choices:
                failures.append(f"{effort}: no choices")
            else:
                msg = resp.choices[0].message
                leak = markup_leak(opts.model_profile, msg.content, reasoning_of(msg)[1])
                if leak:
                    return CheckResult(name, FAIL, f"{effort}: {leak}")
                details = getattr(resp.usage, "completion_tokens_details", None) if resp.usage else None
                tokens = getattr(details, "reasoning_tokens", None) if details else None
                text = reasoning_of(msg)[1] or ""
                reasoning[effort] = {"reasoning_tokens": tokens, "reasoning_chars": len(text)}
        except CheckFailed as err:
            failures.append(f"{effort}: {err}")
        seconds[effort] = round(time.monotonic() - started, 2)
    metrics = {"seconds": seconds, "reasoning": reasoning}
    if failures:
        return CheckResult(name, FAIL, "rejected " + "; ".join(failures), metrics)
    if not any(r["reasoning_chars"] for r in reasoning.values()):
        return CheckResult(name, FAIL, f"no reasoning at any effort: {no_reasoning_cause(opts.model_profile)}", metrics)
    unit = "reasoning_tokens" if all(r["reasoning_tokens"] for r in reasoning.values()) else "reasoning_chars"
    low, high = int(reasoning["low"][unit] or 0), int(reasoning["max"][unit] or 0)
    label = unit.replace("_", " ")
    if high <= low:
        return CheckResult(
            name, FAIL,
            f"reasoning_effort has no effect ({low} {label} at low, {high} at max): the server ignores the field "
            "(for Kimi K3 vLLM maps it to thinking_effort in tokenizer mode kimi_k3, which the checkpoint's "
            "architecture selects; is --tokenizer-mode overridden?)",
            metrics,
        )
    return CheckResult(name, PASS, f"{', '.join(EFFORTS)} accepted; max reasons more than low ({high} vs {low} {label})", metrics)


_WORDS = (
    "river harbor lantern meadow copper signal orchard valley engine canvas granite ledger beacon "
    "compass thunder willow marble circuit window garden silver market bridge planet quiet rapid "
    "gentle narrow ancient modern distant bright hollow steady cloud forest paper stone winter summer "
    "morning evening station village railway journey letter theory measure pattern"
).split()


def haystack(chars: int, needle: str, depth: float, seed: int) -> str:
    """About ``chars`` characters of filler prose with ``needle`` at ``depth`` (0 start, 1 end)."""
    rng = random.Random(seed)
    sentences, size = [], 0
    while size < chars:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 16))]
        sentence = " ".join(words).capitalize() + ". "
        sentences.append(sentence)
        size += len(sentence)
    if needle:
        sentences.insert(int(len(sentences) * depth), needle + " ")
    return "".join(sentences)


def check_needle(client: Any, opts: Options) -> CheckResult:
    name = "needle"
    rng = random.Random(opts.seed + 2)
    code = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(1000, 9999)}"
    needle = f"The secret passphrase for the vault is {code}."
    target = opts.needle_tokens
    limit = opts.facts.max_model_len
    if limit is not None and target + NEEDLE_ANSWER_TOKENS > limit:
        return CheckResult(
            name, FAIL,
            f"the served max_model_len is {limit:,} tokens, below the {target:,}-token needle + {NEEDLE_ANSWER_TOKENS:,} for "
            f"the answer: is the server's --max-model-len the planned one? (or pass --needle-tokens "
            f"{max(1024, limit - NEEDLE_ANSWER_TOKENS):,})",
            {"target_tokens": target, "max_model_len": limit},
        )
    cpt = measure_chars_per_token(client, opts)
    text = haystack(int(target * cpt), needle, opts.needle_depth, opts.seed)
    question = "\n\nWhat is the secret passphrase for the vault mentioned in the text above? Reply with the passphrase only."
    started = time.monotonic()
    resp = _chat(client, opts, messages=[{"role": "user", "content": text + question}],
                 max_tokens=fit_output_tokens(opts, len(text), CHECK_MAX_TOKENS))
    seconds = round(time.monotonic() - started, 2)
    msg = resp.choices[0].message
    answer = msg.content or ""
    prompt_tokens = resp.usage.prompt_tokens if resp.usage else None
    metrics = {"target_tokens": target, "prompt_tokens": prompt_tokens, "chars_per_token": cpt, "depth": opts.needle_depth,
               "seconds": seconds}
    leak = markup_leak(opts.model_profile, answer, reasoning_of(msg)[1])
    if leak:
        return CheckResult(name, FAIL, leak, metrics)
    size = f"{prompt_tokens:,} prompt tokens" if prompt_tokens else f"~{target:,} tokens"
    if code.lower() not in answer.lower():
        return CheckResult(name, FAIL, f"needle not found in {size}: answered {one_line(answer)[:60]!r}", metrics)
    return CheckResult(name, PASS, f"needle found in {size} at depth {opts.needle_depth:.0%} ({seconds:.1f} s)", metrics)


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


def stream_tool_calls(client: Any, opts: Options, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed chat request with the weather tool; the reply rebuilt from its deltas.

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
        stream = client.chat.completions.create(
            model=opts.model, messages=messages, tools=[WEATHER_TOOL], tool_choice="auto", stream=True,
            max_tokens=fit_output_tokens(opts, _prompt_chars({"messages": messages, "tools": [WEATHER_TOOL]})),
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


# -- auth ------------------------------------------------------------------------------------------


def root_url(base_url: str) -> str:
    """The server's root: ``base_url`` without a trailing ``/v1``."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _http(method: str, url: str, *, api_key: str | None = None, body: dict[str, Any] | None = None,
          timeout_seconds: float = 30) -> tuple[int, bytes]:
    """(status, body) of one request; 0 when the connection failed."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, method=method, data=data)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as resp:
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


def check_auth(client: Any, opts: Options) -> CheckResult:  # noqa: ARG001 - plain HTTP, no OpenAI client
    name = "auth"
    root = root_url(opts.base_url or "")
    routes, source = served_routes(opts)
    open_routes: list[str] = []
    probed = 0
    for path, methods in sorted(routes.items()):
        if path in OPEN_PATHS:
            continue
        # A method the route does not accept: a guard answers 401 before routing; an open route
        # answers 405 from the router, so nothing runs either way.
        method = next(m for m in ("DELETE", "PUT", "PATCH", "GET", "POST") if m not in methods)
        status, _ = _http(method, root + re.sub(r"\{[^}]+\}", "validate-probe", path),
                          timeout_seconds=min(opts.timeout_seconds, 30))
        if status == 0:
            raise CheckFailed(f"cannot connect to {root} for the route probes")
        probed += 1
        if status not in (401, 403, 404):
            open_routes.append(path)
    # And inference itself, without the key, on the two routes that serve chat.
    chat = {"model": opts.model, "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 1}
    served = [path for path in ("/v1/chat/completions", "/invocations")
              if _http("POST", root + path, body=chat, timeout_seconds=opts.timeout_seconds)[0] == 200]
    metrics = {"routes_probed": probed, "open_routes": open_routes, "served_without_key": served, "source": source}
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
    """One line when ``GET <base-url>/models`` answers 404 (a base URL without ``/v1`` is the
    usual cause), else None. Other answers are left to the checks."""
    import openai

    try:
        client.models.list()
    except openai.NotFoundError:
        hint = (
            "should --base-url end in /v1?"
            if not shown_url.rstrip("/").endswith("/v1")
            else "is this an OpenAI-compatible server?"
        )
        return f"GET {shown_url.rstrip('/')}/models answered 404: {hint} (e.g. http://HOST:8000/v1)"
    except openai.OpenAIError:
        return None
    return None


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
    "concurrent-tools": check_concurrent_tools,
    "round-trip": check_round_trip,
    "tool-ids": check_tool_ids,
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
        result.metrics.setdefault("check_seconds", round(time.monotonic() - started, 2))
        results.append(result)
    return results


def make_client(base_url: str, api_key: str, timeout_seconds: float) -> Any:
    """The official OpenAI client for ``base_url`` (no retries: a failure is the result)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_seconds)



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

    try:
        client.with_options(timeout=timeout_seconds).models.list()
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
        description="Validate a deployed OpenAI-compatible endpoint: tool calls (single, parallel, streamed, concurrent), "
        "the multi-turn reasoning round trip, tool-call ids across turns, reasoning_effort, a long-context needle, "
        "throughput and latency, and that every route but /health and /metrics needs the API key.",
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
        "--needle-depth",
        type=_positive(float, 0, 1),
        default=0.5,
        metavar="F",
        help="where the needle sits, 0 = start, 1 = end (default 0.5)",
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
    check_base_url(args.base_url)
    shown_url = mask_url(args.base_url)
    checks = tuple(c.strip() for c in args.checks.split(",") if c.strip())
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise UsageError(
            f"--checks: {args.checks!r} names no known check or an unknown one {unknown} (allowed: {', '.join(CHECKS)})"
        )
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise UsageError(f"--api-key-env: {args.api_key_env} is not set in the environment")
    else:
        api_key = os.environ.get(DEFAULT_API_KEY_ENV) or "EMPTY"
    opts = Options(
        model=args.model, checks=checks, profile=args.model_profile, api_key=api_key, base_url=args.base_url,
        timeout_seconds=args.timeout_seconds, needle_tokens=args.needle_tokens, needle_depth=args.needle_depth,
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
