"""A streamed chat request read byte by byte, with the time every byte arrived.

A proxy in front of the server (an ALB, nginx ``proxy_read_timeout``, a tunnel) closes a stream
when no byte has passed for its idle timeout, 60 s by default on many of them. What it counts is
bytes on the wire, not OpenAI chunks: an SSE comment (``: keep-alive``, which vLLM sends with
``--sse-keep-alive-interval``) keeps a stream alive though a client library never shows it. So
``post_stream`` times the socket reads, not the parsed chunks. Standard library only.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class TimedStream:
    """One streamed response and when its bytes arrived (seconds from sending the request).

    Attributes:
        status: HTTP status (0: the connection failed or timed out before a status line).
        events: the JSON payload of every ``data:`` line but ``[DONE]``, in order.
        event_seconds: when the read that completed each event returned.
        first_byte_seconds: when the status line and headers had arrived.
        longest_silence_seconds: the longest time with no byte, from sending the request to the
            last byte (the wait for the headers included).
        silence_before_event: index in ``events`` of the first event after that silence (None:
            the silence was the wait for the headers, or came after the last event).
        comments: SSE comment lines (keep-alives) received.
        done: ``data: [DONE]`` was received.
        error: why the stream ended early (timeout, connection reset, a non-200 body), else "".
    """

    status: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    event_seconds: list[float] = field(default_factory=list)
    first_byte_seconds: float | None = None
    longest_silence_seconds: float = 0.0
    silence_before_event: int | None = None
    comments: int = 0
    done: bool = False
    error: str = ""


def post_stream(url: str, body: dict[str, Any], *, api_key: str | None, timeout_seconds: float) -> TimedStream:
    """POST ``body`` (JSON, ``stream`` set by the caller) to ``url`` and read the SSE reply.

    A socket read that waits longer than ``timeout_seconds`` ends the stream with ``error`` set
    (the silence up to then is recorded). A password in the URL goes out as basic auth only when
    no ``api_key`` is given.

    Never raises for the server's behaviour: every failure is in ``TimedStream.error``.
    """
    parts = urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    elif parts.username is not None:
        token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    record = TimedStream()
    started = time.monotonic()
    last = 0.0

    def arrived() -> float:
        nonlocal last
        now = time.monotonic() - started
        gap = now - last
        if gap > record.longest_silence_seconds:
            record.longest_silence_seconds = gap
            record.silence_before_event = len(record.events) if record.first_byte_seconds is not None else None
        last = now
        return now

    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout_seconds)
    try:
        connection.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        response = connection.getresponse()
        record.first_byte_seconds = arrived()
        record.status = response.status
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read(300).decode(errors='replace')}"
            return record
        buffer = b""
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            now = arrived()
            buffer += chunk
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                line = raw.rstrip(b"\r")
                if line.startswith(b":"):
                    record.comments += 1
                elif line.startswith(b"data:"):
                    payload = line[len(b"data:"):].strip()
                    if payload == b"[DONE]":
                        record.done = True
                        continue
                    try:
                        event = json.loads(payload)
                    except ValueError:
                        record.error = f"a data line that is not JSON: {payload[:80].decode(errors='replace')!r}"
                        return record
                    record.events.append(event if isinstance(event, dict) else {"value": event})
                    record.event_seconds.append(now)
    except TimeoutError:
        arrived()
        record.error = f"no byte for {timeout_seconds:g} s (the read timed out)"
    except (OSError, http.client.HTTPException) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        connection.close()
    return record
