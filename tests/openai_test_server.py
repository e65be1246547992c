"""A tiny OpenAI-compatible chat server for testing scripts/validate.py, with switches that make
it misbehave the way Kimi deployments are known to (public bug reports against vLLM's Kimi parsers).

It answers like vLLM with the kimi_k3 parsers: ``reasoning_content`` beside ``content``,
``tool_calls`` for any city it finds in the last user message (one call per city), a final
answer quoting the tool result after a tool turn, the needle's value when the haystack holds
one, and streaming with a final usage chunk. Token counts are characters / 4.

Misbehaviours (``OpenAITestServer(misbehave={...})``):
  raw-tool-tokens   tool calls are parsed but the raw tool-call tokens also leak into ``content``
                    (non-streamed)
  merge-tool-calls  several calls come back as one call with concatenated arguments (non-streamed)
  stream-merge-tool-calls  streamed: every call's deltas carry index 0, so a client rebuilds one
                    call with the ids overwritten and the arguments concatenated
  concurrent-mixup  streamed tool requests that overlap in time get the city of another request
  drop-reasoning    ``reasoning_content`` of a returned assistant message is ignored
  drop-short-reasoning  the same, only when the reasoning is shorter than 400 characters (what a
                    prompt-size heuristic misses: the tool results hide it)
  miss-needle       the needle is never found
  reject-effort     ``reasoning_effort: max`` is answered with HTTP 400
  error-stream      streaming requests without tools are answered with HTTP 503
Bound to 127.0.0.1 on a free port; ``with OpenAITestServer() as server: server.base_url``.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MISBEHAVIOURS = ("raw-tool-tokens", "merge-tool-calls", "stream-merge-tool-calls", "concurrent-mixup", "drop-reasoning",
                 "drop-short-reasoning", "miss-needle", "reject-effort", "error-stream")
SHORT_REASONING_CHARS = 400
CITIES = ("Paris", "Tokyo", "Berlin", "Lima")
REASONING = "The user wants weather data; I should call the weather tool for each city mentioned, then report. " * 2
NEEDLE_RE = re.compile(r"The secret passphrase for the vault is ([A-Za-z0-9-]+)\.")
RAW_TOOL_TOKENS = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_end|><|tool_calls_section_end|>"
)


def tokens(text: str | None) -> int:
    return math.ceil(len(text or "") / 4)


class OpenAITestServer:
    """The server; ``requests`` records every request body received (for assertions)."""

    def __init__(
        self,
        model: str = "kimi-k3.1-pro",
        *,
        api_key: str | None = None,
        misbehave: set[str] | frozenset[str] = frozenset(),
        max_model_len: int = 1_048_576,
        token_delay_seconds: float = 0.001,
    ):
        unknown = set(misbehave) - set(MISBEHAVIOURS)
        if unknown:
            raise ValueError(f"unknown misbehaviour {sorted(unknown)} (known: {', '.join(MISBEHAVIOURS)})")
        self.model, self.api_key, self.misbehave = model, api_key, frozenset(misbehave)
        self.max_model_len, self.token_delay_seconds = max_model_len, token_delay_seconds
        self.requests: list[dict[str, Any]] = []
        self.issued_reasoning: dict[str, str] = {}  # tool call id -> reasoning sent with it
        self._tool_streams_in_flight = 0
        self._last_tool_stream_city: str | None = None
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAITestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- behaviour ---------------------------------------------------------------------------

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        count = tokens(json.dumps(body.get("tools") or []))
        for message in body.get("messages", []):
            count += 4 + tokens(
                message.get("content") if isinstance(message.get("content"), str) else json.dumps(message.get("content"))
            )
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            dropped = "drop-reasoning" in self.misbehave or (
                "drop-short-reasoning" in self.misbehave and len(reasoning) < SHORT_REASONING_CHARS)
            if message.get("role") == "assistant" and not dropped:
                count += tokens(reasoning)
            for call in message.get("tool_calls") or []:
                count += tokens(call["function"]["name"]) + tokens(call["function"]["arguments"])
        return count

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, message dict or error) for a chat request."""
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in ("low", "medium", "high", "max"):
            return 400, {"error": {"message": f"reasoning_effort {effort!r} is not valid", "type": "BadRequestError"}}
        if effort == "max" and "reject-effort" in self.misbehave:
            return 400, {"error": {"message": "reasoning_effort must be one of low, medium, high", "type": "BadRequestError"}}
        messages = body.get("messages", [])
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            results = [m.get("content", "") for m in messages if m.get("role") == "tool"]
            return 200, {"role": "assistant", "reasoning_content": "I have the tool result; answer with it.",
                         "content": "Here is what the tool said: " + " | ".join(results)}
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        needle = NEEDLE_RE.search(text)
        if needle or "passphrase" in text:
            if needle and "miss-needle" not in self.misbehave:
                return 200, {"role": "assistant", "reasoning_content": "Found it in the text.", "content": needle.group(1)}
            return 200, {"role": "assistant", "reasoning_content": "Searching.", "content": "I could not find a passphrase."}
        cities = [c for c in CITIES if c in text]
        if body.get("tools") and cities:
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": c, "unit": "celsius"})},
                }
                for c in cities
            ]
            if "merge-tool-calls" in self.misbehave and len(calls) > 1 and not body.get("stream"):
                calls = [
                    {
                        **calls[0],
                        "function": {"name": "get_weather", "arguments": "".join(c["function"]["arguments"] for c in calls)},
                    }
                ]
            with self._lock:
                for call in calls:
                    self.issued_reasoning[call["id"]] = REASONING
            content = RAW_TOOL_TOKENS if "raw-tool-tokens" in self.misbehave and not body.get("stream") else None
            return 200, {"role": "assistant", "reasoning_content": REASONING, "content": content, "tool_calls": calls}
        words = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        return 200, {"role": "assistant", "reasoning_content": "Thinking briefly.", "content": " ".join(["word"] * words)}

    def mix_up(self, body: dict[str, Any]) -> dict[str, Any]:
        """concurrent-mixup: a streamed tool request that overlaps another gets the other's city."""
        text = body["messages"][-1].get("content") or ""
        own = next((c for c in CITIES if c in text), None)
        with self._lock:
            self._tool_streams_in_flight += 1
            other, self._last_tool_stream_city = self._last_tool_stream_city, own
        try:
            time.sleep(0.3)  # long enough for requests sent together to overlap
            with self._lock:
                overlapping = self._tool_streams_in_flight > 1
        finally:
            with self._lock:
                self._tool_streams_in_flight -= 1
        if not overlapping or not own or not other or other == own:
            return body
        last = {**body["messages"][-1], "content": text.replace(own, other)}
        return {**body, "messages": [*body["messages"][:-1], last]}

    # -- HTTP --------------------------------------------------------------------------------

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if server.api_key and self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._json(401, {"error": {"message": "invalid API key", "type": "AuthenticationError"}})
                    return False
                return True

            def do_GET(self) -> None:  # noqa: N802
                if not self._authorized():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": "vllm", "max_model_len": server.max_model_len}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "not found"}})
                    return
                with server._lock:
                    server.requests.append(body)
                if body.get("model") != server.model:
                    self._json(
                        404, {"error": {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError"}}
                    )
                    return
                if body.get("stream") and not body.get("tools") and "error-stream" in server.misbehave:
                    self._json(503, {"error": {"message": "overloaded", "type": "ServiceUnavailableError"}})
                    return
                if body.get("stream") and body.get("tools") and "concurrent-mixup" in server.misbehave:
                    body = server.mix_up(body)
                status, message = server.reply(body)
                if status != 200:
                    self._json(status, message)
                    return
                usage = {"prompt_tokens": server.prompt_tokens(body)}
                usage["completion_tokens"] = (
                    tokens(message.get("reasoning_content"))
                    + tokens(message.get("content"))
                    + sum(
                        tokens(c["function"]["name"]) + tokens(c["function"]["arguments"])
                        for c in message.get("tool_calls") or []
                    )
                )
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
                if not body.get("stream"):
                    self._json(200, {"id": rid, "object": "chat.completion", "created": created, "model": server.model,
                                     "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

                def send(chunk: dict[str, Any]) -> None:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": server.model}
                send({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
                pieces: list[dict[str, Any]] = [{"reasoning_content": message.get("reasoning_content") or ""}]
                pieces += [{"content": w + " "} for w in (message.get("content") or "").split()]
                for i, call in enumerate(message.get("tool_calls") or []):
                    # vLLM's streamed tool calls: the id and name first, then argument pieces.
                    index = 0 if "stream-merge-tool-calls" in server.misbehave else i
                    fn, args = call["function"], call["function"]["arguments"]
                    pieces.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                                   "function": {"name": fn["name"], "arguments": ""}}]})
                    half = len(args) // 2
                    for part in (args[:half], args[half:]):
                        pieces.append({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                for delta in pieces:
                    time.sleep(server.token_delay_seconds)
                    send({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    send({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
