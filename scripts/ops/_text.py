"""Text laid out for a terminal of a given width, without breaking a word.

Used by the plan's table (``scripts/ops/plan.py``). Three tools:

- ``wrap``: words filled into lines of at most ``width`` columns, with a first-line prefix and a
  hanging indent. A line breaks only at spaces; a word longer than a whole line is folded after
  one of ``FOLD_AFTER`` (``/`` ``:`` ``,`` ``;`` ``=`` ``&`` ``?``), so a URL or a Pulumi type
  token breaks between its parts, never inside a name. A piece that still does not fit is left
  whole and overflows (nothing is ever cut mid-word).
- ``wrap_items``: the same for a list of items (``Subnet x3``) that must each stay on one line.
- ``shell_command``: ``KEY=value ... program args`` as a copy-pasteable multi-line POSIX shell
  command with `` \\`` continuations: assignments packed, one option (with its values) per line,
  and an argument too long for any line split into quoted pieces joined by a backslash-newline
  outside the quotes (the shell removes it, so the pieces form one word again).

Widths count characters (every character the plan prints is one column wide). Standard library only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

# Characters after which an over-long word may be folded (they end a part of a path, a type
# token, a list or a query).
FOLD_AFTER = "/:,;=&?"
_FOLD_RE = re.compile(f"(?<=[{re.escape(FOLD_AFTER)}])")
CONTINUATION = " \\"


def fold_word(word: str, width: int) -> list[str]:
    """``word`` as pieces of at most ``width`` characters, split only after ``FOLD_AFTER``
    characters (greedy: as much as fits on each piece). A part with no fold point that is longer
    than ``width`` stays whole. ``"".join(pieces) == word``."""
    if len(word) <= width:
        return [word]
    parts = [p for p in _FOLD_RE.split(word) if p]
    pieces: list[str] = []
    current = ""
    for part in parts:
        if current and len(current) + len(part) > width:
            pieces.append(current)
            current = ""
        current += part
    if current:
        pieces.append(current)
    return pieces


# Stands for a space inside a phrase that must not be broken (never in real text).
_GLUE = "\x00"


def wrap(text: str, width: int, prefix: str = "", indent: str | None = None, keep: Sequence[str] = ()) -> list[str]:
    """``text`` filled into lines of at most ``width`` characters.

    Args:
        text: words separated by whitespace (runs of whitespace count as one space).
        width: columns per line (at least 1).
        prefix: starts the first line (a label, a bullet); counted in its width.
        indent: starts every further line (default: as many spaces as ``prefix``).
        keep: phrases with spaces that stay on one line (e.g. ``<known after pulumi up>``).

    Returns:
        The lines (at least one), without trailing spaces. Lines break at spaces; a word longer
        than a line is folded with ``fold_word``.
    """
    for phrase in keep:
        text = text.replace(phrase, phrase.replace(" ", _GLUE))
    indent = " " * len(prefix) if indent is None else indent
    lines: list[str] = []
    line = prefix
    empty = True  # nothing but the prefix/indent on ``line`` yet
    for word in text.split():
        room = width - len(line) - (0 if empty else 1)
        if len(word) <= room:
            line += ("" if empty else " ") + word
            empty = False
            continue
        if not empty:
            lines.append(line)
            line, empty = indent, True
        for piece in fold_word(word, max(1, width - len(indent))):
            if not empty:
                lines.append(line)
                line = indent
            line += piece
            empty = False
    lines.append(line.rstrip())
    return [line.replace(_GLUE, " ") for line in lines]


def wrap_items(items: Sequence[str], width: int, prefix: str = "", indent: str | None = None, sep: str = ", ") -> list[str]:
    """``items`` joined by ``sep`` into lines of at most ``width`` characters; a line breaks only
    between items (``sep`` stays at the end of the line). An item longer than a line overflows."""
    indent = " " * len(prefix) if indent is None else indent
    lines: list[str] = []
    line, empty = prefix, True
    for i, item in enumerate(items):
        text = item + (sep.rstrip() if i < len(items) - 1 else "")
        glue = "" if empty else " " if sep.endswith(" ") else ""
        if not empty and len(line) + len(glue) + len(text) > width:
            lines.append(line)
            line, empty, glue = indent, True, ""
        line += glue + text
        empty = False
    lines.append(line.rstrip())
    return lines


def _quoted_pieces(word: str, width: int) -> list[str]:
    """``word`` folded (``fold_word``) into shell-quoted pieces of at most ``width`` characters
    with room for the backslash that joins them; quoting can lengthen a piece (``'`` becomes
    ``'"'"'``), so the fold is retried narrower until the quoted pieces fit (or cannot fold)."""
    budget = width - 1
    while True:
        pieces = [shlex.quote(p) for p in fold_word(word, budget)]
        if all(len(p) + 1 <= width for p in pieces) or budget <= 8:
            return pieces
        budget -= 4


def shell_units(argv: Sequence[str]) -> list[list[str]]:
    """``argv`` grouped for reading: the program with its leading positionals (``vllm serve
    /models/x``), then each ``--option`` with the values that follow it."""
    units: list[list[str]] = []
    for word in argv:
        if word.startswith("-") or not units:
            units.append([word])
        else:
            units[-1].append(word)
    return units


def shell_command(
    assignments: Sequence[str], argv: Sequence[str], width: int, option_indent: str = "  ", *, pack: bool = False
) -> list[str]:
    """A copy-pasteable shell command for ``assignments`` (``KEY=<shell text>``, already quoted)
    followed by ``argv`` (quoted here with ``shlex.quote``), in lines of at most ``width``
    characters where possible.

    Layout: the assignments packed on lines from column 0; the program with its positionals on
    the next line; then one option with its values per line, indented by ``option_indent``
    (``pack``: as many whole options per line as fit). Every
    line but the last ends with `` \\``. An option that does not fit puts each value on a line of
    its own; a value that still does not fit is split after ``FOLD_AFTER`` characters into
    quoted pieces, each continued with a backslash right after its closing quote and the next
    starting in column 0, so the shell joins them into the original word.
    """
    body = width - len(CONTINUATION)
    lines: list[str] = []
    joined: set[int] = set()  # lines that end inside a word split across lines (no " \\" added)
    packable = False  # whether the last line holds whole options only (``pack`` may add to it)
    for line in wrap_items(list(assignments), body, sep=" "):
        if line:
            lines.append(line)
    for i, unit in enumerate(shell_units(argv)):
        lead = "" if i == 0 else option_indent
        words = [shlex.quote(w) for w in unit]
        whole = " ".join(words)
        if pack and packable and len(lines[-1]) + 1 + len(whole) <= body:
            lines[-1] += " " + whole
            continue
        if len(lead) + len(whole) <= body:
            lines.append(lead + whole)
            packable = i > 0
            continue
        packable = False
        line = lead + words[0]
        for raw, word in zip(unit[1:], words[1:], strict=True):
            if len(line) + 1 + len(word) <= body:
                line += " " + word
                continue
            lines.append(line)
            value_indent = lead + "  "
            if len(value_indent) + len(word) <= body:
                line = value_indent + word
                continue
            pieces = _quoted_pieces(raw, body - len(value_indent))
            # ``'a'\`` + newline + ``'b'``: the backslash-newline outside the quotes is removed
            # by the shell and the quoted pieces join into one word (no indent on the next line).
            for j, piece in enumerate(pieces[:-1]):
                joined.add(len(lines))
                lines.append((value_indent if j == 0 else "") + piece + "\\")
            line = (value_indent if len(pieces) == 1 else "") + pieces[-1]
        lines.append(line)
    last = len(lines) - 1
    return [text if k in joined or k == last else text + CONTINUATION for k, text in enumerate(lines)]


if __name__ == "__main__":  # a library, not a command; it still answers --help
    import sys

    print(__doc__.strip() + "\n\nThis module is imported by scripts/ops/plan.py; run that (it answers --help).")
    sys.exit(0 if sys.argv[1:] in ([], ["-h"], ["--help"]) else 2)
