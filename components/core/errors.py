"""The bottom of the core: ``ConfigError``, the one-line error every config check raises (key, value,
what is allowed), and the helpers that word its messages. Imports nothing of the project, so every
layer above (the facts, the typed config, the domain, the checks, the entry) can raise it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

NAMESPACE = "kimi-deploy"

# The longest value a config error echoes before cutting it (the message stays one readable line).
MAX_SHOWN_VALUE_CHARS = 120
# What an unknown key's message shows for its value: it may be a token under a misspelt secret key.
UNKNOWN_KEY_VALUE = "[value not shown]"


class ConfigError(ValueError):
    """A stack config value is invalid. ``str(err)`` is one line: key, value, what is allowed.

    Attributes:
        key: full config key, e.g. ``kimi-deploy:storage.fsx.throughputPerTib``.
        value: the value received (never a secret's value).
    """

    def __init__(self, key: str, value: Any, allowed: str):
        # Stack config keys get the namespace; command-line flags (--stack) and env vars stay as given.
        bare = key.startswith(NAMESPACE + ":") or ":" in key or key.startswith("-") or key.isupper()
        self.key = key if bare else f"{NAMESPACE}:{key}"
        self.value = value
        # Booleans as YAML writes them (true/false), not Python's True/False.
        shown = "(unset)" if value is None else ("true" if value else "false") if isinstance(value, bool) else repr(value)
        if len(shown) > MAX_SHOWN_VALUE_CHARS:  # a 20 KB extraArgs must not become a 20 KB error line
            shown = f"{shown[:MAX_SHOWN_VALUE_CHARS]}... ({len(shown):,} characters)"
        super().__init__(f"{self.key}: {shown} {allowed}")



def check_choice(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    """Raise ``ConfigError`` unless ``value`` is one of ``allowed`` (named in the message)."""
    if value not in allowed:
        raise ConfigError(key, value, f"is not allowed (allowed: {', '.join(allowed)})")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest candidate (difflib, cutoff 0.6), else ``""``; first,
    the invisible characters ``name`` holds (``invisible_characters``), which no message shows."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return invisible_characters(name) + (f"; did you mean {close[0]}?" if close else "")


def invisible_characters(text: str) -> str:
    """``"; it holds U+200B ZERO WIDTH SPACE at character 6"`` for the first character of ``text``
    that prints as nothing or as a blank (Unicode categories Cc, Cf, Zs other than the space, Zl,
    Zp), else ``""``: a key pasted with one looks right and is unknown."""
    import unicodedata

    for i, ch in enumerate(text, start=1):
        if ch != " " and unicodedata.category(ch) in ("Cc", "Cf", "Zs", "Zl", "Zp"):
            return f"; it holds U+{ord(ch):04X} {unicodedata.name(ch, 'a control character')} at character {i}"
    return ""
