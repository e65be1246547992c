"""Which vLLM build an image is, and whether it can serve the model: engine support as data.

An image reference resolves to one of four kinds of build:

- ``release``: ``<repo>:v<X.Y.Z>`` (a tagged vLLM release). Its version and what it lacks are
  known (``versions.VLLM_RELEASE_GAPS``); the model's ``EngineRequirement`` for the vendor says
  which minimum version and features it needs.
- ``nightly``: ``<repo>:nightly-<40-hex commit>``, the vLLM CI's per-commit image tag (immutable:
  one commit, one tag). Not a release.
- ``digest``: any ``name@sha256:<64 hex>`` (immutable). Not known to be a release.
- ``mutable``: any other tag (``latest``, ``nightly``, ``kimi-k3``, a branch): it can change under
  a running deployment, so it is refused.

``check_engine`` raises ``ConfigError`` (exit 2) for a release known not to serve the model and
for a mutable tag; it returns the build otherwise, for the plan to show. Pure: no Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .model import SPARSE_INDEXER_MLA, EngineRequirement, ModelProfile
from .versions import VLLM_RELEASE_GAPS, VLLM_VERSION

if TYPE_CHECKING:
    from .config import DeploymentSpec
    from .vllm import VllmCommand

_RELEASE_TAG_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-[A-Za-z0-9_.-]+)?$")
_NIGHTLY_TAG_RE = re.compile(r"^nightly-([0-9a-f]{40})$")
_DIGEST_RE = re.compile(r"@sha256:([0-9a-f]{64})$")


@dataclass(frozen=True)
class EngineBuild:
    """The vLLM build an image reference names.

    Attributes:
        image: the full image reference.
        kind: ``release``, ``nightly``, ``digest`` or ``mutable``.
        version: ``X.Y.Z`` for a release, else None.
        pin: the commit (nightly) or digest (digest) that makes the reference immutable, else None.
    """

    image: str
    kind: str
    version: str | None
    pin: str | None

    @property
    def is_release(self) -> bool:
        """Whether this is a tagged vLLM release (the plan says so when it is not)."""
        return self.kind == "release"

    def describe(self) -> str:
        """One line for the plan: what the build is, e.g. ``release 0.33.0`` or ``nightly (not a release) ...``."""
        if self.kind == "release":
            return f"vLLM release {self.version}"
        if self.kind == "nightly":
            return f"vLLM nightly build of commit {self.pin} (not a release; pinned by commit tag)"
        if self.kind == "digest":
            return f"image pinned by digest sha256:{(self.pin or '')[:12]}... (not a release: its vLLM version is not known here)"
        return "mutable tag (refused)"


def parse_engine_image(image: str) -> EngineBuild:
    """Classify an image reference (``name[:tag][@sha256:digest]``) as an ``EngineBuild``.

    A digest wins over the tag (the registry serves the digest whatever the tag says).
    """
    digest = _DIGEST_RE.search(image)
    if digest:
        return EngineBuild(image, "digest", None, digest.group(1))
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        tag = ""
    release = _RELEASE_TAG_RE.match(tag)
    if release:
        return EngineBuild(image, "release", ".".join(release.groups()), None)
    nightly = _NIGHTLY_TAG_RE.match(tag)
    if nightly:
        return EngineBuild(image, "nightly", None, nightly.group(1))
    return EngineBuild(image, "mutable", None, None)


def image_repository(image: str) -> str:
    """``name[:tag][@sha256:digest]`` without tag and digest (a registry port stays: ``host:5000/x``)."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def release_gaps(version: str, image_family: str, requirement: EngineRequirement) -> tuple[str, ...]:
    """Required features that release ``version`` is known to lack for ``image_family``.

    Every release below ``requirement.min_version`` lacks them all (the model card's word);
    a release at or above it lacks what ``versions.VLLM_RELEASE_GAPS`` records.
    """
    if _version_tuple(version) < _version_tuple(requirement.min_version):
        return requirement.features
    known = VLLM_RELEASE_GAPS.get(version, {}).get(image_family, frozenset())
    return tuple(f for f in requirement.features if f in known)


def check_engine(image: str, image_key: str, image_family: str, model: ModelProfile) -> EngineBuild:
    """``engine_blocker`` that raises its blocker: the build, or ``ConfigError`` when it cannot serve.

    Raises:
        ConfigError: a mutable tag, or a release known to lack a required feature.
    """
    build, blocker = engine_blocker(image, image_key, image_family, model)
    if blocker is not None:
        raise blocker
    return build


def engine_blocker(image: str, image_key: str, image_family: str, model: ModelProfile) -> tuple[EngineBuild, Exception | None]:
    """The build ``image`` names, and the error that stops ``pulumi up`` when it is known not to
    serve ``model`` on ``image_family`` (None when it is not known to lack anything).

    A blocker is returned, not raised, so the offline plan can still show everything else the
    stack would declare with the blocker at its top; the program raises it before any resource
    (``components.program.build_context``).

    Args:
        image: the resolved image reference.
        image_key: the config key that chose it (``vllm.image``, ``vllm.imageTag``), for the message;
            ``vllm.image`` when the toolkit's default pin was used.
        image_family: ``cuda`` or ``rocm``.
        model: the model profile (its ``engine_requirements``).

    Returns:
        ``(EngineBuild, ConfigError | None)``.

    Raises:
        ConfigError: a mutable tag (a mistake in the config, not a missing engine).
    """
    from .config import ConfigError  # config imports this module
    from .versions import VLLM_IMAGES

    build = parse_engine_image(image)
    requirement = model.engine_requirements.get(image_family)
    wrong = {family: repo for family, repo in VLLM_IMAGES.items() if family != image_family and repo == image_repository(image)}
    if wrong:
        raise ConfigError(
            image_key, image,
            f"is the {next(iter(wrong))} build of vLLM; this target needs the {image_family} one ({VLLM_IMAGES[image_family]})",
        )
    if build.kind == "mutable":
        raise ConfigError(
            image_key, image,
            "is a mutable tag; pin the engine immutably: a release tag vX.Y.Z, a nightly by commit "
            f"({VLLM_IMAGES[image_family]}:nightly-<40-hex commit>) or name@sha256:<digest>",
        )
    if requirement is None or build.kind != "release":
        return build, None
    gaps = release_gaps(build.version or "", image_family, requirement)
    if gaps:
        default = "" if image_key != "vllm.image" or build.version != VLLM_VERSION else " (the toolkit's default pin)"
        return build, ConfigError(
            image_key, image,
            f"cannot serve {model.display_name}{default}: it lacks {', '.join(gaps)} ({requirement.source}). "
            f"Set kimi-deploy:vllm.image to a build that has it, pinned by commit "
            f"({VLLM_IMAGES[image_family]}:nightly-<40-hex commit>) or digest (name@sha256:<64 hex>), "
            f"or kimi-deploy:vllm.imageTag to v{requirement.min_version} or later once released",
        )
    return build, None


@dataclass(frozen=True)
class FeatureProbe:
    """Where an engine feature lives in a vLLM package tree, and the source text that says a build
    LACKS it (the call that builds the model's layer passes these when the feature is not wired).

    Attributes:
        path: the file, relative to site-packages.
        lacking_markers: any of these in the file means the feature is absent; a missing file too.
    """

    path: str
    lacking_markers: tuple[str, ...]


# feature -> image family -> probe. Read from the vLLM 0.33.0 wheel: vllm/models/kimi_k3/nvidia/mla.py
# builds the Kimi-K3 MLA with ``use_sparse=False, indexer=None`` (its header lists sparse/indexer MLA as
# out of scope); vllm/models/kimi_k3/amd/linear.py passes ``indexer=None, is_sparse=False``.
# scripts/node/engine_check.py applies them inside a candidate image; tests/vllm_contract.py to the wheel.
FEATURE_PROBES: Mapping[str, Mapping[str, FeatureProbe]] = MappingProxyType(
    {
        SPARSE_INDEXER_MLA: MappingProxyType(
            {
                "cuda": FeatureProbe("vllm/models/kimi_k3/nvidia/mla.py", ("use_sparse=False", "indexer=None")),
                "rocm": FeatureProbe("vllm/models/kimi_k3/amd/linear.py", ("indexer=None", "is_sparse=False")),
            }
        ),
    }
)

# Environment variables read by C libraries (no Python source to find them in), each with the public
# documentation of the name. Every other name the deployment sets must be in vllm.envs or in the
# installed Python source of the engine image.
LIBRARY_ENV_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "NCCL_MNNVL_ENABLE": "NCCL docs, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
        "NCCL_CUMEM_ENABLE": "NCCL docs, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
        "NCCL_NVLS_ENABLE": "NCCL docs, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
        "NCCL_DEBUG": "NCCL docs, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
        "NCCL_DEBUG_SUBSYS": "NCCL docs, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
        "FI_PROVIDER": "libfabric fabric(7) man page, Environment variables (ofiwg.github.io/libfabric)",
        "FI_EFA_USE_DEVICE_RDMA": "libfabric fi_efa(7) man page (ofiwg.github.io/libfabric)",
        # FlashInfer ships in the CUDA vLLM image, not in the CPU parser venv: its JIT cache base
        # (flashinfer-python, flashinfer/jit/env.py: FLASHINFER_WORKSPACE_BASE replaces $HOME).
        "FLASHINFER_WORKSPACE_BASE": "flashinfer-python flashinfer/jit/env.py (FlashInfer JIT cache directory)",
    }
)


def verification_request(spec: DeploymentSpec, command: VllmCommand, image: str) -> dict[str, Any]:
    """The request ``scripts/node/engine_check.py`` runs inside ``image`` for ``spec``: the model's
    minimum vLLM version and required features on the target's image family (with their
    ``FEATURE_PROBES``), the tool and reasoning parsers and every role's argv, and every
    environment variable name the deployment sets for vLLM (the roles' plain and secret env, and
    the engine-cache env where caches are restored). A nightly tag's commit must be the build's.

    Raises:
        ValueError: the model has no engine requirement for the target's image family, or a
            required feature has no probe for it (a data error in this module or model.py).
    """
    from .engine_cache import vllm_cache_env

    family = spec.target.image_family
    requirement = spec.model.engine_requirements.get(family)
    if requirement is None:
        raise ValueError(f"model {spec.model.name}: no engine requirement for image family {family}")
    features: dict[str, Any] = {}
    for feature in requirement.features:
        probe = FEATURE_PROBES.get(feature, {}).get(family)
        if probe is None:
            raise ValueError(f"feature {feature}: no probe for image family {family} (engine.FEATURE_PROBES)")
        features[feature] = {"path": probe.path, "lacking_markers": list(probe.lacking_markers)}
    env_names: set[str] = set()
    for role in command.roles:
        env_names.update(role.env)
        env_names.update(role.secret_env)
    if spec.profile.restores_engine_cache and spec.config.storage.mirror.enabled:
        env_names.update(vllm_cache_env())
    # The role that serves HTTP (``server``, or the ``leader`` of a multi-node copy) carries the parsers.
    server = next(role for role in command.roles if role.serves_http)
    build = parse_engine_image(image)
    return {
        "min_version": requirement.min_version,
        "expected_commit": build.pin if build.kind == "nightly" else None,
        "features": features,
        "tool_parser": _flag_value(server.argv, "--tool-call-parser"),
        "reasoning_parser": _flag_value(server.argv, "--reasoning-parser"),
        "env_names": sorted(env_names),
        "library_env_names": sorted(LIBRARY_ENV_SOURCES),
        "argvs": [list(role.concrete_argv()) for role in command.roles],
        "envs": [dict(role.env) for role in command.roles],
    }


def _flag_value(argv: tuple[str, ...], flag: str) -> str | None:
    """The value after ``flag`` (or of ``flag=value``) in ``argv``, else None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
