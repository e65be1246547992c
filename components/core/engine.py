"""Which vLLM build an image is, and whether it can serve the model: engine support as data.

An image reference resolves to one of four kinds of build:

- ``release``: ``<repo>:v<X.Y.Z>`` (a tagged vLLM release; a stack trusts only vLLM's own repository on
  Docker Hub to hold one, ``check_release_repository``). Its version and what it lacks are
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
from typing import Any

from .config.spec import DeploymentSpec
from .engine_cache import vllm_cache_env
from .errors import ConfigError
from .model import SPARSE_INDEXER_MLA, EngineRequirement, ModelProfile
from .versions import VLLM_IMAGES, VLLM_RELEASE_GAPS, VLLM_VERSION
from .vllm import VllmCommand

_RELEASE_TAG_RE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)(?:-[A-Za-z0-9_.-]+)?\Z")
_NIGHTLY_TAG_RE = re.compile(r"^nightly-([0-9a-f]{40})\Z")
_DIGEST_RE = re.compile(r"@sha256:([0-9a-f]{64})\Z")


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


# Docker Hub's names (Docker's reference normalisation, distribution/reference normalize.go: the
# default domain docker.io, the legacy index.docker.io): `docker.io/vllm/vllm-openai` is `vllm/vllm-openai`.
_DOCKER_HUB_HOSTS: tuple[str, ...] = ("docker.io/", "index.docker.io/", "registry-1.docker.io/")


def hub_repository(image: str) -> str:
    """``image_repository`` with Docker Hub's host dropped (``docker.io/vllm/vllm-openai`` ->
    ``vllm/vllm-openai``): the name the release repositories of ``versions.VLLM_IMAGES`` are
    trusted by. Another registry's path stays whole (``ghcr.io/x/vllm-openai``)."""
    repository = image_repository(image)
    for host in _DOCKER_HUB_HOSTS:
        if repository.lower().startswith(host):
            return repository[len(host):]
    return repository


def check_release_repository(image: str, image_key: str, image_family: str) -> None:
    """Registries are trusted by name: a release tag (``v`` + ``versions.VLLM_VERSION``) means vLLM's release only in vLLM's
    own repository for ``image_family`` on Docker Hub (``versions.VLLM_IMAGES``: ``vllm/vllm-openai``,
    ``vllm/vllm-openai-rocm``; ``docker.io/`` spellings included, ``hub_repository``). Anyone can
    push that tag to ``ghcr.io/<them>/vllm-openai`` or ``<registry>/vllm/vllm-openai``, and the
    image receives the API key and the weights. Another registry's build is pinned by digest (a
    non-release, which ``kimi-deploy engine verify`` proves from its content).

    Raises:
        ConfigError: a release tag outside the release repository, naming ``image_key``.
    """
    build = parse_engine_image(image)
    if build.kind == "release" and hub_repository(image) != VLLM_IMAGES[image_family]:
        raise ConfigError(
            image_key, image,
            f"is tagged as vLLM release v{build.version} but is not from vLLM's release repository "
            f"{VLLM_IMAGES[image_family]} (Docker Hub): another registry's tag may name any build. Use "
            f"{VLLM_IMAGES[image_family]}:v{build.version}, or pin that registry's build by digest (name@sha256:<64 hex>) "
            "once `kimi-deploy engine verify --image IMAGE` passes",
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def release_gaps(version: str, image_family: str, requirement: EngineRequirement) -> tuple[str, ...]:
    """Required features that release ``version`` is known to lack for ``image_family``.

    Every release below ``requirement.min_version`` lacks them all (the model card's word);
    a release at or above it lacks what ``versions.VLLM_RELEASE_GAPS`` records.
    """
    return tuple(release_gap_causes(version, image_family, requirement))


def release_gap_causes(version: str, image_family: str, requirement: EngineRequirement) -> dict[str, str]:
    """``release_gaps`` with the cause of each: feature -> where the release's source shows the
    lack (``versions.VLLM_RELEASE_GAPS``), or, below the minimum, that the release is older than
    the model card asks for. In ``requirement.features`` order."""
    if _version_tuple(version) < _version_tuple(requirement.min_version):
        return {f: f"vLLM {version} is older than the model card's minimum {requirement.min_version}"
                for f in requirement.features}
    known = VLLM_RELEASE_GAPS.get(version, {}).get(image_family, {})
    return {f: known[f] for f in requirement.features if f in known}


# How the blocker names a platform's image family.
_FAMILY_NAMES: Mapping[str, str] = MappingProxyType({"cuda": "NVIDIA (CUDA)", "rocm": "AMD (ROCm)"})


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
        ConfigError: a mutable tag (a mistake in the config, not a missing engine), or the other
            vendor's repository.
    """
    build = parse_engine_image(image)
    requirement = model.engine_requirements.get(image_family)
    wrong = {family: repo for family, repo in VLLM_IMAGES.items() if family != image_family and repo == hub_repository(image)}
    if wrong:
        raise ConfigError(
            image_key, image,
            f"is the {next(iter(wrong))} build of vLLM; this target needs the {image_family} one ({VLLM_IMAGES[image_family]})",
        )
    tag = image.split("@", 1)[0].rpartition(":")[2]
    if build.kind == "mutable" and (_RELEASE_TAG_RE.match(tag.lower()) or _NIGHTLY_TAG_RE.match(tag.lower())):
        # Tags are case-sensitive: `V0.34.0` or a nightly in upper-case hex is no tag vLLM publishes.
        raise ConfigError(
            image_key, image,
            f"has the tag {tag!r}, which vLLM does not publish (tags are case-sensitive): write {tag.lower()!r}",
        )
    if build.kind == "mutable":
        raise ConfigError(
            image_key, image,
            "is a mutable tag; pin the engine immutably: a release tag vX.Y.Z, a nightly by commit "
            f"({VLLM_IMAGES[image_family]}:nightly-<40-hex commit>) or name@sha256:<digest>",
        )
    if requirement is None or build.kind != "release":
        return build, None
    causes = release_gap_causes(build.version or "", image_family, requirement)
    if not causes:
        return build, None
    default = "" if image_key != "vllm.image" or build.version != VLLM_VERSION else " (the toolkit's default pin)"
    repository = VLLM_IMAGES[image_family]
    platform = _FAMILY_NAMES.get(image_family, image_family)
    pinned = (f"a {image_family.upper() if image_family == 'cuda' else 'ROCm'} build that has it, pinned by commit "
              f"({repository}:nightly-<40-hex commit>) or digest ({repository}@sha256:<64 hex>), that "
              "`kimi-deploy engine verify --image IMAGE` passes")
    if _version_tuple(build.version or "") < _version_tuple(requirement.min_version):
        cause = f"it is older than the model's minimum ({requirement.source})"
        way_out = (f"Set kimi-deploy:vllm.imageTag to v{requirement.min_version} or later where that release serves "
                   f"{platform}, or kimi-deploy:vllm.image to {pinned}")
    else:
        cause = "it lacks " + "; ".join(f"{feature}: {why}" for feature, why in causes.items())
        way_out = f"Set kimi-deploy:vllm.image to {pinned}"
    return build, ConfigError(
        image_key, image, f"cannot serve {model.display_name} on {platform}{default}: {cause}. {way_out}",
    )


@dataclass(frozen=True)
class SourceMarker:
    """A piece of source text a vLLM build holds when it has (or lacks) an engine feature.

    Attributes:
        path: relative to site-packages: a file (``vllm/models/kimi_k3/nvidia/dsa.py``), or a
            directory ending in ``/`` (the text is looked for in every ``*.py`` below it).
        text: the exact text looked for.
        means: what finding it shows, for the report (``the DSA attention class``).
    """

    path: str
    text: str
    means: str

    def as_request(self) -> dict[str, str]:
        """The JSON form ``scripts/node/engine_check.py`` reads: ``{"path", "text", "means"}``."""
        return {"path": self.path, "text": self.text, "means": self.means}


@dataclass(frozen=True)
class FeatureProbe:
    """How a vLLM package tree proves it has an engine feature, and what in it says it does not.

    A build has the feature when every ``requires`` marker is found and no ``lacks`` marker is.
    A marker of absence belongs only where it is a statement about the feature itself: a dense
    class that stays for other layers (0.34.0's ``nvidia/mla.py`` keeps ``use_sparse=False,
    indexer=None`` for the layers that are not DSA) says nothing about it.

    Attributes:
        requires: every one must be found: the build contains the feature.
        lacks: any one found means the build does not have it, whatever else it holds.
    """

    requires: tuple[SourceMarker, ...]
    lacks: tuple[SourceMarker, ...] = ()

    def as_request(self) -> dict[str, list[dict[str, str]]]:
        """The JSON form ``scripts/node/engine_check.py`` reads: ``{"requires": [...], "lacks": [...]}``."""
        return {"requires": [m.as_request() for m in self.requires], "lacks": [m.as_request() for m in self.lacks]}


_NVIDIA_DSA = "vllm/models/kimi_k3/nvidia/dsa.py"
_NVIDIA_MODEL = "vllm/models/kimi_k3/nvidia/model.py"
_AMD_TREE = "vllm/models/kimi_k3/amd/"

# feature -> image family -> probe, read from the vLLM 0.33.0 and 0.34.0 wheels.
# CUDA: 0.34.0 adds nvidia/dsa.py, whose KimiK3DSAAttention hands the DSA indexer to the MLA
# wrapper built sparse (``indexer=self.dsa_indexer``, ``is_sparse=True``, from ``config.dsa_config``);
# nvidia/model.py builds it for every ``config.is_dsa_layer(layer_idx)`` layer (and asserts the
# count matches dsa_config). 0.33.0 has no dsa.py and builds every MLA layer dense. A DSA class
# wired dense would say so in its own file: ``is_sparse=False`` or ``indexer=None`` there.
# ROCm: 0.34.0's model under amd/ never chooses DSA layers (no ``is_dsa_layer``, no ``dsa_config``)
# and builds every MLA layer with ``indexer=None, is_sparse=False`` (amd/linear.py). A ROCm build
# that wires DSA must choose the layers and build a sparse MLA somewhere under amd/; no text in
# 0.34.0 states the absence for certain (linear.py's dense MLA may stay beside a DSA class, and
# nvidia/dsa.py's ROCm refusal would stay beside an amd/ one), so the probe has no lacks.
# scripts/node/engine_check.py applies them inside a candidate image; tests/vllm_contract.py to the wheels.
FEATURE_PROBES: Mapping[str, Mapping[str, FeatureProbe]] = MappingProxyType(
    {
        SPARSE_INDEXER_MLA: MappingProxyType(
            {
                "cuda": FeatureProbe(
                    requires=(
                        SourceMarker(_NVIDIA_DSA, "class KimiK3DSAAttention(", "the Kimi-K3.1 DSA attention class"),
                        SourceMarker(_NVIDIA_DSA, "indexer=self.dsa_indexer", "the DSA indexer handed to its MLA"),
                        SourceMarker(_NVIDIA_DSA, "is_sparse=True", "its MLA built sparse"),
                        SourceMarker(_NVIDIA_DSA, "config.dsa_config", "the checkpoint's dsa_config read"),
                        SourceMarker(_NVIDIA_MODEL, "config.is_dsa_layer(layer_idx)", "the model choosing the DSA layers"),
                        SourceMarker(_NVIDIA_MODEL, "KimiK3DSAAttention(", "the DSA class built for them"),
                    ),
                    lacks=(
                        SourceMarker(_NVIDIA_DSA, "is_sparse=False", "the DSA class building its MLA dense"),
                        SourceMarker(_NVIDIA_DSA, "indexer=None", "the DSA class passing no indexer"),
                    ),
                ),
                "rocm": FeatureProbe(
                    requires=(
                        SourceMarker(_AMD_TREE, "is_dsa_layer(", "the ROCm model choosing the DSA layers"),
                        SourceMarker(_AMD_TREE, "is_sparse=True", "a sparse MLA built on ROCm"),
                    ),
                ),
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


def attention_facts(model: ModelProfile, compute_capability: tuple[int, int] | None, *,
                    gpu_memory_bytes: int | None = None, gpu_name: str | None = None) -> dict[str, Any] | None:
    """What ``scripts/ops/vllm_argv_check.py`` needs to validate the attention backends a command
    names against ``model``'s MLA layers on a GPU of ``compute_capability`` (``GpuFacts``):
    ``{"use_mla", "use_sparse", "head_size", "num_heads", "dtype", "device_capability",
    "hf_text_config"}`` plus ``device_memory_bytes`` / ``device_name`` when given (the scheduler
    defaults vLLM picks by GPU memory), or None when there is nothing to check (no MLA facts, or not CUDA)."""
    attention = model.attention
    if attention is None or compute_capability is None:
        return None
    text_config: dict[str, Any] = {
        "kv_lora_rank": attention.kv_lora_rank, "qk_nope_head_dim": attention.qk_nope_head_dim,
        "qk_rope_head_dim": attention.qk_rope_head_dim, "v_head_dim": attention.v_head_dim,
    }
    if attention.index_topk is not None:
        text_config["index_topk"] = attention.index_topk
    return {
        "use_mla": True, "use_sparse": attention.sparse, "head_size": attention.head_size,
        "num_heads": attention.num_heads, "dtype": attention.dtype,
        "device_capability": list(compute_capability), "hf_text_config": text_config,
        **({"device_memory_bytes": gpu_memory_bytes} if gpu_memory_bytes is not None else {}),
        **({"device_name": gpu_name} if gpu_name is not None else {}),
    }


def verification_request(spec: DeploymentSpec, command: VllmCommand, image: str) -> dict[str, Any]:
    """The request ``scripts/node/engine_check.py`` runs inside ``image`` for ``spec``: the model's
    minimum vLLM version and required features on the target's image family (with their
    ``FEATURE_PROBES``), the tool and reasoning parsers and every role's argv (with the model's
    attention layers on the target's GPU, ``attention_facts``), and every environment variable
    name the deployment sets for vLLM (the roles' plain and secret env, and
    the engine-cache env where caches are restored). A nightly tag's commit must be the build's.

    Raises:
        ValueError: the model has no engine requirement for the target's image family, or a
            required feature has no probe for it (a data error in this module or model.py).
    """
    family = spec.target.image_family
    requirement = spec.model.engine_requirements.get(family)
    if requirement is None:
        raise ValueError(f"model {spec.model.name}: no engine requirement for image family {family}")
    features: dict[str, Any] = {}
    for feature in requirement.features:
        probe = FEATURE_PROBES.get(feature, {}).get(family)
        if probe is None:
            raise ValueError(f"feature {feature}: no probe for image family {family} (engine.FEATURE_PROBES)")
        features[feature] = probe.as_request()
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
        "attention": [attention_facts(spec.model, spec.target.gpu.compute_capability) for _ in command.roles],
    }


def _flag_value(argv: tuple[str, ...], flag: str) -> str | None:
    """The value after ``flag`` (or of ``flag=value``) in ``argv``, else None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
