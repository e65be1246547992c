#!/usr/bin/env python3
"""Validate a deployed endpoint the way the model card asks before scaling up.

    python scripts/validate.py --base-url http://10.0.1.23:8000/v1 --model kimi-k3.1-pro [--json]

Checks (``--checks`` picks some; all by default), built on the official ``openai`` client:
  tools             a request with tools returns tool_calls whose arguments are JSON matching the
                    schema, and no raw tool-call tokens in content
  parallel-tools    a request that needs two calls gets two separate calls
  stream-tools      the same two requests streamed (as agents send them): tool_calls rebuilt from
                    the deltas are complete, separate, valid JSON, with no raw tool tokens in content
  concurrent-tools  --concurrency streams with tools at once, one city each: every stream gets a
                    complete call for its own city
  round-trip        the complete assistant message (content, reasoning_content, tool_calls) goes
                    back with the tool results; the next turn succeeds and uses them; the same
                    turn 2 sent without reasoning_content must count fewer prompt tokens (else
                    the server drops it, however short the reasoning)
  reasoning-effort  reasoning_effort low, high and max are accepted as a top-level field
  needle            one fact retrieved from a long haystack (default 128k tokens, capped at the
                    served max_model_len)
  throughput        N concurrent streams: time to first token p50/p95, inter-token latency,
                    output tokens per second
Only the given base URL is contacted: first one GET /v1/models, so an endpoint that cannot be reached
fails at once with the reason (exit 1), and a 404 there says in one line that --base-url should
probably end in /v1. A password in the URL is shown as ***.
Exit codes: 0 all passed, 1 a check failed or the endpoint cannot be reached, 2 usage error.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.naming import VLLM_CLIENT_SERVICE
from scripts._cli import (
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

REPO_ROOT = Path(__file__).resolve().parents[1]

CHECKS: tuple[str, ...] = (
    "tools", "parallel-tools", "stream-tools", "concurrent-tools", "round-trip", "reasoning-effort", "needle", "throughput",
)
EFFORTS: tuple[str, ...] = ("low", "high", "max")
DEFAULT_API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_NEEDLE_TOKENS = 128 * 1024
CHARS_PER_TOKEN = 4  # estimate for English prose; the server's usage gives the real count
# Output budget of the functional checks: room for the reasoning at the default effort (max).
CHECK_MAX_TOKENS = 8192
# Kimi's tool-call markers (and any <|...tool...|> token) must never reach content.
RAW_TOOL_TOKEN_RE = re.compile(r"<\|[^|<>]*tool[^|<>]*\|>|tool_calls?_section")

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


@dataclass(frozen=True)
class Options:
    """What to run and how hard (see ``--help``)."""

    model: str
    checks: tuple[str, ...] = CHECKS
    needle_tokens: int = DEFAULT_NEEDLE_TOKENS
    needle_depth: float = 0.5
    concurrency: int = 8
    requests: int = 16
    max_tokens: int = 256
    prompt_tokens: int = 1024
    min_output_tps: float | None = None
    max_ttft_p95_seconds: float | None = None
    seed: int = 0


class CheckFailed(Exception):
    """A check's request failed; ``str(err)`` is the one-line reason."""


def _describe_error(err: Exception) -> str:
    import openai

    if isinstance(err, openai.APIStatusError):
        message = ""
        body = err.body if isinstance(err.body, dict) else {}
        if isinstance(body.get("error"), dict):
            message = body["error"].get("message", "")
        elif body.get("message"):
            message = body["message"]
        return f"HTTP {err.status_code}: {one_line(message or err.message)[:200]}"
    if isinstance(err, openai.APITimeoutError):
        return "request timed out"
    if isinstance(err, openai.APIConnectionError):
        return f"cannot connect: {one_line(err.__cause__ or err)[:160]}"
    return f"{type(err).__name__}: {one_line(err)[:200]}"


def _chat(client: Any, opts: Options, **kwargs: Any) -> Any:
    import openai

    kwargs.setdefault("max_tokens", CHECK_MAX_TOKENS)
    try:
        return client.chat.completions.create(model=opts.model, **kwargs)
    except openai.OpenAIError as err:
        raise CheckFailed(_describe_error(err)) from None


def reasoning_of(message: Any) -> tuple[str | None, str | None]:
    """``(field name, text)`` of the reasoning in a response message or delta: vLLM's
    ``reasoning_content`` or the newer ``reasoning``; ``(None, None)`` when absent."""
    extra = getattr(message, "model_extra", None) or {}
    for name in ("reasoning_content", "reasoning"):
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
    _, reasoning = reasoning_of(msg)
    leaked = RAW_TOOL_TOKEN_RE.search(content) or RAW_TOOL_TOKEN_RE.search(reasoning or "")
    if leaked:
        return CheckResult(
            name, FAIL, f"raw tool-call tokens in the response text ({leaked.group(0)!r}): is --tool-call-parser kimi_k3 set?"
        )
    calls = msg.tool_calls or []
    if not calls:
        return CheckResult(
            name, FAIL, f"no tool_calls (finish_reason {choice.finish_reason}); content: {one_line(content)[:80]!r}"
        )
    parsed, problems = _validate_calls(calls)
    if problems:
        return CheckResult(name, FAIL, problems[0])
    if not any(a.get("city", "").lower() == "paris" for a in parsed):
        return CheckResult(name, FAIL, f"the call does not ask for Paris: {json.dumps(parsed)[:100]}")
    return CheckResult(
        name, PASS, f"{len(calls)} tool call(s), arguments valid JSON matching the schema, finish_reason {choice.finish_reason}"
    )


def check_parallel_tools(client: Any, opts: Options) -> CheckResult:
    name = "parallel-tools"
    resp = _chat(
        client,
        opts,
        messages=[
            {
                "role": "user",
                "content": "Compare the current weather in Paris and in Tokyo. Call get_weather once for each city, both calls "
                           "in this turn.",
            }
        ],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    calls = resp.choices[0].message.tool_calls or []
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


def check_round_trip(client: Any, opts: Options) -> CheckResult:
    name = "round-trip"
    rng = random.Random(opts.seed + 1)
    observation = f"WX-{rng.randrange(1000, 9999)}"
    user = {
        "role": "user",
        "content": "What is the weather in Paris? Use get_weather, then tell me the temperature and the observation_id it "
                   "returns.",
    }
    first = _chat(client, opts, messages=[user], tools=[WEATHER_TOOL], tool_choice="auto")
    msg = first.choices[0].message
    calls = msg.tool_calls or []
    if not calls:
        return CheckResult(name, FAIL, "turn 1 returned no tool_calls (see the tools check)")
    field_name, reasoning = reasoning_of(msg)
    if field_name is None or not reasoning:  # reasoning_of gives both or neither
        return CheckResult(name, FAIL, "turn 1 returned no reasoning_content: is --reasoning-parser kimi_k3 set?")
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": msg.content or "",
        "reasoning_content": reasoning,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in calls
        ],
    }
    if field_name != "reasoning_content":
        assistant[field_name] = reasoning  # send back whichever field the server used, too
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": 17.5, "observation_id": observation})}
        for c in calls
    ]
    second = _chat(client, opts, messages=[user, assistant, *results], tools=[WEATHER_TOOL], tool_choice="auto")
    reply = second.choices[0].message
    if reply.tool_calls:
        return CheckResult(name, FAIL, "turn 2 asked for the tool again instead of using its result")
    if observation not in (reply.content or ""):
        return CheckResult(
            name, FAIL, f"turn 2 does not use the tool result ({observation} missing): {one_line(reply.content or '')[:80]!r}"
        )
    # The same turn 2 without the reasoning: a server that reads reasoning_content counts more
    # prompt tokens with it; one that drops it counts the same, however short the reasoning is.
    stripped = {k: v for k, v in assistant.items() if k not in ("reasoning_content", "reasoning")}
    without = _chat(client, opts, messages=[user, stripped, *results], tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=1)
    with_tokens = second.usage.prompt_tokens if second.usage else None
    without_tokens = without.usage.prompt_tokens if without.usage else None
    metrics: dict[str, Any] = {"turn2_prompt_tokens": with_tokens, "turn2_prompt_tokens_without_reasoning": without_tokens,
                               "reasoning_chars": len(reasoning)}
    if with_tokens is None or without_tokens is None:
        return CheckResult(name, FAIL, "no usage in the turn-2 responses: cannot tell whether reasoning_content is kept", metrics)
    if with_tokens <= without_tokens:
        return CheckResult(
            name, FAIL,
            f"turn 2 counts {with_tokens} prompt tokens with reasoning_content and {without_tokens} without: "
            "the server drops the returned reasoning_content",
            metrics,
        )
    return CheckResult(
        name, PASS, f"{len(calls)} tool result(s) returned with reasoning ({field_name}); turn 2 used them", metrics
    )


def check_reasoning_effort(client: Any, opts: Options) -> CheckResult:
    name = "reasoning-effort"
    failures, seconds = [], {}
    for effort in EFFORTS:
        started = time.monotonic()
        try:
            resp = _chat(
                client, opts, messages=[{"role": "user", "content": "Reply with the single word: ok"}], reasoning_effort=effort
            )
            if not resp.choices:
                failures.append(f"{effort}: no choices")
        except CheckFailed as err:
            failures.append(f"{effort}: {err}")
        seconds[effort] = round(time.monotonic() - started, 2)
    if failures:
        return CheckResult(name, FAIL, "rejected " + "; ".join(failures), {"seconds": seconds})
    return CheckResult(name, PASS, f"{', '.join(EFFORTS)} accepted as top-level reasoning_effort", {"seconds": seconds})


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
    sentences.insert(int(len(sentences) * depth), needle + " ")
    return "".join(sentences)


def served_max_model_len(client: Any, model: str) -> int | None:
    """``max_model_len`` vLLM reports in /v1/models for ``model``, or None."""
    try:
        for item in client.models.list().data:
            if item.id == model:
                value = (item.model_extra or {}).get("max_model_len")
                return int(value) if value else None
    except Exception:  # noqa: BLE001 - an endpoint without /v1/models: use the flag as given
        return None
    return None


def check_needle(client: Any, opts: Options) -> CheckResult:
    name = "needle"
    rng = random.Random(opts.seed + 2)
    code = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}-{rng.randrange(1000, 9999)}"
    needle = f"The secret passphrase for the vault is {code}."
    target, note = opts.needle_tokens, ""
    limit = served_max_model_len(client, opts.model)
    if limit is not None and target > limit - 2048:
        target, note = max(1024, limit - 2048), f" (capped at the served max_model_len {limit:,} - 2,048)"
    text = haystack(target * CHARS_PER_TOKEN, needle, opts.needle_depth, opts.seed)
    question = "\n\nWhat is the secret passphrase for the vault mentioned in the text above? Reply with the passphrase only."
    started = time.monotonic()
    resp = _chat(client, opts, messages=[{"role": "user", "content": text + question}])
    seconds = round(time.monotonic() - started, 2)
    answer = resp.choices[0].message.content or ""
    prompt_tokens = resp.usage.prompt_tokens if resp.usage else None
    metrics = {"target_tokens": target, "prompt_tokens": prompt_tokens, "depth": opts.needle_depth, "seconds": seconds}
    size = f"{prompt_tokens:,} prompt tokens" if prompt_tokens else f"~{target:,} tokens"
    if code.lower() not in answer.lower():
        return CheckResult(name, FAIL, f"needle not found in {size}{note}: answered {one_line(answer)[:60]!r}", metrics)
    return CheckResult(name, PASS, f"needle found in {size} at depth {opts.needle_depth:.0%}{note} ({seconds:.1f} s)", metrics)


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
            model=opts.model, messages=[{"role": "user", "content": prompt}], max_tokens=opts.max_tokens,
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
    filler = haystack(opts.prompt_tokens * CHARS_PER_TOKEN, "", 0, opts.seed + 3)
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
            max_tokens=CHECK_MAX_TOKENS,
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


def streamed_call_problem(reply: dict[str, Any], cities: Sequence[str]) -> str | None:
    """Why a streamed reply is not one complete call per city in ``cities`` (None when it is):
    raw tool tokens in the text, no call, an empty call (no id, name or arguments), merged or
    broken arguments (not JSON, not the schema), a city missing or asked for twice."""
    leaked = RAW_TOOL_TOKEN_RE.search(reply["content"]) or RAW_TOOL_TOKEN_RE.search(reply["reasoning"])
    if leaked:
        return f"raw tool-call tokens in the streamed text ({leaked.group(0)!r})"
    calls = reply["calls"]
    if not calls:
        return (
            f"no tool_calls in the stream (finish_reason {reply['finish_reason']}); content: {one_line(reply['content'])[:80]!r}"
        )
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
        (
            ("Paris", "Tokyo"),
            "Compare the current weather in Paris and in Tokyo. Call get_weather once for each city, both calls in this turn.",
        ),
    )
    for cities, prompt in cases:
        reply = stream_tool_calls(client, opts, [{"role": "user", "content": prompt}])
        problem = streamed_call_problem(reply, cities)
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
                problem = streamed_call_problem(future.result(), (city,))
            except CheckFailed as err:
                problem = str(err)
            if problem:
                problems.append(f"stream {i + 1} ({city}): {problem}")
    if problems:
        return CheckResult(
            name, FAIL, f"{len(problems)} of {n} concurrent tool streams wrong; first: {sorted(problems)[0]}", {"streams": n}
        )
    return CheckResult(name, PASS, f"{n} concurrent tool streams, each a complete call for its own city", {"streams": n})


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


RUNNERS: dict[str, Callable[..., CheckResult]] = {
    "tools": check_tools,
    "parallel-tools": check_parallel_tools,
    "stream-tools": check_stream_tools,
    "concurrent-tools": check_concurrent_tools,
    "round-trip": check_round_trip,
    "reasoning-effort": check_reasoning_effort,
    "needle": check_needle,
    "throughput": check_throughput,
}


def run_checks(client: Any, opts: Options, *, progress: Callable[[str, int, int], None] | None = None) -> list[CheckResult]:
    """Run ``opts.checks`` in ``CHECKS`` order; a check that cannot complete fails with its reason."""
    results = []
    for name in CHECKS:
        if name not in opts.checks:
            results.append(CheckResult(name, SKIP, "not selected (--checks)"))
            continue
        try:
            if name == "throughput":
                result = check_throughput(client, opts, functools.partial(progress, name) if progress else None)
            else:
                if progress:
                    progress(name, 0, 1)
                result = RUNNERS[name](client, opts)
        except CheckFailed as err:
            result = CheckResult(name, FAIL, str(err))
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
        prog=prog_name("scripts/validate.py"),
        description="Validate a deployed OpenAI-compatible endpoint: tool calls, multi-turn reasoning round trip, "
        "reasoning_effort, long-context needle, throughput and latency.",
        epilog="Exit codes: 0 all selected checks passed, 1 a check failed or the endpoint cannot be reached "
        "(one GET /v1/models is tried first), 2 usage error. "
        "Example: python scripts/validate.py --base-url http://10.0.1.23:8000/v1 --model kimi-k3.1-pro --json > validate.json",
    )
    parser.add_argument(
        "--base-url", required=True, help="the endpoint's OpenAI base URL, e.g. http://HOST:8000/v1 (the only address contacted)"
    )
    parser.add_argument(
        "--model", required=True, help="the served model name clients send (stack's model.servedModelName, e.g. kimi-k3.1-pro)"
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
        help=f"haystack length in tokens (~{CHARS_PER_TOKEN} characters each; default {DEFAULT_NEEDLE_TOKENS:,}, capped at the "
             "served max_model_len)",
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
        model=args.model, checks=checks, needle_tokens=args.needle_tokens, needle_depth=args.needle_depth,
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
