"""A tiny OpenAI-compatible chat server for testing scripts/ops/validate.py against faults the real
engine cannot be made to show (the real one: tests/real_vllm, tests/test_real_engine.py).

Its wire format is the real server's, as vLLM 0.32/0.33 with the kimi_k3 parsers send it (and
tests/test_real_engine.py keeps it so): the reasoning in ``reasoning``; non-streamed messages with
``role, content, refusal, annotations, audio, function_call, [tool_calls], reasoning``; streams that
open with ``{"role": "assistant", "content": ""}``, then reasoning deltas, then content deltas or
each tool call WHOLE in one delta (``content: null``, id, type, index, name and complete
arguments; vLLM 0.34.0's K3 parser emits a call when its close marker arrives), then an empty
delta with ``finish_reason``, then a usage chunk with ``completion_tokens_details.reasoning_tokens``.
Every route but ``/health`` and ``/metrics`` needs the API key (as behind the API guard). Replies:
``tool_calls`` for each city named in the last user message (of the function ``tool_choice``
names, else the one the message names, else the first; none for ``tool_choice: none``), a note
("Note: ...") saved whole, the tool result quoted after a tool turn, every vault code the needle
check's haystack states, longer reasoning for a higher ``reasoning_effort`` (K3.1's low < medium
< high < max). Token counts are characters / 4.

Misbehaviours (``OpenAITestServer(misbehave={...})``), each a public report the real engine here
cannot reproduce; each fails one check of validate:
  merge-tool-calls  several calls come back as one call with concatenated arguments (non-streamed)
  stream-merge-tool-calls  streamed: every call's delta carries index 0, so a client rebuilds one
                    call with the ids overwritten and the arguments concatenated
  hold-tool-calls   streamed: a tool call is held back ``hold_seconds`` after the reasoning, then
                    sent whole (vLLM PR #50628/#50604; a proxy's idle timeout cuts such a stream)
  concurrent-mixup  streamed tool requests that overlap in time get the city of another request
                    (not in agent conversations, which carry a system message)
  ignore-tool-choice  tool_choice none and a named function are treated as auto
  unforced-required tool_choice required is answered without a call when the prompt names no tool
  repeat-tool-ids   tool-call ids restart in every reply (``functions.get_weather:0``), so a later
                    turn repeats an earlier turn's id
  lose-tool-calls   in agent conversations (requests with a system message) every 10th call goes
                    into the content (raw XTML) or the reasoning instead of tool_calls, alternately
  drop-reasoning    the ``reasoning`` of a returned assistant message is ignored
  drop-short-reasoning  the same, only when the reasoning is shorter than 400 characters (what a
                    prompt-size heuristic misses: the tool results hide it)
  ignore-effort     ``reasoning_effort`` is accepted and has no effect on the reasoning
  noisy-effort      the reasoning's length is random (seeded by the request) and does not depend on
                    ``reasoning_effort``: one sample per level happens to order low < max
  k3-efforts        only K3's levels low, high, max are accepted (K3.1's medium is refused, as
                    vLLM before 0.34.0 does)
  reject-effort     ``reasoning_effort: max`` is answered with HTTP 400
  miss-needle       no fact of the needle check is ever found
  recall-recent-only  only facts in the last 2,048 tokens (8,192 characters) before the question
                    are found, as a sparse attention that never selects far tokens would
  error-stream      streaming requests without tools are answered with HTTP 503
Front faults (``FRONT_FAULTS``): not OpenAI's shape, or methods refused before the key is checked:
  html-models       GET /v1/models and /models answer 200 with an HTML page (a web UI on that port)
  models-without-data  GET /v1/models and /models answer 200 with JSON without ``data`` (another API)
  empty-choices     chat completions answer 200 with ``{"choices": []}``
  refuse-methods-501  DELETE, PUT and PATCH are answered 501 before the key is checked (Python's
                    http.server does this for methods it does not implement)
  refuse-methods-405  the same with 405 (a proxy that forwards only GET and POST)
Options: ``hold_seconds`` (hold-tool-calls), ``keep_alive_seconds`` (send ``: keep-alive`` SSE
comments while a stream is silent, as vLLM's --sse-keep-alive-interval does),
``finish_with_last_call`` (the finish reason on the last call's delta, as vLLM 0.34.0 sends it
when the call's close marker and the end arrive in one step).
Bound to 127.0.0.1 on a free port; ``with OpenAITestServer() as server: server.base_url``.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MISBEHAVIOURS = ("merge-tool-calls", "stream-merge-tool-calls", "hold-tool-calls", "concurrent-mixup", "ignore-tool-choice",
                 "unforced-required", "repeat-tool-ids", "lose-tool-calls", "drop-reasoning", "drop-short-reasoning",
                 "ignore-effort", "noisy-effort", "k3-efforts", "reject-effort", "miss-needle", "recall-recent-only",
                 "error-stream")
FRONT_FAULTS = ("html-models", "models-without-data", "empty-choices", "refuse-methods-501", "refuse-methods-405")
SHORT_REASONING_CHARS = 400
CITIES = ("Paris", "Tokyo", "Berlin", "Lima")
REASONING = "The user wants weather data; I should call the weather tool for each city mentioned, then report. " * 2
K31_EFFORTS = ("low", "medium", "high", "max")
K3_EFFORTS = ("low", "high", "max")
EFFORT_REASONING = {"low": "Quick.", "medium": "Let me think this through.",
                    "high": "Let me think this through with some care first.",
                    "max": "Let me think this through with great care, step by step, checking each part twice."}
FACT_RE = re.compile(r"The code for vault (\w+) is ([A-Za-z0-9-]+)\.")
# recall-recent-only: what a sparse attention that selects only recent tokens would still see.
RECENT_CHARS = 2_048 * 4
LOSE_EVERY = 10
DEFAULT_API_KEY = "sk-fake-server-key"
OPEN_PATHS = ("/health", "/metrics")
# The keys of vLLM's non-streamed chat message (vllm/entrypoints/openai/chat_completion/protocol.py ChatMessage).
MESSAGE_NULLS = {"refusal": None, "annotations": None, "audio": None, "function_call": None}


def tokens(text: str | None) -> int:
    return math.ceil(len(text or "") / 4)


class OpenAITestServer:
    """The server; ``requests`` records every chat request body received (for assertions)."""

    def __init__(
        self,
        model: str = "kimi-k3.1-pro",
        *,
        api_key: str = DEFAULT_API_KEY,
        misbehave: set[str] | frozenset[str] = frozenset(),
        max_model_len: int = 1_048_576,
        token_delay_seconds: float = 0.001,
        hold_seconds: float = 3.0,
        keep_alive_seconds: float | None = None,
        finish_with_last_call: bool = False,
    ):
        unknown = set(misbehave) - set(MISBEHAVIOURS) - set(FRONT_FAULTS)
        if unknown:
            raise ValueError(f"unknown misbehaviour {sorted(unknown)} (known: {', '.join(MISBEHAVIOURS + FRONT_FAULTS)})")
        self.model, self.api_key, self.misbehave = model, api_key, frozenset(misbehave)
        self.max_model_len, self.token_delay_seconds = max_model_len, token_delay_seconds
        self.hold_seconds, self.keep_alive_seconds = hold_seconds, keep_alive_seconds
        self.finish_with_last_call = finish_with_last_call
        self.efforts = K3_EFFORTS if "k3-efforts" in self.misbehave else K31_EFFORTS
        self._agent_calls = 0
        self.requests: list[dict[str, Any]] = []
        self.hits: list[tuple[str, str, bool]] = []  # (method, path, with the key) of every request
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
            reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
            dropped = "drop-reasoning" in self.misbehave or (
                "drop-short-reasoning" in self.misbehave and len(reasoning) < SHORT_REASONING_CHARS)
            if message.get("role") == "assistant" and not dropped:
                count += tokens(reasoning)
            for call in message.get("tool_calls") or []:
                count += tokens(call["function"]["name"]) + tokens(call["function"]["arguments"])
        return count

    def _call_id(self, index: int) -> str:
        if "repeat-tool-ids" in self.misbehave:
            return f"functions.get_weather:{index}"
        return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"

    def _function(self, body: dict[str, Any], text: str) -> str | None:
        """The function a tool request calls: the one tool_choice names, else one the text names, else
        the first tool; None for tool_choice none (or when ignore-tool-choice takes it as auto)."""
        tools = [t["function"]["name"] for t in body.get("tools") or []]
        choice = body.get("tool_choice") or "auto"
        if "ignore-tool-choice" in self.misbehave:
            choice = "auto"
        if not tools or choice == "none":
            return None
        if isinstance(choice, dict):
            return choice["function"]["name"]
        return next((t for t in tools if t in text), tools[0])

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, message dict or error) for a chat request."""
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in self.efforts:
            return 400, {"error": {"message": f"This model supports thinking_effort values: {', '.join(self.efforts)}",
                                   "type": "BadRequestError", "param": "thinking_effort", "code": 400}}
        if effort == "max" and "reject-effort" in self.misbehave:
            return 400, {"error": {"message": "reasoning_effort must be one of low, medium, high", "type": "BadRequestError",
                                   "param": "reasoning_effort", "code": 400}}
        messages = body.get("messages", [])
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            results = [m.get("content", "") for m in messages if m.get("role") == "tool"]
            return 200, {"role": "assistant", "reasoning": "I have the tool result; answer with it.",
                         "content": "Here is what the tool said: " + " | ".join(results)}
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        facts = list(FACT_RE.finditer(text))
        if facts:
            if "miss-needle" in self.misbehave:
                facts = []
            elif "recall-recent-only" in self.misbehave:
                facts = [f for f in facts if len(text) - f.start() <= RECENT_CHARS]
            answer = "\n".join(f"{f.group(1)}: {f.group(2)}" for f in facts) or "I could not find the codes."
            return 200, {"role": "assistant", "reasoning": "Looking for the vault codes.", "content": answer}
        cities = sorted((c for c in CITIES if c in text), key=text.find)
        function = self._function(body, text)
        if function and "Note: " in text:
            key = next(t for t in body["tools"] if t["function"]["name"] == function)["function"]["parameters"]["required"][0]
            call = {"id": self._call_id(0), "type": "function",
                    "function": {"name": function, "arguments": json.dumps({key: text.split("Note: ", 1)[1]})}}
            return 200, {"role": "assistant", "reasoning": "I save the note.", "content": None, "tool_calls": [call]}
        unforced = ("unforced-required" in self.misbehave and body.get("tool_choice") == "required"
                    and not any(t["function"]["name"] in text for t in body.get("tools") or []))
        if function and cities and not unforced:
            calls = [
                {"id": self._call_id(i), "type": "function",
                 "function": {"name": function, "arguments": json.dumps({"city": c})}}
                for i, c in enumerate(cities)
            ]
            if "merge-tool-calls" in self.misbehave and len(calls) > 1 and not body.get("stream"):
                calls = [
                    {**calls[0],
                     "function": {"name": function, "arguments": "".join(c["function"]["arguments"] for c in calls)}}
                ]
            if "lose-tool-calls" in self.misbehave and messages and messages[0].get("role") == "system":
                with self._lock:
                    self._agent_calls += 1
                    count = self._agent_calls
                if count % LOSE_EVERY == 0:
                    raw = (f'<|open|>tools<|sep|><|open|>call tool="{function}" index="1"<|sep|>'
                           f'<|open|>argument key="city" type="string"<|sep|>{cities[0]}<|close|>argument<|sep|>'
                           "<|close|>call<|sep|><|close|>tools<|sep|>")
                    if (count // LOSE_EVERY) % 2:
                        return 200, {"role": "assistant", "reasoning": REASONING, "content": raw}
                    return 200, {"role": "assistant", "reasoning": REASONING + raw, "content": None}
            return 200, {"role": "assistant", "reasoning": REASONING, "content": None, "tool_calls": calls}
        if body.get("tools") and cities:
            return 200, {"role": "assistant", "reasoning": "No tool this time.", "content": "I cannot look that up."}
        if effort is not None or " times " in text:
            level = "max" if "ignore-effort" in self.misbehave else (effort or "max")
            reasoning = EFFORT_REASONING[level]
            if "noisy-effort" in self.misbehave:  # the same noise for the same request, whatever the order
                reasoning = "Hmm. " * random.Random(f"{effort}|{text}").randint(1, 30)
            return 200, {"role": "assistant", "reasoning": reasoning, "content": "391"}
        words = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        return 200, {"role": "assistant", "reasoning": "Thinking briefly.", "content": " ".join(["word"] * words)}

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
                path = self.path.split("?")[0].rstrip("/")
                if path in OPEN_PATHS or not server.api_key:
                    return True
                if self.headers.get("Authorization") != f"Bearer {server.api_key}":
                    self._json(401, {"error": "Unauthorized"})
                    return False
                return True

            def _route(self, method: str) -> str | None:
                """The known path of this request; answers 404/405 itself (after auth) and returns None."""
                path = self.path.split("?")[0].rstrip("/")
                allowed = {"/v1/models": "GET", "/health": "GET", "/metrics": "GET", "/v1/chat/completions": "POST",
                           "/invocations": "POST"}
                if path not in allowed:
                    self._json(404, {"detail": "Not Found"})
                    return None
                if allowed[path] != method:
                    self._json(405, {"detail": "Method Not Allowed"})
                    return None
                return path

            def do_GET(self) -> None:  # noqa: N802
                self._dispatch("GET")

            def _refused_before_auth(self) -> bool:
                """refuse-methods-501/405: methods other than GET and POST refused before the key is read."""
                for fault, status in (("refuse-methods-501", 501), ("refuse-methods-405", 405)):
                    if fault in server.misbehave:
                        length = int(self.headers.get("Content-Length", "0"))
                        if length:
                            self.rfile.read(length)
                        self._json(status, {"error": "Unsupported method"})
                        return True
                return False

            def do_DELETE(self) -> None:  # noqa: N802
                if not self._refused_before_auth():
                    self._dispatch("DELETE")

            def do_PUT(self) -> None:  # noqa: N802
                if not self._refused_before_auth():
                    self._dispatch("PUT")

            def do_PATCH(self) -> None:  # noqa: N802
                if not self._refused_before_auth():
                    self._dispatch("PATCH")

            def do_POST(self) -> None:  # noqa: N802
                self._dispatch("POST")

            def _dispatch(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length) if length else b""
                with server._lock:
                    server.hits.append((method, self.path, bool(self.headers.get("Authorization"))))
                if method == "GET" and self.path.split("?")[0].rstrip("/") in ("/models", "/v1/models") and self._other_service():
                    return
                if not self._authorized():
                    return
                path = self._route(method)
                if path is None:
                    return
                if path == "/v1/models":
                    self._json(200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": "vllm", "max_model_len": server.max_model_len}]})
                    return
                if path in ("/health", "/metrics"):
                    self._json(200, {})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._json(400, {"error": {"message": "JSON decode error", "type": "BadRequestError"}})
                    return
                self._chat(body)

            def _other_service(self) -> bool:
                """html-models / models-without-data: another service answers the model list (with and
                without /v1, no key needed), as a web UI or a different API on that port would."""
                if "html-models" in server.misbehave:
                    page = b"<!doctype html><html><head><title>Grafana</title></head><body>Sign in</body></html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return True
                if "models-without-data" in server.misbehave:
                    self._json(200, {"status": "ok", "version": "1.2.3"})
                    return True
                return False

            def _hold(self, seconds: float) -> None:
                """Stay silent for ``seconds``, or send ``: keep-alive`` comments every keep_alive_seconds."""
                deadline = time.monotonic() + seconds
                while (left := deadline - time.monotonic()) > 0:
                    time.sleep(min(left, server.keep_alive_seconds or left))
                    if server.keep_alive_seconds and deadline - time.monotonic() > 0:
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()

            def _chat(self, body: dict[str, Any]) -> None:
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
                agent = bool(body.get("messages")) and body["messages"][0].get("role") == "system"
                if body.get("stream") and body.get("tools") and not agent and "concurrent-mixup" in server.misbehave:
                    body = server.mix_up(body)
                wanted = body.get("max_tokens") or body.get("max_completion_tokens")
                if wanted and int(wanted) > server.max_model_len:  # vLLM's check (renderers/params.py)
                    self._json(400, {"error": {"message": f"max_tokens ({wanted}) cannot be greater than the model's maximum "
                                               f"context length ({server.max_model_len})", "type": "BadRequestError"}})
                    return
                if "empty-choices" in server.misbehave:
                    self._json(200, {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": server.model,
                                     "choices": []})
                    return
                status, message = server.reply(body)
                if status != 200:
                    self._json(status, message)
                    return
                reasoning_tokens = tokens(message.get("reasoning"))
                completion = (
                    reasoning_tokens
                    + tokens(message.get("content"))
                    + sum(tokens(c["function"]["name"]) + tokens(c["function"]["arguments"])
                          for c in message.get("tool_calls") or [])
                )
                prompt = server.prompt_tokens(body)
                usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
                         "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                rid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
                if not body.get("stream"):
                    full = {"role": "assistant", "content": message.get("content"), **MESSAGE_NULLS}
                    if message.get("tool_calls"):
                        full["tool_calls"] = message["tool_calls"]
                    full["reasoning"] = message.get("reasoning")
                    self._json(200, {"id": rid, "object": "chat.completion", "created": created, "model": server.model,
                                     "choices": [{"index": 0, "message": full, "logprobs": None, "finish_reason": finish,
                                                  "stop_reason": None, "token_ids": None, "routed_experts": None}],
                                     "service_tier": None, "system_fingerprint": None,
                                     "usage": {**usage, "prompt_tokens_details": None}, "prompt_logprobs": None,
                                     "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                                     "ec_transfer_params": None, "metrics": None})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

                def send(chunk: dict[str, Any]) -> None:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": server.model}

                def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
                    return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason,
                                                 "token_ids": None}]}

                send(choice({"role": "assistant", "content": ""}))
                pieces: list[dict[str, Any]] = [{"reasoning": w + " "} for w in (message.get("reasoning") or "").split()]
                pieces += [{"content": w + " "} for w in (message.get("content") or "").split()]
                for i, call in enumerate(message.get("tool_calls") or []):
                    # The K3 tool parser sends each call whole, once its block closes.
                    index = 0 if "stream-merge-tool-calls" in server.misbehave else i
                    fn = call["function"]
                    whole = {"id": call["id"], "type": "function", "index": index,
                             "function": {"name": fn["name"], "arguments": fn["arguments"]}}
                    pieces.append({"content": None, "tool_calls": [whole]})
                merge_finish = server.finish_with_last_call and bool(pieces) and bool(pieces[-1].get("tool_calls"))
                for n, delta in enumerate(pieces):
                    if delta.get("tool_calls") and "hold-tool-calls" in server.misbehave:
                        self._hold(server.hold_seconds)
                    time.sleep(server.token_delay_seconds)
                    send(choice(delta, finish if merge_finish and n == len(pieces) - 1 else None))
                if not merge_finish:
                    send(choice({}, finish))
                if (body.get("stream_options") or {}).get("include_usage"):
                    send({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler
