"""The checks of a config that need the domain, run by ``load.parse_spec`` after the checks of the
typed config (``config.*``) in the order it lists.

The layer between the domain and the entry: a rule that asks a domain module (the engine build's
support of the model, ``engine.engine_blocker``) lives here, so the typed config below never
imports the domain and the domain imports the config without a circle (tests/test_layout.py).
Each function takes the validated raw config and the objects ``parse_spec`` resolved once.
"""

from __future__ import annotations

from .config.raw import RawConfig
from .engine import check_release_repository, engine_blocker, release_gap_causes
from .model import ModelProfile
from .targets import TargetProfile
from .versions import VLLM_VERSION, vllm_image


def engine_blocker_of(raw: RawConfig, target: TargetProfile, model: ModelProfile, warnings: list[str]) -> Exception | None:
    """The engine build's blocker (``engine.engine_blocker``; None when it serves the model) and a
    warning for a build that is not a release.

    Raises:
        ConfigError: a mutable tag, the other vendor's image, or a release tag outside vLLM's
            release repository (``engine.check_release_repository``).
    """
    # Engine support: a build known not to serve the model stops `pulumi up` (exit 2, before any
    # resource); the offline plan shows it as a blocker at the top of an otherwise complete plan.
    engine_key = "vllm.imageTag" if raw.vllm.image_tag else "vllm.image"
    image = raw.vllm.image or vllm_image(target.image_family, raw.vllm.image_tag)
    engine, blocker = engine_blocker(image, engine_key, target.image_family, model)
    check_release_repository(image, engine_key, target.image_family)
    if not engine.is_release:
        warnings.append(f"engine: {engine.describe()}; the model card asks for vLLM >= {model.min_vllm_version}")
        requirement = model.engine_requirements.get(target.image_family)
        gaps = release_gap_causes(VLLM_VERSION, target.image_family, requirement) if requirement else {}
        if gaps:
            # The pinned release lacks a feature on this family: whether this build has it is known
            # only from the build itself (engine verify reads its source markers).
            warnings.append(f"engine: vLLM {VLLM_VERSION} lacks {', '.join(gaps)} on {target.image_family}; whether "
                            f"{image} has it only `kimi-deploy engine verify --image {image}` shows: run it before "
                            "`pulumi up`")
    return blocker
