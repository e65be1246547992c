"""How many tokens and sequences the pinned vLLM schedules per step, the rules its ``SchedulerConfig``
enforces on them, and the `vllm serve` options of ``vllm.extraArgs`` that change what the plan sizes.

Pure data and functions (no vLLM import). The numbers are vLLM 0.34.0's (``versions.VLLM_VERSION``;
the wheel built 2026-11-16, commit 62d4bc3c7); ``tests/test_vllm_contract.py`` runs the wheel's own
``EngineArgs.get_batch_defaults``, ``_set_default_max_num_seqs_and_batched_tokens_args`` and
``SchedulerConfig`` on a set of values and fails when they and this module disagree.

- Defaults, ``vllm/engine/arg_utils.py`` l.3010-3044 (``get_batch_defaults``, the OpenAI API server's
  usage context): a GPU of 160 GiB or more (B300, GB300, MI355X) schedules 16,384 tokens and 1,024
  sequences per step; 70 GiB or more (not an A100) 8,192 and 1,024; smaller GPUs 2,048 and 256.
  ``--performance-mode throughput`` doubles the defaults it fills (l.3222-3227); without chunked
  prefill the token default is at least ``max_model_len`` (l.3229-3238); the token default is at
  most ``max_num_seqs x max_model_len`` (l.3255-3258) and the sequence default at most the tokens
  (l.3269-3271).
- Rules, ``vllm/config/scheduler.py`` l.47, 61 (``Field(ge=1)``) and l.361-380
  (``verify_max_model_len``): both at least 1; tokens at least ``max_num_seqs``; without chunked
  prefill, tokens at least ``max_model_len``. "Tokens at least ``max_num_seqs``" can only fail when
  both are set: with ``--max-num-batched-tokens`` alone vLLM lowers the sequence default to it
  (l.3269-3271), so ``--max-num-batched-tokens 100`` starts with 100 sequences per step (a warning).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError

GIB = 1024**3
SCHEDULER_SOURCE = "vLLM 0.34.0 vllm/engine/arg_utils.py l.3010-3044, 3188-3271; vllm/config/scheduler.py l.47-61, 361-380"


@dataclass(frozen=True)
class BatchDefaults:
    """One tier of ``EngineArgs.get_batch_defaults`` (OpenAI API server context).

    Attributes:
        min_device_memory_bytes: the tier applies to GPUs with at least this much memory, bytes.
        max_num_batched_tokens: tokens scheduled per step, by default.
        max_num_seqs: sequences scheduled per step, by default.
        excluded_names: lower-case substrings of GPU names the tier skips (``a100``).
    """

    min_device_memory_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    excluded_names: tuple[str, ...] = ()


# vllm/engine/arg_utils.py l.3010-3044, highest tier first; the first that fits applies.
BATCH_DEFAULT_TIERS: tuple[BatchDefaults, ...] = (
    BatchDefaults(160 * GIB, 16_384, 1_024),
    BatchDefaults(70 * GIB, 8_192, 1_024, ("a100",)),
    BatchDefaults(0, 2_048, 256),
)
# arg_utils.py l.3222-3227: --performance-mode throughput doubles both defaults.
THROUGHPUT_DEFAULT_FACTOR = 2
PERFORMANCE_MODES: tuple[str, ...] = ("balanced", "interactivity", "throughput")


def batch_defaults(gpu_memory_bytes: int, gpu_name: str) -> BatchDefaults:
    """The default tier of a GPU with ``gpu_memory_bytes`` of memory (bytes) named ``gpu_name``."""
    for tier in BATCH_DEFAULT_TIERS:
        if gpu_memory_bytes >= tier.min_device_memory_bytes and not any(n in gpu_name.lower() for n in tier.excluded_names):
            return tier
    return BATCH_DEFAULT_TIERS[-1]


# --- The options that change what the plan sizes, read from an argv as vLLM's parser reads them ---

# Destinations whose values the plan reads (not owned: extraArgs may set them), each with every option
# string vLLM 0.34.0's serve parser maps to it (tests/test_vllm_contract.py checks the list).
SIZED_DESTS: dict[str, tuple[str, ...]] = {
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
    "max_num_seqs": ("--max-num-seqs",),
    "block_size": ("--block-size",),
    "performance_mode": ("--performance-mode",),
    "enable_chunked_prefill": ("--enable-chunked-prefill", "--no-enable-chunked-prefill", "--disable-chunked-prefill"),
}
_SIZED_OPTIONS = {option: dest for dest, options in SIZED_DESTS.items() for option in options}
_FLAG_VALUES = {"--no-enable-chunked-prefill": "false", "--disable-chunked-prefill": "false"}


def _option_name(arg: str) -> str:
    name = arg.split("=", 1)[0].split(".", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def sized_values(argv: Sequence[str]) -> dict[str, tuple[str, str]]:
    """dest -> (the option as written, its value) for every ``SIZED_DESTS`` destination ``argv`` sets,
    the last one winning as in argparse. Reads ``--flag value``, ``--flag=value``, ``_`` for ``-`` and
    unique prefixes of these options (vLLM's parser allows abbreviations); boolean flags give
    ``"true"``/``"false"``. A flag with no value left gives ``""``."""
    out: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            continue
        name = _option_name(arg)
        option = name if name in _SIZED_OPTIONS else None
        if option is None:
            fits = [o for o in _SIZED_OPTIONS if o.startswith(name)]
            option = fits[0] if len(fits) == 1 else None
        if option is None:
            continue
        dest = _SIZED_OPTIONS[option]
        if dest == "enable_chunked_prefill" and "=" not in arg:
            out[dest] = (arg, _FLAG_VALUES.get(option, "true"))
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i < len(argv):
            value, i = argv[i], i + 1
        else:
            value = ""
        out[dest] = (arg, value)
    return out


@dataclass(frozen=True)
class SchedulerLimits:
    """What the engine schedules per step, as vLLM 0.34.0 resolves it (``SCHEDULER_SOURCE``).

    Attributes:
        max_num_batched_tokens: tokens per step (the workspaces and activations scale with it).
        max_num_seqs: sequences per step (the indexer scores buffer and per-request state scale with it).
        enable_chunked_prefill: whether long prompts are split over steps.
        explicit: the destinations the command sets itself (the rest are vLLM's defaults).
        source: where the values come from, for the plan.
        default_max_num_seqs: the sequence default of the GPU's tier (and performance mode) before
            vLLM caps it at the batched tokens (``arg_utils.py`` l.3269-3271): more than
            ``max_num_seqs`` when a small ``--max-num-batched-tokens`` lowered it (``seqs_lowered_by_tokens``).
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    explicit: frozenset[str]
    source: str
    default_max_num_seqs: int = 0

    @property
    def seqs_lowered_by_tokens(self) -> bool:
        """Whether vLLM lowered its sequence default to a ``--max-num-batched-tokens`` the command sets
        (``--max-num-seqs`` unset): no ``SchedulerConfig`` error, fewer requests at once."""
        return "max_num_seqs" not in self.explicit and self.max_num_seqs < self.default_max_num_seqs


# vLLM reads these as human-readable integers (engine/arg_utils.py l.394-408, utils/argparse_utils.py l.30-80
# human_readable_int): a decimal suffix k/m/g/t (10^3..10^12, decimals allowed) or a binary K/M/G/T
# (2^10..2^40, whole numbers only).
HUMAN_READABLE_INT_DESTS = frozenset({"max_num_batched_tokens"})
_DECIMAL_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def int_value(dest: str, written: str, value: str) -> int:
    """``value`` (of the option ``written``, setting vLLM's ``dest``) as an int, as vLLM's parser
    reads it (``HUMAN_READABLE_INT_DESTS`` take ``16K``, ``25.6k``).

    Raises:
        ConfigError: not a whole number vLLM reads (key ``vllm.extraArgs``).
    """
    text = value.strip()
    match = _HUMAN_INT_RE.fullmatch(text) if dest in HUMAN_READABLE_INT_DESTS else None
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL_SUFFIX:
            return int(float(number) * _DECIMAL_SUFFIX[suffix])
        if "." not in number:
            return int(number) * _BINARY_SUFFIX[suffix]
    try:
        return int(text)
    except ValueError:
        allowed = "a whole number" + (" (or 16K, 25.6k: vLLM's human-readable form)" if dest in HUMAN_READABLE_INT_DESTS else "")
        raise ConfigError("vllm.extraArgs", f"{written} {value}".strip(), f"{dest} must be {allowed}") from None


def scheduler_limits(argv: Sequence[str], *, gpu_memory_bytes: int, gpu_name: str, max_model_len: int) -> SchedulerLimits:
    """The scheduler limits of a command whose flags are ``argv`` on a GPU of ``gpu_memory_bytes``
    (bytes) named ``gpu_name``, serving ``max_model_len`` tokens: the values the command sets, else
    vLLM's defaults resolved as ``_set_default_max_num_seqs_and_batched_tokens_args`` does.
    Not validated (``scheduler_problems``).

    Raises:
        ConfigError: a value that is not a whole number, or an unknown ``--performance-mode``
            (key ``vllm.extraArgs``).
    """
    values = sized_values(argv)
    tier = batch_defaults(gpu_memory_bytes, gpu_name)
    chunked = values.get("enable_chunked_prefill", ("", "true"))[1].strip().lower() not in ("false", "0", "no", "off")
    mode = values.get("performance_mode", ("", "balanced"))
    if mode[1] not in PERFORMANCE_MODES:
        raise ConfigError("vllm.extraArgs", f"{mode[0]} {mode[1]}".strip(), f"allowed: {', '.join(PERFORMANCE_MODES)}")
    factor = THROUGHPUT_DEFAULT_FACTOR if mode[1] == "throughput" else 1
    tokens_set = "max_num_batched_tokens" in values
    seqs_set = "max_num_seqs" in values
    default_seqs = tier.max_num_seqs * factor
    seqs = int_value("max_num_seqs", *values["max_num_seqs"]) if seqs_set else default_seqs
    if tokens_set:
        tokens = int_value("max_num_batched_tokens", *values["max_num_batched_tokens"])
    else:
        tokens = tier.max_num_batched_tokens * factor
        if not chunked:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if not seqs_set:
        seqs = min(seqs, tokens)
    explicit = frozenset(d for d in ("max_num_batched_tokens", "max_num_seqs") if d in values)
    said = ", ".join(sorted(explicit)) or "none"
    return SchedulerLimits(tokens, seqs, chunked, explicit,
                           f"set in the command: {said}; the rest vLLM's defaults for {gpu_name} ({SCHEDULER_SOURCE})",
                           default_seqs)


def scheduler_problems(limits: SchedulerLimits, max_model_len: int) -> list[tuple[str, int, str]]:
    """The rules of vLLM 0.34.0's ``SchedulerConfig`` the limits break, as (dest, value, what is
    allowed); empty when the engine accepts them (``vllm/config/scheduler.py`` l.47, 61, 361-380)."""
    problems = []
    tokens, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
    if seqs < 1:
        problems.append(("max_num_seqs", seqs, "at least 1"))
    if tokens < 1:
        problems.append(("max_num_batched_tokens", tokens, "at least 1"))
    if problems:
        return problems
    if not limits.enable_chunked_prefill and tokens < max_model_len:
        problems.append(("max_num_batched_tokens", tokens,
                         f"at least max_model_len ({max_model_len:,}) without chunked prefill"))
    if tokens < seqs:
        problems.append(("max_num_batched_tokens", tokens, f"at least max_num_seqs ({seqs:,})"))
    return problems


def check_scheduler_limits(limits: SchedulerLimits, max_model_len: int) -> None:
    """Raise the first ``scheduler_problems`` as a one-line config error.

    Raises:
        ConfigError: key ``vllm.extraArgs``, naming vLLM's field, its value and what is allowed.
    """
    problems = scheduler_problems(limits, max_model_len)
    for dest, value, allowed in sorted(problems, key=lambda p: p[0] not in limits.explicit):
        flag = "--" + dest.replace("_", "-")
        if dest in limits.explicit:
            where = "set in vllm.extraArgs"
        else:  # a default the user never wrote, refused because of what they did write: name that
            said = ", ".join("--" + d.replace("_", "-") for d in sorted(limits.explicit))
            where = (f"vLLM's default, which {said} in vllm.extraArgs contradicts; set {flag} there too, or change "
                     f"{said}") if said else "vLLM's default"
        raise ConfigError(
            "vllm.extraArgs", f"{flag} {value}",
            f"is refused by vLLM 0.34.0's SchedulerConfig at start ({where}; allowed: {allowed})",
        )
