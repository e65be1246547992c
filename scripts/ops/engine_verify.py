#!/usr/bin/env python3
"""``kimi-deploy engine verify --image IMAGE``: prove a vLLM build serves the model before a GPU node pulls it.

    kimi-deploy engine verify --image vllm/vllm-openai:nightly-<40-hex commit> [--stack b300]

Runs ``scripts/node/engine_check.py`` (standard library only) with the image's own python inside the
image, through a container runtime (the first of docker, podman on PATH whose ``info`` answers: a
docker client without its daemon is skipped, and the report says so; ``--runtime`` forces one), with
no network and no GPU: the same checks the contract tests run on the installed vLLM wheel (its
version against the model card's minimum, the model profile's required features on the target's
vendor, e.g. the sparse-indexer MLA of Gated DSA, the tool and reasoning parsers, every
environment variable name the stack sets, and each ``vllm serve`` command through vLLM's own
parser). A nightly tag must also be the commit it names. The tag is resolved to the image's
registry digest (``<runtime> image inspect``: RepoDigests), and a passing build prints the exact
``pulumi config set`` line that pins it. The image's own Env (``image inspect``: Config.Env) is read
too: each role's env is checked laid over it, and an image whose PYTHONPATH the command would
replace (the API guard's directory) is refused.

Exit codes: 0 proven; 1 refused (a check failed, or the image cannot be pulled or checked: not
proven); 2 usage or config error, or no container runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a file
    import _cli  # noqa: F401

from scripts.ops._cli import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    CliParser,
    UsageError,
    one_line,
    print_json,
    print_overlay_notice,
    prog_name,
)

RUNTIMES: tuple[str, ...] = ("docker", "podman")
# Where the check programs are mounted (read-only) inside the image.
CHECK_MOUNT = "/kimi-engine-check"
# The programs shipped into the image: the check itself (a node program, scripts/node/) and
# vLLM's argv check it runs beside it (scripts/ops/vllm_argv_check.py, also run by preflight).
CHECK_SOURCES: dict[str, Path] = {
    "engine_check.py": Path(__file__).resolve().parents[1] / "node" / "engine_check.py",
    "vllm_argv_check.py": Path(__file__).resolve().parent / "vllm_argv_check.py",
}
CHECK_PROGRAMS: tuple[str, ...] = tuple(CHECK_SOURCES)
# Pulling a ~25 GB engine image and importing vLLM take minutes, not hours.
PULL_TIMEOUT_SECONDS = 3600
CHECK_TIMEOUT_SECONDS = 1800
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class NotProven(Exception):
    """The image could not be pulled, inspected or checked (exit 1: the build is not proven)."""


# `<runtime> info` answers in well under a second where the runtime works (podman's first run sets
# up its storage in a few); a daemon socket that accepts and never answers must not hang the command.
RUNTIME_PROBE_TIMEOUT_SECONDS = 15


def runtime_answers(path: str, run: Runner = subprocess.run) -> str | None:
    """None when ``<path> info`` answers (a docker daemon is up; podman needs none), else why not
    (one line: the last line ``info`` printed on stderr, or that it did not answer in time)."""
    name = Path(path).name
    try:
        proc = run([path, "info", "--format", "{{json .}}"], capture_output=True, text=True, check=False,
                   timeout=RUNTIME_PROBE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return f"`{name} info` did not answer within {RUNTIME_PROBE_TIMEOUT_SECONDS} s"
    except OSError as err:
        return f"`{name} info` cannot run: {one_line(err)}"
    return None if proc.returncode == 0 else _last_line(proc.stderr)


@dataclass(frozen=True)
class RuntimeProbe:
    """One container runtime tried: ``name`` (docker, podman), ``path`` (None: not on PATH) and
    ``problem`` (why it is not used; None: it answered)."""

    name: str
    path: str | None
    problem: str | None

    def describe(self) -> str:
        """``docker: <why not>`` (or ``docker: answers``)."""
        return f"{self.name}: {self.problem or 'answers'}"


@dataclass(frozen=True)
class RuntimeSelection:
    """The runtimes tried, in order, up to the first that answers (``chosen``; None: none did)."""

    probes: tuple[RuntimeProbe, ...]

    @property
    def chosen(self) -> RuntimeProbe | None:
        """The runtime used: the last one tried, when it answered."""
        return self.probes[-1] if self.probes and self.probes[-1].problem is None else None

    @property
    def skipped(self) -> tuple[RuntimeProbe, ...]:
        """The runtimes tried and not used."""
        return tuple(p for p in self.probes if p.problem is not None)

    def describe(self) -> str:
        """One line: ``podman (/usr/bin/podman); skipped docker: Cannot connect to the Docker daemon ...``
        (each skipped runtime with the last line its ``info`` printed, ``not on PATH`` or a timeout),
        or ``no container runtime answers (docker: ...; podman: ...)``."""
        if self.chosen is None:
            return "no container runtime answers (" + "; ".join(p.describe() for p in self.probes) + ")"
        head = f"{self.chosen.name} ({self.chosen.path})"
        return head + "".join(f"; skipped {p.describe()}" for p in self.skipped)

    def brief(self, why_chars: int = 60) -> str:
        """``describe()`` for a table cell: no path, each reason cut to ``why_chars`` characters."""
        if self.chosen is None:
            return self.describe()
        cut = [(p.name, p.problem or "") for p in self.skipped]
        return self.chosen.name + "".join(f"; skipped {n}: {w if len(w) <= why_chars else w[:why_chars - 3] + '...'}"
                                          for n, w in cut)


def select_runtime(explicit: str | None = None, which: Callable[[str], str | None] = shutil.which,
                   run: Runner = subprocess.run) -> RuntimeSelection:
    """Try ``explicit`` alone (``--runtime``), else docker then podman, and stop at the first on PATH
    whose ``info`` answers (a docker CLI without its daemon is no runtime: podman is tried next)."""
    probes: list[RuntimeProbe] = []
    for name in (explicit,) if explicit else RUNTIMES:
        assert name is not None
        path = which(name)
        probe = RuntimeProbe(name, path, "not on PATH" if not path else runtime_answers(path, run))
        probes.append(probe)
        if probe.problem is None:
            break
    return RuntimeSelection(tuple(probes))


def find_runtime(explicit: str | None = None, which: Callable[[str], str | None] = shutil.which,
                 run: Runner = subprocess.run) -> RuntimeSelection:
    """``select_runtime`` that must find one.

    Raises:
        UsageError: none answers (one line naming each runtime tried and why it is not used).
    """
    selection = select_runtime(explicit, which, run)
    if selection.chosen is not None:
        return selection
    wanted = explicit or " or ".join(RUNTIMES)
    if all(p.path is None for p in selection.probes):
        raise UsageError(f"--runtime: no container runtime ({wanted}) on PATH; install one or run the check where one is")
    why = "; ".join(p.describe() for p in selection.probes)
    raise UsageError(f"--runtime: no container runtime ({wanted}) answers ({why})")


def usable_runtime() -> str | None:
    """The path of ``select_runtime()``'s choice, or None."""
    chosen = select_runtime().chosen
    return chosen.path if chosen else None


def qualified(image: str) -> str:
    """``image`` with its registry named: a reference whose first component is not a registry host
    (no ``.`` or ``:``, not ``localhost``) is Docker Hub's, written out as ``docker.io/[library/]``.
    docker reads a short name so by itself; podman refuses one unless its registries.conf lists
    unqualified-search registries ("short-name did not resolve"), so every runtime is given the
    full name (the distribution reference grammar, github.com/distribution/reference
    ``normalize.go``)."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


def pull_command(runtime: str, image: str) -> list[str]:
    """``<runtime> pull IMAGE`` (``qualified``)."""
    return [runtime, "pull", qualified(image)]


def inspect_command(runtime: str, image: str) -> list[str]:
    """``<runtime> image inspect`` printing the image's registry digests as JSON (``qualified``)."""
    return [runtime, "image", "inspect", "--format", "{{json .RepoDigests}}", qualified(image)]


def image_env_command(runtime: str, image: str) -> list[str]:
    """``<runtime> image inspect`` printing the image's ``Config.Env`` (``["NAME=value", ...]``) as JSON."""
    return [runtime, "image", "inspect", "--format", "{{json .Config.Env}}", qualified(image)]


def read_image_env(runtime: str, image: str, run: Runner = subprocess.run) -> dict[str, str]:
    """The environment ``image`` sets (its ``ENV`` lines), name -> value.

    Raises:
        NotProven: the runtime cannot inspect it.
    """
    proc = run(image_env_command(runtime, image), capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise NotProven(f"{image}: {Path(runtime).name} image inspect (Env) failed: {_last_line(proc.stderr)}")
    try:
        entries = json.loads(proc.stdout.strip() or "null") or []
    except ValueError:
        raise NotProven(f"{image}: {Path(runtime).name} image inspect printed no Env list: {_last_line(proc.stdout)}") from None
    env: dict[str, str] = {}
    for entry in entries:
        name, _, value = str(entry).partition("=")
        env[name] = value
    return env


def image_env_check(image_env: dict[str, str], role_envs: list[dict[str, str]]) -> dict[str, Any]:
    """What the image's Env does to the rendered command, as one check of the report
    (``{"name": "image-env", "ok", "detail"}``).

    Refused: a search path (``vllm.ENV_REPLACED_SEARCH_PATHS``: PYTHONPATH) that the image sets and a
    role replaces: the role's value (the API guard's directory) cannot be prepended to the image's
    on either platform, so the image's own modules would vanish from the path. Every other variable
    the role also sets is replaced (named in the detail: e.g. an image's VLLM_USE_RUST_FRONTEND=1
    under the command's pinned 0); what the role leaves alone reaches vLLM and is checked with the
    role's env by the argv check (``with_image_env``).
    """
    from components.core.vllm import ENV_REPLACED_SEARCH_PATHS

    problems: list[str] = []
    replaced: dict[str, str] = {}
    for env in role_envs:
        for name, value in env.items():
            if name in image_env and image_env[name] != value:
                replaced[name] = f"{name} ({image_env[name]!r} -> {value!r})"
                if name in ENV_REPLACED_SEARCH_PATHS and image_env[name]:
                    problems.append(
                        f"the image sets {name}={image_env[name]!r} and the command replaces it with {value!r} (a "
                        f"pod's env and docker run -e cannot prepend to an image's value): the image's own modules "
                        f"would be lost; rebuild it without {name} (install them into site-packages)")
    detail = "; ".join(dict.fromkeys(problems)) if problems else (
        f"{len(image_env)} variables; the command replaces " + ", ".join(sorted(replaced.values())) if replaced
        else f"{len(image_env)} variables; none the command sets")
    return {"name": "image-env", "ok": not problems, "detail": detail}


def with_image_env(request: dict[str, Any], image_env: dict[str, str]) -> dict[str, Any]:
    """``request`` with each role's env laid over the image's (the container's real environment):
    the argv check then runs what the pod or instance will run through vLLM's own env checks."""
    envs = request.get("envs") or []
    return {**request, "envs": [{**image_env, **(env or {})} for env in envs]}


def run_command(runtime: str, image: str, check_dir: str) -> list[str]:
    """The ``<runtime> run`` of the check: the image's ``python3`` on the mounted check program,
    request on stdin, no network, no GPU, removed afterwards."""
    return [
        runtime, "run", "--rm", "-i", "--network", "none", "--pull", "never",
        "--entrypoint", "python3",
        "-e", "VLLM_TARGET_DEVICE=cpu", "-e", "HF_HUB_OFFLINE=1", "-e", "CUDA_VISIBLE_DEVICES=",
        "-v", f"{check_dir}:{CHECK_MOUNT}:ro",
        qualified(image), f"{CHECK_MOUNT}/{CHECK_PROGRAMS[0]}",
    ]


def image_repository(image: str) -> str:
    """``name[:tag][@digest]`` without tag and digest (``components.core.engine.image_repository``)."""
    from components.core.engine import image_repository as repository

    return repository(image)


def pick_digest(image: str, repo_digests: list[str]) -> str | None:
    """The ``repo@sha256:...`` of ``image``'s repository among ``repo_digests`` (docker normalises
    Docker Hub names: ``docker.io/library/x`` / ``docker.io/org/x`` match ``x`` / ``org/x``)."""
    wanted = image_repository(image)
    candidates = {wanted, f"docker.io/{wanted}", f"docker.io/library/{wanted}"}
    for entry in repo_digests:
        repo, _, digest = entry.partition("@")
        if repo in candidates and digest.startswith("sha256:"):
            return f"{wanted}@{digest}"
    return None


def resolve_digest(runtime: str, image: str, run: Runner = subprocess.run) -> str:
    """``repo@sha256:<digest>`` of ``image`` (pulled): as given when pinned by digest, else from
    ``<runtime> image inspect`` (RepoDigests, what the registry served).

    Raises:
        NotProven: the runtime cannot inspect it, or it has no registry digest (built locally).
    """
    if "@sha256:" in image:
        return f"{image_repository(image)}@{image.split('@', 1)[1]}"
    proc = run(inspect_command(runtime, image), capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise NotProven(f"{image}: {Path(runtime).name} image inspect failed: {_last_line(proc.stderr)}")
    try:
        digests = json.loads(proc.stdout.strip() or "[]") or []
    except ValueError:
        digests = []
    pinned = pick_digest(image, list(digests))
    if pinned is None:
        raise NotProven(f"{image}: no registry digest (a local build?): push it and verify the pushed image")
    return pinned


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return one_line(lines[-1])[:300] if lines else "(no output)"


def _check_dir() -> str:
    """A temporary directory holding only the check programs (mounted read-only)."""
    path = tempfile.mkdtemp(prefix="kimi-engine-check-")
    for name in CHECK_PROGRAMS:
        shutil.copy2(CHECK_SOURCES[name], os.path.join(path, name))
    os.chmod(path, 0o755)
    return path


def run_check(runtime: str, image: str, request: dict[str, Any], run: Runner = subprocess.run) -> dict[str, Any]:
    """Run ``engine_check.py`` in ``image`` with ``request``; its report.

    Raises:
        NotProven: the check could not run (no python3 in the image, no vllm package, a crash).
    """
    check_dir = _check_dir()
    try:
        proc = run(run_command(runtime, image, check_dir), input=json.dumps(request), capture_output=True, text=True,
                   check=False, timeout=CHECK_TIMEOUT_SECONDS)
    finally:
        shutil.rmtree(check_dir, ignore_errors=True)
    report: dict[str, Any] = {}
    if proc.stdout.strip():
        try:
            report = json.loads(proc.stdout.strip().splitlines()[-1])
        except ValueError:
            report = {}
    if proc.returncode not in (0, 1) or "checks" not in report:
        why = report.get("error") or _last_line(proc.stderr)
        raise NotProven(f"{image}: the check could not run (exit {proc.returncode}): {why}")
    return report


def config_set_line(stack: str, pinned_image: str) -> str:
    """The exact command that pins ``pinned_image`` in ``stack``."""
    return f"pulumi config set --stack {stack} --path kimi-deploy:vllm.image {pinned_image}"


@dataclass(frozen=True)
class Verification:
    """The outcome of ``verify``.

    Attributes:
        image: the image as given; pinned: ``repo@sha256:...`` (None when it could not be resolved).
        stacks: the stacks whose commands and env were checked.
        report: engine_check.py's report (None when the check did not run).
        error: why the build is not proven when the check did not run, else None.
    """

    image: str
    pinned: str | None
    stacks: tuple[str, ...]
    report: dict[str, Any] | None
    error: str | None

    @property
    def proven(self) -> bool:
        """Every check ran and passed."""
        return self.error is None and self.report is not None and bool(self.report.get("ok"))

    def refusals(self) -> list[str]:
        """One line per failed check (or the error)."""
        if self.error is not None:
            return [self.error]
        return [f"{c['name']}: {c['detail']}" for c in (self.report or {}).get("checks", []) if not c["ok"]]


IMAGE_FORMS = "repo:vX.Y.Z, repo:nightly-<40-hex commit> or repo@sha256:<64 hex>"


def check_image_reference(image: str) -> None:
    """Refuse an ``--image`` that names no image at all, before anything else is read.

    Raises:
        UsageError: empty, blank, holding whitespace or control characters, or without a repository
            name (``:vX.Y.Z``); one line naming ``--image`` and the forms allowed.
    """
    if not image.strip():
        raise UsageError(f"--image: {image!r} is empty; give the image to check: {IMAGE_FORMS}")
    if any(c.isspace() or not c.isprintable() for c in image) or not image_repository(image):
        raise UsageError(f"--image: {image!r} is not an image reference; give {IMAGE_FORMS}")


def stacks_for_image(image: str, stack: str | None) -> list[Any]:
    """The specs to verify ``image`` for: ``stack``, else every stack whose target pulls from the
    image's repository (``versions.VLLM_IMAGES``).

    Raises:
        UsageError: an image from another repository without ``--stack``, or no stack matches.
        ConfigError: the stack's config is invalid, or the image is the other vendor's build or a
            mutable tag (``engine.engine_blocker``).
    """
    from components.core.config import stack_names
    from components.core.engine import engine_blocker
    from components.core.load import load_stack
    from components.core.versions import VLLM_IMAGES

    if stack is not None:
        specs = [load_stack(stack)]
    else:
        families = [f for f, repo in VLLM_IMAGES.items() if repo == image_repository(image)]
        if not families:
            raise UsageError(f"--stack: {image} is not from {' or '.join(VLLM_IMAGES.values())}: name the stack to check it for")
        specs = [s for s in (load_stack(n) for n in stack_names()) if s.target.image_family in families]
        if not specs:
            raise UsageError(f"--stack: no stack in stacks/ uses {image_repository(image)}")
    for spec in specs:
        engine_blocker(image, "--image", spec.target.image_family, spec.model)  # raises for a mutable tag or wrong vendor
    return specs


def merged_request(specs: list[Any], image: str) -> dict[str, Any]:
    """One request covering every spec (they share the image family and model): argvs and env names of all."""
    from components.core.engine import verification_request
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    requests = [verification_request(s, build_vllm_command(s, compute_sizing(s)), image) for s in specs]
    merged = dict(requests[0])
    merged["env_names"] = sorted({n for r in requests for n in r["env_names"]})
    merged["argvs"] = [a for r in requests for a in r["argvs"]]
    merged["envs"] = [e for r in requests for e in r["envs"]]
    return merged


def verify(image: str, stack: str | None, runtime: str, *, pull: bool = True, run: Runner = subprocess.run) -> Verification:
    """Pull ``image``, resolve its digest and run the checks for ``stack`` (or every matching stack).

    Raises:
        UsageError, ConfigError: as ``stacks_for_image``.
    """
    specs = stacks_for_image(image, stack)
    names = tuple(s.stack for s in specs)
    request = merged_request(specs, image)
    try:
        if pull:
            proc = run(pull_command(runtime, image), capture_output=True, text=True, check=False, timeout=PULL_TIMEOUT_SECONDS)
            if proc.returncode != 0:
                raise NotProven(f"{image}: cannot be pulled ({_last_line(proc.stderr)}): not proven")
        pinned = resolve_digest(runtime, image, run)
        image_env = read_image_env(runtime, image, run)
        report = run_check(runtime, pinned if "@sha256:" in image else image, with_image_env(request, image_env), run)
    except NotProven as err:
        return Verification(image, None, names, None, str(err))
    env_check = image_env_check(image_env, list(request.get("envs") or []))
    report = {**report, "checks": [*report["checks"], env_check], "ok": bool(report.get("ok")) and env_check["ok"]}
    return Verification(image, pinned, names, report, None)


def render(result: Verification, selection: RuntimeSelection | None = None) -> str:
    """The human report: the runtime used (and why others were skipped), one line per check, the
    verdict, and the config lines of a proven build."""
    lines = [f"engine verify {result.image} (stacks: {', '.join(result.stacks)})"]
    if selection is not None:
        lines.append(f"  runtime: {selection.describe()}")
    if result.report is not None:
        lines.append(f"  vLLM {result.report.get('vllm_version')} (commit {result.report.get('commit_id') or 'unknown'})")
        for check in result.report["checks"]:
            lines.append(f"  {'pass' if check['ok'] else 'FAIL'}  {check['name']:<28} {check['detail']}")
    if result.proven:
        lines.append(f"proven: {result.pinned}; pin it:")
        lines += [f"  {config_set_line(stack, result.pinned or result.image)}" for stack in result.stacks]
    else:
        lines.append("refused: " + "; ".join(result.refusals()))
    return "\n".join(lines)


def build_parser() -> CliParser:
    # The module docstring is RST for readers of the code; --help shows plain backquotes.
    parser = CliParser(prog=prog_name("scripts/ops/engine_verify.py"), description=__doc__.split("\n\n")[0].replace("``", "`"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="verify")
    verify_parser = sub.add_parser(
        "verify", help="check a candidate vLLM image against the model's engine requirements",
        description=__doc__.split("\n\n", 2)[2].split("\n\nExit codes")[0].replace("``", "`"), allow_abbrev=False,
    )
    verify_parser.error = parser.error  # type: ignore[method-assign]  # one-line usage errors, exit 2
    verify_parser.add_argument("--image", required=True,
                               help="the image: repo:nightly-<40-hex commit>, repo@sha256:<digest> or repo:vX.Y.Z")
    verify_parser.add_argument("--stack", help="check for this stack (default: every stack that uses the image's repository)")
    verify_parser.add_argument("--runtime", choices=RUNTIMES,
                               help="use this container runtime only (default: the first of docker, podman on PATH whose "
                                    "`info` answers; the report says which was used and why the others were skipped)")
    verify_parser.add_argument("--no-pull", action="store_true", help="use the image already present (no registry call)")
    verify_parser.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_image_reference(args.image)
    print_overlay_notice()
    stacks_for_image(args.image, args.stack)  # the image name and the stack first: offline, before any runtime
    selection = find_runtime(args.runtime)
    assert selection.chosen is not None and selection.chosen.path is not None
    result = verify(args.image, args.stack, selection.chosen.path, pull=not args.no_pull)
    if args.json:
        print_json({"image": result.image, "pinned": result.pinned, "stacks": list(result.stacks), "proven": result.proven,
                    "runtime": {"name": selection.chosen.name, "path": selection.chosen.path,
                                "skipped": [{"name": p.name, "why": p.problem} for p in selection.skipped]},
                    "refusals": [] if result.proven else result.refusals(), "report": result.report,
                    "config_set": [config_set_line(s, result.pinned) for s in result.stacks] if result.proven and result.pinned
                    else []})
    else:
        print(render(result, selection))
    return EXIT_OK if result.proven else EXIT_CHECK_FAILED


if __name__ == "__main__":
    from scripts.ops._cli import run_cli

    sys.exit(run_cli(main))
