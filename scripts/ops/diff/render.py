"""The plan diff for people: a pull-request comment (Markdown), a rich table, and the redaction
every shown value goes through (a second fence after the plan's own masking).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any

from components.core.credentials import redact_credentials  # standard library only
from scripts.ops.diff.engine import MISSING, has_changes

# GitHub rejects issue comments over 65,536 characters; leave room for the other stacks' headers.
MARKDOWN_LIMIT_CHARS = 60_000

# Second fence: values shaped like credentials never reach a comment even if one slipped past
# the plan's masking (the shapes of components/core/credentials.py), and values after a
# credential-like name (`password: ...`).
_NAMED_SECRET_RE = re.compile(r"(?i)((?:token|password|passwd|secret|api[_-]?key)\s*[=:]\s*)(?!\[secret\])[^\s\"',;]{6,}")


def redact(text: str) -> str:
    """``text`` with anything shaped like a credential replaced by ``[redacted]``."""
    text = redact_credentials(text)
    return _NAMED_SECRET_RE.sub(lambda m: m.group(1) + "[redacted]", text)


def redact_tree(value: Any) -> Any:
    """``value`` (JSON data) with ``redact`` applied to every string in it, keys included.

    Redact the data, never its serialized text: a pattern matching across JSON's escapes (a
    ``token = ...`` inside an embedded script) would cut an escaped quote and break the document.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    return value


# Before/after cells: values up to this many characters are shown whole; longer ones are cut to
# a window of this size around the first difference, so the change itself is always visible.
VALUE_CHARS = 100
_CONTEXT_CHARS = 24  # characters shown before the first difference


def _plain(value: Any) -> str | None:
    """One-line redacted text of a value (newlines as ``\\n``); None for an absent value."""
    if value is None or value == MISSING:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return redact(text).replace("\r", "").replace("\n", "\\n")


def value_pair(old: Any, new: Any, limit: int = VALUE_CHARS) -> tuple[str | None, str | None]:
    """``old`` and ``new`` as plain one-line texts for a before/after table (None = absent).

    Short values stay whole. A longer one is cut to ``limit`` characters starting a little
    before the first character where the two differ, with ``…`` where text was left out, so
    an image tag changed from ``nightly-<commit a>`` to ``nightly-<commit b>`` stays visible inside a
    long command line.
    """
    a, b = _plain(old), _plain(new)
    start = 0
    if a is not None and b is not None and max(len(a), len(b)) > limit:
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        start = max(0, common - _CONTEXT_CHARS)
    return _window(a, start, limit), _window(b, start, limit)


def _window(text: str | None, start: int, limit: int) -> str | None:
    """At most ``limit`` characters of ``text`` from about ``start``, ``…`` marking cuts."""
    if text is None or len(text) <= limit:
        return text
    start = max(0, min(start, len(text) - (limit - 1)))  # never start later than a full tail needs
    if start == 0:
        return text[: limit - 1] + "…"
    if start + limit - 1 >= len(text):
        return "…" + text[start:]
    return "…" + text[start : start + limit - 2] + "…"


def fmt_pair(old: Any, new: Any, limit: int = VALUE_CHARS) -> tuple[str, str]:
    """Markdown cells for a before/after pair (``value_pair`` in inline code; ``*absent*``)."""
    cells = []
    for text in value_pair(old, new, limit):
        if text is None:
            cells.append("*absent*")
        else:
            cells.append(f"`{_cell(text)}`" if text else '`""`')
    return cells[0], cells[1]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _maybe_base64(value: Any) -> Any:
    """Base64 text (launch-template user data) decoded for reading; anything else unchanged."""
    import base64
    import binascii

    if not isinstance(value, str) or len(value) < 16 or "\n" in value or not re.fullmatch(r"[A-Za-z0-9+/=]+", value):
        return value
    try:
        text = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return value
    return text if "\n" in text else value


def _long_text_diffs(diff: Mapping[str, Any]) -> list[str]:
    """Unified diffs of multi-line inputs (user data, scripts), for the details block."""
    import difflib

    out: list[str] = []
    for c in diff["changed"]:
        for f in c["fields"]:
            a, b = _maybe_base64(f["old"]), _maybe_base64(f["new"])
            if isinstance(a, str) and isinstance(b, str) and ("\n" in a or "\n" in b):
                lines = list(
                    difflib.unified_diff(
                        redact(a).splitlines(),
                        redact(b).splitlines(),
                        f"{c['name']}.{f['path']} (base)",
                        f"{c['name']}.{f['path']} (this change)",
                        lineterm="",
                        n=2,
                    )
                )
                out += [
                    f"`{c['name']}` `{f['path']}`:",
                    "```diff",
                    *lines[:200],
                    *(["… (truncated)"] if len(lines) > 200 else []),
                    "```",
                ]
    return out


def overlay_text(diff: Mapping[str, Any]) -> str:
    """What the overlay did to a diff: set on the working tree's side only (worktree.diff_against)."""
    keys = ", ".join(diff.get("config_overlay") or [])
    return (f"KIMI_DEPLOY_CONFIG_OVERLAY sets {keys} on the working tree's side only; the base at "
            f"{diff.get('ref') or 'the ref'} is the stack file as committed")


def render_markdown(diff: Mapping[str, Any], stack: str, ref: str | None = None) -> str:
    """A pull-request comment section for one stack's diff (GitHub-flavoured Markdown).

    Starts with a summary line with counts, lists ⚠ replacements first, then one table per
    change kind, collapsible details of every changed field and of added/removed inputs, the
    vLLM command and sizing changes. No secret: inputs are masked in the plan and ``redact``
    runs over every value.
    """
    s = diff["summary"]
    against = f" vs `{_cell(ref)}`" if ref else ""
    lines: list[str] = []
    banner = []
    if diff.get("config_overlay"):
        lines += [f"> {overlay_text(diff)}", ""]
    if diff.get("base_error"):
        banner = [f"> ⚠ **{_cell(redact(diff['base_error']))}** — everything below is the whole new plan, shown as added", ""]
    if not has_changes(diff):
        lines.append(f"#### `{stack}`{against}: no changes")
        lines += [""] + banner if banner else []
        return "\n".join(lines).rstrip("\n") + "\n"
    counts = f"{s['added']} to add, {s['removed']} to remove, {s['changed']} to change"
    if s["replaced"]:
        counts += f" (**⚠ {s['replaced']} replaced**)"
    if s["disruptive"]:
        counts += f", {s['disruptive']} disruptive in place"
    if s.get("recycled"):
        counts += f" (**⚠ {s['recycled']} node group{'s' if s['recycled'] > 1 else ''} recycled**)"
    lines.append(f"#### `{stack}`{against}: {counts}")
    lines.append("")
    lines += banner
    if diff["secret_leaks"]:
        for leak in diff["secret_leaks"]:
            lines.append(
                f"> ❌ secret `kimi-deploy:{leak.get('secret')}` appears in the plain input "
                f"`{leak.get('resource')}.{leak.get('path')}`"
            )
        lines.append("")
    for c in diff["changed"]:
        if c["action"] == "replace":
            why = ", ".join(f"`{f['path']}`" for f in c["fields"] if f["replaces"])
            notes = "; ".join(dict.fromkeys(f["note"] for f in c["fields"] if f["replaces"] and f["note"]))
            lines.append(f"> ⚠ **replace** `{c['name']}` ({c['type']}): {why}" + (f" — {notes}" if notes else ""))
    for c in diff["changed"]:
        if c["action"] != "replace" and c["disruptive"]:
            why = ", ".join(f"`{f['path']}`" for f in c["fields"] if f["disrupts"])
            notes = "; ".join(dict.fromkeys(f["note"] for f in c["fields"] if f["disrupts"] and f["note"]))
            lines.append(f"> ⚠ disruptive update `{c['name']}` ({c['type']}): {why}" + (f" — {notes}" if notes else ""))
    if any(c["disruptive"] for c in diff["changed"]):
        lines.append("")

    if diff["changed"]:
        lines += ["| | resource | type | changed inputs |", "|---|---|---|---|"]
        for c in diff["changed"]:
            mark = "⚠ replace" if c["action"] == "replace" else ("⚠ update" if c["disruptive"] else "~ update")
            paths = ", ".join(("**" + f"`{f['path']}`" + "**") if f["replaces"] else f"`{f['path']}`" for f in c["fields"][:8])
            more = f" +{len(c['fields']) - 8} more" if len(c["fields"]) > 8 else ""
            lines.append(f"| {mark} | `{c['name']}` | `{c['type']}` | {paths}{more} |")
        lines.append("")
    for kind, sign in (("added", "+ add"), ("removed", "- remove")):
        if diff[kind]:
            lines += ["| | resource | type |", "|---|---|---|"]
            for r in diff[kind]:
                lines.append(f"| {sign} | `{r['name']}` | `{r['type']}` |")
            lines.append("")

    vl = diff["vllm"]
    if vl["fields"] or vl["roles"]:
        lines += ["**vLLM**", "", "| role | setting | before | after |", "|---|---|---|---|"]
        for f in vl["fields"]:
            lines.append(f"| all | `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} |")
        for role in vl["roles"]:
            if role["status"] != "changed":
                lines.append(f"| `{role['name']}` | role {role['status']} | | |")
                continue
            if role["nodes"]:
                lines.append(f"| `{role['name']}` | nodes | `{role['nodes'][0]}` | `{role['nodes'][1]}` |")
            for a in role["argv"]:
                old, new = fmt_pair(
                    None if a["old"] is None else (a["old"] or "(flag)"), None if a["new"] is None else (a["new"] or "(flag)")
                )
                lines.append(f"| `{role['name']}` | `{a['flag']}` | {old} | {new} |")
            for e in role["env"]:
                lines.append(f"| `{role['name']}` | `{e['path']}` | {' | '.join(fmt_pair(e['old'], e['new']))} |")
        lines.append("")
    if diff["plan"]:
        lines += [
            "<details><summary>Plan settings (" + str(len(diff["plan"])) + " changed: sizing, cost, expiry, outputs)</summary>",
            "",
            "| setting | before | after |",
            "|---|---|---|",
        ]
        for f in diff["plan"]:
            lines.append(f"| `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} |")
        lines += ["", "</details>", ""]
    for w in diff["warnings"]["added"]:
        lines.append(f"> new warning: {_cell(redact(w))}")
    for w in diff["warnings"]["removed"]:
        lines.append(f"> resolved warning: {_cell(redact(w))}")
    if diff["warnings"]["added"] or diff["warnings"]["removed"]:
        lines.append("")

    if diff["changed"]:
        n = sum(len(c["fields"]) for c in diff["changed"])
        lines += [
            f"<details><summary>Changed inputs ({n})</summary>",
            "",
            "| resource | input | before | after | |",
            "|---|---|---|---|---|",
        ]
        for c in diff["changed"]:
            for f in c["fields"]:
                mark = "⚠ replaces" if f["replaces"] else ("⚠ disrupts" if f["disrupts"] else "")
                lines.append(f"| `{c['name']}` | `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} | {mark} |")
        long_diffs = _long_text_diffs(diff)
        if long_diffs:
            lines += ["", *long_diffs]
        lines += ["", "</details>", ""]
    for kind, title in (("added", "Inputs of added resources"), ("removed", "Inputs of removed resources")):
        if diff[kind]:
            lines += [f"<details><summary>{title} ({len(diff[kind])})</summary>", ""]
            for r in diff[kind]:
                body = json.dumps(redact_tree(r.get("inputs", {})), indent=1, sort_keys=True)
                if len(body) > 4000:
                    body = body[:4000] + "\n… (truncated)"
                lines += [f"`{r['name']}` `{r['type']}`", "```json", body, "```"]
            lines += ["</details>", ""]
    text = "\n".join(lines)
    if len(text) > MARKDOWN_LIMIT_CHARS:
        text = (
            text[: MARKDOWN_LIMIT_CHARS - 200]
            + "\n\n… (truncated: run `python scripts/ops/plan.py --stack "
            + stack
            + " --diff-against <ref> --format json` for the whole diff)\n"
        )
        text += "\n</details>\n" if text.count("<details>") > text.count("</details>") else ""
    return text + "\n"

def render_table(diff: Mapping[str, Any]) -> None:
    """Print the diff for people (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    s = diff["summary"]
    if diff.get("config_overlay"):
        from rich.markup import escape

        console.print(f"[bold yellow]overlay: {escape(overlay_text(diff))}[/bold yellow]", highlight=False)
    console.print(
        f"[bold]{diff.get('stack')}[/bold] vs {diff.get('ref')}: {s['added']} to add, {s['removed']} to remove, {s['changed']} "
        f"to change, {s['replaced']} replaced, {s.get('recycled', 0)} node group(s) recycled",
        highlight=False,
    )
    if diff.get("base_error"):
        from rich.markup import escape

        console.print(
            f"[yellow]⚠ {escape(redact(diff['base_error']))}: the whole new plan is shown as added[/yellow]", highlight=False
        )
    table = Table(show_lines=False)
    for col in ("", "resource", "type", "input", "before", "after"):
        table.add_column(col, overflow="fold")
    for r in diff["added"]:
        table.add_row("[green]+[/green]", r["name"], r["type"], "", "", "")
    for r in diff["removed"]:
        table.add_row("[red]-[/red]", r["name"], r["type"], "", "", "")
    for c in diff["changed"]:
        for f in c["fields"]:
            mark = "[red]⚠ replace[/red]" if f["replaces"] else ("[yellow]⚠[/yellow]" if f["disrupts"] else "~")
            table.add_row(
                mark,
                c["name"],
                c["type"],
                f["path"],
                *(t if t is not None else "(absent)" for t in value_pair(f["old"], f["new"])),
            )
    for role in diff["vllm"]["roles"]:
        for a in role["argv"]:
            table.add_row("~", f"vllm {role['name']}", "argv", a["flag"], str(a["old"]), str(a["new"]))
    for f in diff["vllm"]["fields"] + diff["plan"]:
        table.add_row("~", "plan", "", f["path"], *(t if t is not None else "(absent)" for t in value_pair(f["old"], f["new"])))
    console.print(table)
