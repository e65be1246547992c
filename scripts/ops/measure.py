#!/usr/bin/env python3
"""Read what a running deployment measured and print the stack config keys that take it.

    kimi-deploy measure --log vllm.log [--metrics-url http://HOST:8000/metrics] [--sync-json sync.log] [--json]
    journalctl -u kimi-vllm | kimi-deploy measure --log -
    kubectl logs POD -c vllm | kimi-deploy measure --log - --metrics-url http://127.0.0.1:8000/metrics

The plan estimates the KV-cache capacity and the time to ready; a running server knows them. This
command reads, from what the server and the weight sync left behind:

- the engine's startup log (a file, or ``-`` for standard input): "GPU KV cache size: N tokens"
  (vLLM 0.34.0 ``v1/core/kv_cache_utils.py`` ``update_kv_cache_capacity``, ~l.1169) ->
  ``kimi-deploy:vllm.kvCacheTokens``; "init engine (profile, create kv cache, warmup model) took X s"
  (``v1/engine/core.py`` ~l.440-460) -> ``kimi-deploy:timeToReady.engineInitSeconds``, or
  ``engineInitCachedSeconds`` when the start loaded its compiled graphs from the cache ("Directly load
  the compiled graph(s) ... from the cache", ``compilation/backends.py`` ~l.314); the phases between the
  log's timestamps (first line, "Loading weights took", engine ready, "Starting vLLM server on");
- ``/metrics``: ``vllm:cache_config_info`` (``v1/metrics/loggers.py`` ~l.1120; one label per
  ``CacheConfig`` field, ``kv_cache_size_tokens`` among them), a second reading of the KV capacity;
- the weight sync's ``--json`` summary (``scripts/node/weight_sync``: ``bytes_transferred``,
  ``seconds``; the last such line of a file such as ``journalctl -u kimi-weights`` or ``kubectl logs
  POD -c weight-sync``): a copy from the S3 mirror onto a node -> ``kimi-deploy:timeToReady.copyGBps``.

It prints the keys as YAML to merge into the stack file's ``config:`` (``--json``: the same as a
``KIMI_DEPLOY_CONFIG_OVERLAY`` object, with every figure and its source), and says which figure it
could not read and why. Key names come from the config model itself (``components/core/config/raw.py``),
so a key it prints is one the config takes. ``/metrics`` is open on the server (the API guard's
``OPEN_PATHS``); behind a proxy that wants the API key, the key is read from the environment
(``--api-key-env``, default ``VLLM_API_KEY``), never from the command line.

Exit codes: 0 at least one key read; 1 none of the inputs gave a figure; 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.config.raw import API_KEY_MIN_CHARS, TimeToReadyConfig, VllmConfig
from components.core.targets import GB
from scripts.ops._cli import EXIT_CHECK_FAILED, CliParser, UsageError, print_json, prog_name, run_cli

DEFAULT_API_KEY_ENV = "VLLM_API_KEY"
METRICS_TIMEOUT_SECONDS = 30.0
# A /metrics answer of vLLM is ~100-300 kB; a larger one is not a vLLM server's.
MAX_METRICS_BYTES = 32 << 20
COMMENT_COLUMNS = 100

# The config keys this command fills, spelled by the config model (a renamed field breaks here, at import).
VLLM_SECTION = "kimi-deploy:vllm"
TTR_SECTION = "kimi-deploy:timeToReady"
KV_CACHE_TOKENS_KEY = str(VllmConfig.model_fields["kv_cache_tokens"].alias)
ENGINE_INIT_KEY = str(TimeToReadyConfig.model_fields["engine_init_seconds"].alias)
ENGINE_INIT_CACHED_KEY = str(TimeToReadyConfig.model_fields["engine_init_cached_seconds"].alias)
COPY_GBPS_KEY = str(TimeToReadyConfig.model_fields["copy_gbps"].alias)
HUB_GBPS_KEY = str(TimeToReadyConfig.model_fields["hub_download_gbps"].alias)
# Weight-sync sources that are hubs (scripts/node/weight_sync: hf://, modelscope://).
HUB_SCHEMES = ("hf://", "modelscope://")
# timeToReady keys no running server can tell: measured around it (`pulumi up`, the node, the kubelet).
OUT_OF_REACH: dict[str, str] = {
    str(TimeToReadyConfig.model_fields[name].alias): why for name, why in {
        "infrastructure_seconds": "`pulumi up`'s own timing (VPC, cluster, node group) is not in the server's logs",
        "instance_boot_seconds": "the instance's launch time is in EC2 (or the node's events), not in the server's logs",
        "image_pull_seconds": "the image pull is timed by the kubelet (`kubectl get events`: Pulled) or the node's "
                              "journal, not by the server",
        "stager_boot_seconds": "the stager instance runs no vLLM server (phase stage)",
    }.items()
}

# vLLM's log lines (format strings of the pinned 0.34.0 wheel; tests/test_measure.py renders them with the wheel).
# "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"; the pools are
# "GPU", "CPU" (the CPU build), ... and "+ host" with HiSparse.
# Numbers as vLLM prints them (f"{n:,}" and "%.2f"): "1..2" or ",,," is no figure, not a traceback.
_COUNT = r"\d{1,3}(?:,\d{3})*"
_DECIMAL = r"\d+(?:\.\d+)?"
KV_CACHE_LINE = re.compile(
    rf"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_COUNT}) tokens, "
    rf"Maximum concurrency for (?P<max_model_len>{_COUNT}) tokens per request: (?P<concurrency>{_DECIMAL})x"
)
INIT_ENGINE_LINE = re.compile(rf"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>{_DECIMAL}) s")
COMPILE_CACHE_HIT = re.compile(r"Directly load the compiled graph\(s\) for .* from the cache")
COMPILE_RUN = re.compile(r"Compiling a graph for .* takes [\d.]+ s")
WEIGHTS_LOADED_LINE = re.compile(rf"Loading weights took (?P<seconds>{_DECIMAL}) seconds")
SERVING_LINE = re.compile(r"Starting vLLM server on ")
# vLLM's log prefix: "(APIServer pid=1) INFO 12-07 14:13:11 [file.py:12] ..." (``vllm/logger.py`` _DATE_FORMAT "%m-%d %H:%M:%S").
LOG_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d) ")
CACHE_CONFIG_INFO = "vllm:cache_config_info"
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Figure:
    """One measured figure: ``key`` (``section``/``name`` of the config, or None when no key takes
    it), ``value`` (tokens, seconds or GB/s as the key says) and ``source`` (where it was read)."""

    section: str | None
    name: str
    value: float | int
    source: str

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


@dataclass
class Measurement:
    """What was read: ``figures`` (with a key: the overlay; without: shown only), ``phases``
    (``name -> seconds`` between the startup log's timestamps) and ``not_read`` (``figure -> why``)."""

    figures: list[Figure] = field(default_factory=list)
    phases: dict[str, int] = field(default_factory=dict)
    not_read: dict[str, str] = field(default_factory=dict)

    def overlay(self) -> dict[str, dict[str, float | int]]:
        """The keys to set, nested as the stack file and ``KIMI_DEPLOY_CONFIG_OVERLAY`` nest them."""
        out: dict[str, dict[str, float | int]] = {}
        for f in self.figures:
            if f.section:
                out.setdefault(f.section, {})[f.name] = f.value
        return out

    def as_json(self) -> dict[str, Any]:
        return {"overlay": self.overlay(),
                "figures": [{"key": f.key, "value": f.value, "source": f.source} for f in self.figures],
                "phases_seconds": self.phases, "not_read": self.not_read}


@dataclass(frozen=True)
class StartupLog:
    """What a vLLM startup log says: ``kv_lines`` (``(pool, tokens, max_model_len, concurrency)`` per
    engine), ``init_seconds`` (the last "init engine ... took"), ``compile`` (``cached``: graphs
    loaded from the cache; ``compiled``: compiled in this start; None: no torch.compile, e.g.
    ``--enforce-eager``) and ``stamps`` (event -> ``datetime``; the log has no year, so only
    differences mean anything)."""

    kv_lines: tuple[tuple[str, int, int, float, str], ...]
    init_seconds: float | None
    compile: str | None
    stamps: dict[str, datetime]
    init_said: str = ""  # the "init engine ... took X s" line's words, as logged


def _stamp(line: str, year: int) -> datetime | None:
    match = LOG_TIME.search(line)
    return datetime.strptime(f"{year}-{match['stamp']}", "%Y-%m-%d %H:%M:%S") if match else None


def parse_startup_log(text: str, year: int = 2000) -> StartupLog:
    """The figures of a vLLM startup log (``journalctl``/``kubectl logs`` prefixes allowed).

    ``year``: put on the log's month-day timestamps (a leap year, so 02-29 parses); a log that crosses
    New Year is read in order, a timestamp earlier than the one before it moving to the next year.
    """
    kv: list[tuple[str, int, int, float, str]] = []
    init: float | None = None
    init_said = ""
    cache_hit = compiled = False
    stamps: dict[str, datetime] = {}
    last: datetime | None = None
    for line in text.splitlines():
        when = _stamp(line, year)
        if when is not None and last is not None and when < last and (last - when).days > 300:
            year += 1
            when = _stamp(line, year)
        if when is not None:
            last = when
            stamps.setdefault("log_start", when)
        if (m := KV_CACHE_LINE.search(line)) is not None:
            kv.append((m["pool"], int(m["tokens"].replace(",", "")), int(m["max_model_len"].replace(",", "")),
                       float(m["concurrency"]), m[0]))
        elif (m := INIT_ENGINE_LINE.search(line)) is not None:
            init, init_said = float(m["seconds"]), m[0]
            if when is not None:
                stamps["engine_ready"] = when
        elif (m := WEIGHTS_LOADED_LINE.search(line)) is not None and when is not None:
            stamps["weights_loaded"] = when
        elif SERVING_LINE.search(line) and when is not None:
            stamps.setdefault("serving", when)
        cache_hit = cache_hit or bool(COMPILE_CACHE_HIT.search(line))
        compiled = compiled or bool(COMPILE_RUN.search(line))
    return StartupLog(tuple(kv), init, "cached" if cache_hit and not compiled else "compiled" if compiled else None,
                      stamps, init_said)


def parse_cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """The labels of the first ``vllm:cache_config_info`` sample of a ``/metrics`` answer (Prometheus
    text or OpenMetrics), or None when it has none."""
    for line in metrics_text.splitlines():
        if line.startswith(CACHE_CONFIG_INFO + "{"):
            body = line[len(CACHE_CONFIG_INFO) + 1:line.rindex("}")]
            return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(body)}
    return None


def parse_sync_summary(text: str) -> dict[str, Any] | None:
    """The last weight-sync ``--json`` summary in ``text`` (a JSON object with ``bytes_transferred``,
    ``seconds``, ``source`` and ``dest``, alone or pretty-printed, among other log lines), or None."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    i = text.find("{")
    while i != -1:
        try:
            doc, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(doc, dict) and {"bytes_transferred", "seconds", "source", "dest"} <= set(doc):
            found = doc
        i = text.find("{", end)
    return found


def fetch_metrics(url: str, api_key: str | None, timeout_seconds: float = METRICS_TIMEOUT_SECONDS) -> str:
    """GET ``url`` (``Authorization: Bearer`` when ``api_key``), the body as text.

    Raises:
        OSError: no answer, or an HTTP error (``urllib.error.HTTPError``, its ``code`` set).
    """
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout_seconds) as response:  # noqa: S310  (http/https only: checked_url)
        return response.read(MAX_METRICS_BYTES).decode("utf-8", errors="replace")


def checked_url(url: str) -> str:
    """``url`` (http or https with a host; an empty path becomes ``/metrics``).

    Raises:
        UsageError: another scheme (``file://`` would read local files) or no host.
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--metrics-url {url!r}: expected http://HOST:PORT/metrics (http or https)")
    return urllib.parse.urlunsplit(parts._replace(path=parts.path if parts.path not in ("", "/") else "/metrics"))


def _kv_figure(log: StartupLog | None, info: dict[str, str] | None, out: Measurement) -> None:
    key = f"{VLLM_SECTION}.{KV_CACHE_TOKENS_KEY}"
    from_metrics: int | None = None
    if info is not None:
        raw = info.get("kv_cache_size_tokens", "")
        if raw.isdigit() and int(raw) > 0:
            from_metrics = int(raw)
    if log is not None and log.kv_lines:
        tokens = min(line[1] for line in log.kv_lines)
        said = next(line[4] for line in log.kv_lines if line[1] == tokens)
        source = f'startup log "{said}"'  # the engine's words, whole: nothing re-worded or cut
        if len({line[1] for line in log.kv_lines}) > 1:
            source += f"; the smallest of {len(log.kv_lines)} engines' lines"
        if from_metrics is not None:
            source += ("; /metrics cache_config_info agrees" if from_metrics == tokens
                       else f"; /metrics cache_config_info says {from_metrics:,} (another engine or a restart?)")
        out.figures.append(Figure(VLLM_SECTION, KV_CACHE_TOKENS_KEY, tokens, source))
    elif from_metrics is not None:
        out.figures.append(Figure(VLLM_SECTION, KV_CACHE_TOKENS_KEY, from_metrics,
                                  f"/metrics {CACHE_CONFIG_INFO} kv_cache_size_tokens"))
    else:
        why = []
        if log is not None:
            why.append('no "KV cache size: N tokens" line in the startup log (is it the log of a start that finished?)')
        if info is not None:
            why.append(f"{CACHE_CONFIG_INFO} has no kv_cache_size_tokens (an engine older than vLLM 0.11?)")
        out.not_read[key] = "; ".join(why) or "give --log (the startup log) or --metrics-url"


def _engine_figures(log: StartupLog | None, engine_start: str, out: Measurement) -> None:
    if log is None:
        out.not_read[f"{TTR_SECTION}.{ENGINE_INIT_KEY}"] = "give --log (the engine's startup log)"
        return
    if log.init_seconds is None:
        out.not_read[f"{TTR_SECTION}.{ENGINE_INIT_KEY}"] = ('no "init engine (profile, create kv cache, warmup model) '
                                                          'took X s" line in the startup log')
    else:
        kind = log.compile if engine_start == "auto" else engine_start
        cached = kind == "cached"
        how = {"cached": "compiled graphs loaded from the cache", "compiled": "graphs compiled in this start",
               "cold": "given as a cold start (--engine-start)", None: "no torch.compile in this start, as with "
               "--enforce-eager: cold and cached starts alike"}[kind]
        out.figures.append(Figure(TTR_SECTION, ENGINE_INIT_CACHED_KEY if cached else ENGINE_INIT_KEY,
                                  max(round(log.init_seconds, 2), 0.01),
                                  f'startup log "{log.init_said}" ({how})'))
    s = log.stamps
    for name, a, b in (("log start -> weights loaded", "log_start", "weights_loaded"),
                       ("weights loaded -> engine ready", "weights_loaded", "engine_ready"),
                       ("engine ready -> serving", "engine_ready", "serving"),
                       ("log start -> serving", "log_start", "serving")):
        if a in s and b in s:
            out.phases[name] = int((s[b] - s[a]).total_seconds())


def _sync_figure(summary: dict[str, Any] | None, given: bool, out: Measurement) -> None:
    """The weight sync's achieved rate: a copy from the S3 mirror onto a node fills ``copyGBps``; a
    hub download (the publish to the mirror, or a node's own download) fills ``hubDownloadGBps``."""
    copy_key, hub_key = f"{TTR_SECTION}.{COPY_GBPS_KEY}", f"{TTR_SECTION}.{HUB_GBPS_KEY}"
    if not given:
        for key in (copy_key, hub_key):
            out.not_read[key] = "give --sync-json (the weight sync's --json summary: journal or weight-sync container log)"
        return
    if summary is None:
        for key in (copy_key, hub_key):
            out.not_read[key] = "no weight-sync --json summary (bytes_transferred, seconds, source, dest) in --sync-json"
        return
    source, dest = str(summary["source"]), str(summary["dest"])
    moved, seconds = int(summary["bytes_transferred"]), float(summary["seconds"])
    if moved <= 0 or seconds <= 0:
        for key in (copy_key, hub_key):
            out.not_read[key] = f"the sync {source} -> {dest} copied nothing (the copy was complete already): no rate"
        return
    gbps = moved / seconds / GB
    took = f"{seconds:,.1f}" if seconds >= 0.1 else _number(seconds)  # never 0.0 s, never 1e-05 s
    text = f"weight sync {source} -> {dest}: {moved / GB:,.1f} GB in {took} s"
    if source.startswith("s3://") and "://" not in dest:
        out.figures.append(Figure(TTR_SECTION, COPY_GBPS_KEY, float(f"{gbps:.3g}"), text))
        out.not_read[hub_key] = f"the summary is of a mirror -> node copy ({source} -> {dest}), not a hub download"
    elif source.startswith(HUB_SCHEMES):
        out.figures.append(Figure(TTR_SECTION, HUB_GBPS_KEY, float(f"{gbps:.3g}"), text))
        out.not_read[copy_key] = f"the summary is of a hub download ({source} -> {dest}), not a copy from the S3 mirror"
    else:
        # An FSx -> NVMe copy: a rate the plan reads from the file system's throughput (no timeToReady key).
        out.figures.append(Figure(None, "sync GB/s (no key: not a mirror -> node copy)", float(f"{gbps:.3g}"), text))
        for key in (copy_key, hub_key):
            out.not_read[key] = f"the summary is of {source} -> {dest}: neither a hub download nor a mirror -> node copy"


def measure(log_text: str | None, metrics_text: str | None, sync_text: str | None, *,
            engine_start: str = "auto", metrics_error: str | None = None) -> Measurement:
    """Every figure the inputs give (each input optional: None when not given).

    Args:
        log_text: the engine's startup log.
        metrics_text: a ``/metrics`` answer.
        sync_text: text holding the weight sync's ``--json`` summary.
        engine_start: ``auto`` (from the log's compile lines), ``cold`` or ``cached``: which
            ``timeToReady`` key the engine's init time goes to.
        metrics_error: why ``/metrics`` could not be read (one line), when it was asked for.
    """
    out = Measurement()
    log = parse_startup_log(log_text) if log_text is not None else None
    info = parse_cache_config_info(metrics_text) if metrics_text is not None else None
    _kv_figure(log, info, out)
    if metrics_error:
        out.not_read["/metrics"] = metrics_error
    elif metrics_text is not None and info is None:
        out.not_read["/metrics"] = f"no {CACHE_CONFIG_INFO} sample in the answer (is it a vLLM server's /metrics?)"
    _engine_figures(log, engine_start, out)
    _sync_figure(parse_sync_summary(sync_text) if sync_text is not None else None, sync_text is not None, out)
    for name, why in OUT_OF_REACH.items():
        out.not_read[f"{TTR_SECTION}.{name}"] = why
    _drop_figures_the_config_refuses(out)
    return out


def _config_bound(section: str, name: str) -> tuple[Any, str]:
    """The config field ``section.name`` (an alias) and its bounds as text (``more than 0, at most 86400``)."""
    model = VllmConfig if section == VLLM_SECTION else TimeToReadyConfig
    field_info = next(f for f in model.model_fields.values() if f.alias == name)
    words = {"gt": "more than", "ge": "at least", "lt": "less than", "le": "at most"}
    bounds = [f"{words[attr]} {_number(getattr(m, attr))}" for m in field_info.metadata for attr in words
              if getattr(m, attr, None) is not None]
    return field_info, ", ".join(bounds)


def _drop_figures_the_config_refuses(out: Measurement) -> None:
    """A figure outside what its config key takes (a log line of 1e23 s, a copy in 0.0000001 s) is a
    misread or a damaged input, not a measurement: it moves to ``not_read`` with the value, its
    source and the key's bounds (components/core/config/raw.py), and is not printed as a key."""
    from pydantic import TypeAdapter, ValidationError

    kept: list[Figure] = []
    for f in out.figures:
        if f.section is None:
            kept.append(f)
            continue
        field_info, bounds = _config_bound(f.section, f.name)
        try:
            TypeAdapter(field_info.annotation).validate_python(f.value)
            ok = all(_within(m, f.value) for m in field_info.metadata)
        except ValidationError:
            ok = False
        if ok:
            kept.append(f)
        else:
            out.not_read[f.key] = (f"read {_number(f.value)} from {f.source}: not a plausible figure (the key takes "
                                   f"{bounds}): check the input")
    out.figures = kept


def _within(meta: Any, value: float) -> bool:
    checks = (("gt", lambda b: value > b), ("ge", lambda b: value >= b), ("lt", lambda b: value < b),
              ("le", lambda b: value <= b))
    return all(test(getattr(meta, attr)) for attr, test in checks if getattr(meta, attr, None) is not None)


def _number(value: float | int) -> str:
    """``value`` with every digit and never an exponent (``1e-05`` -> ``0.00001``; ``1e+23`` is
    refused before it gets here, as a figure no key takes)."""
    from decimal import Decimal

    if isinstance(value, int):
        return str(value)
    text = format(Decimal(repr(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _yaml_scalar(value: float | int) -> str:
    text = _number(value)  # every digit, never an exponent a reader must convert (1.23457e+06)
    return text if isinstance(value, int) or "." in text else f"{text}.0"


def _comment(text: str, indent: str = "") -> list[str]:
    """``text`` as YAML comment lines of at most ``COMMENT_COLUMNS`` (a terminal's width)."""
    import textwrap

    return textwrap.wrap(text, COMMENT_COLUMNS, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}#   ",
                         break_long_words=False, break_on_hyphens=False)


def render_yaml(m: Measurement) -> str:
    """The keys as stack-file YAML (under ``config:``), each after its source as a comment, then the
    phases and what was not read, as comments (lines of at most ``COMMENT_COLUMNS``)."""
    lines = _comment("Measured on the running server: merge into stacks/Pulumi.<stack>.yaml under config: (or "
                     "`pulumi config set --path KEY VALUE`); each replaces the plan's estimate.")
    lines.append("config:")
    overlay = m.overlay()
    by_key = {(f.section, f.name): f for f in m.figures}
    for section, keys in overlay.items():
        lines.append(f"  {section}:")
        for name, value in keys.items():
            lines += _comment(by_key[(section, name)].source, "    ")
            lines.append(f"    {name}: {_yaml_scalar(value)}")
    if not overlay:
        lines[-1] = "# config: (nothing read)"
    for f in m.figures:
        if f.section is None:
            lines += _comment(f"{f.name}: {_yaml_scalar(f.value)} ({f.source})")
    if m.phases:
        lines.append("# phases of the engine start (startup log timestamps, 1 s resolution):")
        lines += [f"#   {name}: {seconds:,} s" for name, seconds in m.phases.items()]
    if m.not_read:
        lines.append("# not read:")
        for key, why in m.not_read.items():
            lines += _comment(f"{key}: {why}", "  ")
    return "\n".join(lines)


def _read_text(path: str, flag: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as err:
        raise UsageError(f"{flag} {path!r}: cannot read it ({err.strerror or err})") from None


# Words a key's variable is named with (VLLM_API_KEY, OPENAI_API_KEY, HF_TOKEN, ...): `--api-key-env PATH`
# sent the search path to the server as a Bearer token.
KEY_NAME_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH", "BEARER", "CREDENTIAL")
# What an HTTP bearer token may hold (RFC 6750 section 2.1, b64token): no space, no ':' or '/' of a path list.
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def api_key_from_env(name: str, environ: Mapping[str, str]) -> str | None:
    """The API key in the variable ``name`` (None when unset or empty: no key is sent).

    Raises:
        UsageError: ``name`` is not a key's variable (it names none of ``KEY_NAME_WORDS``: PATH,
            HOME...), or its value is not a bearer token (RFC 6750 b64token; a path or a sentence),
            or is shorter than the stack's minimum key (``API_KEY_MIN_CHARS``). The value is never shown.
    """
    if not any(word in name.upper() for word in KEY_NAME_WORDS):
        raise UsageError(f"--api-key-env {name}: not the name of a key's variable (its value would be sent as the Bearer "
                         f"token); name the variable that holds the API key, e.g. {DEFAULT_API_KEY_ENV}")
    value = environ.get(name) or None
    if value is None:
        return None
    if not BEARER_TOKEN.fullmatch(value) or value.startswith(("/", "~", ".")):
        raise UsageError(f"--api-key-env {name}: its value is not an API key (a key is one word of letters, digits and "
                         "-._~+/, not a path; this one has spaces, ':' or a path's start): not sent")
    if len(value) < API_KEY_MIN_CHARS:
        raise UsageError(f"--api-key-env {name}: its value is shorter than {API_KEY_MIN_CHARS} characters, the "
                         "stack's minimum API key: not sent")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog=prog_name("scripts/ops/measure.py"),
                       description="Read a running server's measured figures (KV-cache tokens, engine start, weight-copy "
                                   "rate) and print the stack config keys that take them.")
    parser.add_argument("--log", metavar="FILE",
                        help="the engine's startup log (journalctl -u kimi-vllm, kubectl logs POD -c vllm); - for stdin")
    parser.add_argument("--metrics-url", metavar="URL", help="the server's /metrics, e.g. http://127.0.0.1:8000/metrics")
    parser.add_argument("--sync-json", metavar="FILE",
                        help="text holding the weight sync's --json summary (its journal or container log); - for stdin")
    parser.add_argument("--engine-start", choices=("auto", "cold", "cached"), default="auto",
                        help="which key the engine's init time goes to: auto (from the log's torch.compile lines), "
                             "cold (engineInitSeconds) or cached (engineInitCachedSeconds)")
    parser.add_argument("--api-key-env", metavar="VAR", default=DEFAULT_API_KEY_ENV,
                        help=f"environment variable holding an API key sent to --metrics-url (default {DEFAULT_API_KEY_ENV}; "
                             "sent only when set; never pass the key itself)")
    parser.add_argument("--json", action="store_true", help="print the overlay, every figure and what was not read as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the measured keys of the inputs given; see the module docstring for exit codes."""
    args = build_parser().parse_args(argv)
    if not (args.log or args.metrics_url or args.sync_json):
        raise UsageError("nothing to read: give --log, --metrics-url and/or --sync-json (see --help)")
    if args.log == "-" and args.sync_json == "-":
        raise UsageError("--log and --sync-json cannot both read standard input (-)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args.api_key_env):
        raise UsageError(f"--api-key-env {args.api_key_env!r}: expected an environment variable name")
    api_key = api_key_from_env(args.api_key_env, os.environ) if args.metrics_url else None
    log_text = _read_text(args.log, "--log") if args.log else None
    sync_text = _read_text(args.sync_json, "--sync-json") if args.sync_json else None
    metrics_text = metrics_error = None
    if args.metrics_url:
        url = checked_url(args.metrics_url)
        try:
            metrics_text = fetch_metrics(url, api_key)
        except urllib.error.HTTPError as err:
            hint = (f": the server wants an API key (set {args.api_key_env} in the environment)"
                    if err.code in (401, 403) else "")
            metrics_error = f"{url} answered HTTP {err.code}{hint}"
        except (OSError, ValueError) as err:
            metrics_error = f"{url}: no answer ({getattr(err, 'reason', None) or err})"
    result = measure(log_text, metrics_text, sync_text, engine_start=args.engine_start, metrics_error=metrics_error)
    if args.json:
        print_json(result.as_json())
    else:
        print(render_yaml(result))
    return 0 if result.overlay() else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(run_cli(main))
