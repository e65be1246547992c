"""Engine support is data and is enforced (components/core/engine.py, model.engine_requirements).

The shipped stacks are checked WITHOUT the test overlay of conftest.py: the pinned release serves
K3.1 Pro on NVIDIA, so the CUDA stacks plan deployable; it lacks the sparse indexer on ROCm, so
mi355x must stop with one line naming the key, the cause and the way out.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.core.engine import check_engine, parse_engine_image
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.core.model import KIMI_K3_1_PRO, SPARSE_INDEXER_MLA
from components.core.versions import VLLM_VERSION
from tests.conftest import DEPLOYER_ONLY_OVERLAY, FIXED_NOW, REPO_ROOT, STACKS

COMMIT = "b22afe45ac797ae58e67a7a3ad79ee5714024420"
DIGEST = "5ee06541ff9fbd220c0a8f51608e72ea0da8d1a71ebf812af7d7c6b5a1aebbb7"


@pytest.mark.parametrize(
    ("image", "kind", "version", "pin"),
    [
        ("vllm/vllm-openai:v0.33.0", "release", "0.33.0", None),
        ("vllm/vllm-openai:v0.34.0-cu130", "release", "0.34.0", None),
        (f"vllm/vllm-openai:nightly-{COMMIT}", "nightly", None, COMMIT),
        (f"vllm/vllm-openai-rocm@sha256:{DIGEST}", "digest", None, DIGEST),
        (f"registry.example.com:5000/vllm:v0.33.0@sha256:{DIGEST}", "digest", None, DIGEST),
        ("vllm/vllm-openai:nightly", "mutable", None, None),
        ("vllm/vllm-openai:kimi-k3", "mutable", None, None),
        ("vllm/vllm-openai", "mutable", None, None),
    ],
)
def test_image_references_are_classified(image, kind, version, pin):
    build = parse_engine_image(image)
    assert (build.kind, build.version, build.pin) == (kind, version, pin)
    assert build.is_release is (kind == "release")


def test_every_vendor_requires_the_sparse_indexer_at_0_34():
    for family in ("cuda", "rocm"):
        req = KIMI_K3_1_PRO.engine_requirements[family]
        assert req.min_version == "0.34.0" and SPARSE_INDEXER_MLA in req.features
        assert "model card" in req.source and "indexer" in req.source


@pytest.mark.parametrize("family", ["cuda", "rocm"])
def test_a_release_below_the_minimum_is_refused_naming_key_minimum_and_source(family):
    from components.core.versions import vllm_image

    with pytest.raises(ConfigError) as err:
        check_engine(vllm_image(family, "v0.33.0"), "vllm.imageTag", family, KIMI_K3_1_PRO)
    msg = str(err.value)
    assert msg.startswith("kimi-deploy:vllm.imageTag: ") and "\n" not in msg
    assert "older than the model's minimum" in msg and ">= 0.34.0" in msg and "model card" in msg
    assert "nightly-<40-hex commit>" in msg and "sha256" in msg and "kimi-deploy engine verify" in msg


def test_the_pinned_release_serves_cuda_and_is_refused_on_rocm_with_the_cause_and_the_way_out():
    from components.core.versions import VLLM_RELEASE_GAPS, vllm_image

    assert VLLM_VERSION in VLLM_RELEASE_GAPS and set(VLLM_RELEASE_GAPS[VLLM_VERSION]) == {"rocm"}
    assert check_engine(vllm_image("cuda"), "vllm.image", "cuda", KIMI_K3_1_PRO).version == VLLM_VERSION
    with pytest.raises(ConfigError) as err:
        check_engine(vllm_image("rocm"), "vllm.image", "rocm", KIMI_K3_1_PRO)
    msg = str(err.value)
    assert msg.startswith("kimi-deploy:vllm.image: 'vllm/vllm-openai-rocm:v") and "\n" not in msg
    assert "(the toolkit's default pin)" in msg and "AMD (ROCm)" in msg and SPARSE_INDEXER_MLA in msg
    # The cause, from the release's own source, and the way out: a pinned ROCm build engine verify passes.
    assert "vllm/models/kimi_k3/amd/linear.py: indexer=None, is_sparse=False" in msg
    assert "vllm/vllm-openai-rocm:nightly-<40-hex commit>" in msg and "vllm/vllm-openai-rocm@sha256:<64 hex>" in msg
    assert "`kimi-deploy engine verify --image IMAGE` passes" in msg
    assert "imageTag" not in msg  # no release to wait for is promised


def test_every_recorded_gap_names_the_source_file_that_shows_it():
    from components.core.versions import VLLM_RELEASE_GAPS

    for version, families in VLLM_RELEASE_GAPS.items():
        for family, gaps in families.items():
            for feature, cause in gaps.items():
                assert feature in KIMI_K3_1_PRO.engine_requirements[family].features, (version, family, feature)
                assert f"vLLM {version}" in cause and "vllm/models/kimi_k3/" in cause, (version, family, cause)


def test_a_mutable_tag_is_refused():
    with pytest.raises(ConfigError, match="mutable tag"):
        check_engine("vllm/vllm-openai:kimi-k3", "vllm.image", "cuda", KIMI_K3_1_PRO)


@pytest.mark.parametrize(
    "image", [f"vllm/vllm-openai:nightly-{COMMIT}", f"vllm/vllm-openai@sha256:{DIGEST}", "vllm/vllm-openai:v0.34.0"]
)
def test_immutable_builds_that_are_not_known_to_lack_support_pass(image):
    assert check_engine(image, "vllm.image", "cuda", KIMI_K3_1_PRO).kind in {"nightly", "digest", "release"}


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_plan_with_the_default_pin_where_it_serves_and_are_refused_where_it_does_not(stack, monkeypatch):
    # The shipped stacks with the stand-in EKS API source alone (tests/conftest.py): the EKS stacks'
    # example source is a blocker of its own (tests/test_config.py).
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", DEPLOYER_ONLY_OVERLAY)
    from components.core.config import read_stack_config
    from components.plan_engine import run_program

    spec = load_stack(stack, now=FIXED_NOW)
    assert spec.config.phase == "serve" and spec.config.vllm.image is None and spec.config.vllm.image_tag is None
    if spec.target.image_family == "cuda" and spec.config.environment == "prod":
        # The default pin serves, but a prod stack takes no tag (a tag can be pushed again): the digest line.
        [blocker] = spec.blockers
        assert blocker.key == "kimi-deploy:vllm.image" and "engine verify" in str(blocker), blocker
        return
    if spec.target.image_family == "cuda":
        assert spec.blockers == ()
        run = run_program(read_stack_config(stack), stack=stack, now=FIXED_NOW)
        assert run.resources and run.context.vllm.image.endswith(f":v{VLLM_VERSION}")
        return
    [blocker] = spec.blockers
    assert isinstance(blocker, ConfigError)
    assert blocker.key == "kimi-deploy:vllm.image" and "ROCm" in str(blocker) and "engine verify" in str(blocker)
    # The program as `pulumi up` runs it raises the blocker before any resource is declared.
    with pytest.raises(ConfigError) as err:
        run_program(read_stack_config(stack), stack=stack, now=FIXED_NOW)
    assert err.value.key == "kimi-deploy:vllm.image"
    # The offline plan renders everything else, the blocker at its top.
    run = run_program(read_stack_config(stack), stack=stack, now=FIXED_NOW, allow_blockers=True)
    assert run.resources and [str(b) for b in run.context.spec.blockers] == [str(blocker)]


def test_plan_cli_shows_the_blocker_and_strict_exits_2_with_one_line(monkeypatch):
    from tests.conftest import TEST_REVISION, without_overlay_notice

    # The shipped pin; the shipped example commit replaced (it is a blocker of its own).
    env = {**__import__("os").environ, "KIMI_DEPLOY_CONFIG_OVERLAY": __import__("json").dumps(
        {"stacks": {"mi355x": {"kimi-deploy:model": {"revision": TEST_REVISION}}}})}
    base = [sys.executable, "scripts/ops/plan.py", "--stack", "mi355x", "--now", FIXED_NOW.isoformat()]
    shown = without_overlay_notice(
        subprocess.run(base + ["--format", "json"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120))
    assert shown.returncode == 0, shown.stderr
    doc = __import__("json").loads(shown.stdout)
    assert doc["deployable"] is False and doc["resources"]
    assert [b.split(":", 2)[:2] for b in doc["blockers"]] == [["kimi-deploy", "vllm.image"]]
    assert shown.stderr.startswith("blocked: `pulumi up` refuses this stack: kimi-deploy:vllm.image")
    strict = without_overlay_notice(
        subprocess.run(base + ["--strict"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120))
    assert strict.returncode == 2 and strict.stderr.count("\n") == 1, strict.stderr
    assert "kimi-deploy:vllm.image" in strict.stderr and "Traceback" not in strict.stderr
    # b300 with the default pin: deployable, nothing on stderr about a blocker.
    b300 = without_overlay_notice(subprocess.run(base[:3] + ["b300", *base[4:], "--strict", "--format", "json"],
                                                 cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120))
    assert b300.returncode == 0 and "blocked" not in b300.stderr, b300.stderr
    assert __import__("json").loads(b300.stdout)["deployable"] is True


@pytest.mark.parametrize("stack", STACKS)
def test_a_nightly_engine_plans_and_the_plan_says_it_is_not_a_release(stack, monkeypatch):
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", '{"kimi-deploy:vllm": {"imageTag": "nightly-' + COMMIT + '"}}')
    spec = load_stack(stack, now=FIXED_NOW)
    assert any("not a release" in w and COMMIT in w for w in spec.warnings), spec.warnings


def test_a_too_old_image_tag_is_refused_by_the_config_key_that_set_it(monkeypatch):
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", '{"kimi-deploy:vllm": {"imageTag": "v0.33.1"}}')
    [blocker] = load_stack("b300", now=FIXED_NOW).blockers
    assert blocker.key == "kimi-deploy:vllm.imageTag"


@pytest.mark.parametrize("image, family", [
    (f"vllm/vllm-openai:nightly-{COMMIT}", "rocm"),
    (f"vllm/vllm-openai-rocm@sha256:{DIGEST}", "cuda"),
])
def test_an_image_of_the_other_gpu_vendor_is_refused(image, family):
    """mi355x (ROCm) once accepted the CUDA image: the vendor's repository is checked."""
    with pytest.raises(ConfigError, match=f"this target needs the {family} one"):
        check_engine(image, "vllm.image", family, KIMI_K3_1_PRO)


def test_the_blocker_names_the_targets_own_image_repository():
    from components.core.engine import engine_blocker

    _, blocker = engine_blocker("vllm/vllm-openai-rocm:v0.33.0", "vllm.image", "rocm", KIMI_K3_1_PRO)
    assert "vllm/vllm-openai-rocm:nightly-<40-hex commit>" in str(blocker)
    assert str(blocker).count("0.34.0") <= 3  # the minimum in the source, in the fix, and the release that lacks it


def test_long_values_are_cut_in_config_errors():
    err = ConfigError("vllm.extraArgs", ["--x"] * 5000, "is too long")
    assert len(str(err)) < 300 and "characters)" in str(err)


def test_a_rocm_nightly_is_told_that_only_engine_verify_shows_it_has_what_the_release_lacks():
    """A fresh trial: an mi355x nightly lost its blocker with only the generic "not a release" warning,
    although 0.34.0 lacks sparse MLA on ROCm and only the build itself can show it has it."""
    from tests.test_config_inputs import accept, base

    image = "vllm/vllm-openai-rocm:nightly-" + "0123456789abcdef" * 2 + "01234567"
    cfg = base("mi355x")
    cfg["vllm"] = {**{k: v for k, v in cfg.get("vllm", {}).items() if k != "imageTag"}, "image": image}
    found = [w for w in accept(cfg).warnings if "lacks sparse-indexer-mla on rocm" in w]
    assert found and f"kimi-deploy engine verify --image {image}" in found[0], found
    cuda = base("b300")
    cuda["vllm"] = {**{k: v for k, v in cuda.get("vllm", {}).items() if k != "imageTag"},
                    "image": "vllm/vllm-openai:nightly-" + "0" * 40}
    assert not [w for w in accept(cuda).warnings if "lacks" in w]
