"""The pictures in README.md and docs/ (scripts/dev/pictures.py) show what the stacks build today:
each PNG carries the digest of the manifest it was drawn from (the units, resources or phases it
shows), and the manifest recomputed from the stacks must equal it."""

from __future__ import annotations

import json
import shutil

import pytest

from scripts.dev import pictures
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def manifests():
    return {name: json.loads(json.dumps(make())) for name, (make, _) in pictures.PICTURES.items()}


def test_every_picture_matches_the_stacks(manifests):
    for name, manifest in manifests.items():
        doc = pictures.PICTURES_DIR / f"{name}.json"
        png = pictures.PICTURES_DIR / f"{name}.png"
        assert png.exists() and doc.exists(), f"{name}: run python scripts/dev/pictures.py --write"
        assert json.loads(doc.read_text()) == manifest, f"{name} is stale: run python scripts/dev/pictures.py --write"
        assert pictures.png_digest(png) == pictures.manifest_digest(manifest), f"{name}.png was not drawn from {doc.name}"


def test_a_changed_stack_makes_its_picture_stale(tmp_path, manifests):
    for name in pictures.PICTURES:
        for suffix in (".png", ".json"):
            shutil.copy(pictures.PICTURES_DIR / f"{name}{suffix}", tmp_path / f"{name}{suffix}")
    assert pictures.stale_pictures(tmp_path) == []
    # A unit the boot chain no longer has (as if userdata.py dropped it), and a phase's modelled time.
    chain = json.loads((tmp_path / "ec2-boot-chain.json").read_text())
    chain["units"]["kimi-old.service"] = "gone"
    (tmp_path / "ec2-boot-chain.json").write_text(json.dumps(chain))
    timeline = manifests["stage-then-serve"]
    assert timeline["single_up"] and all(p["seconds"] >= 0 for p in timeline["single_up"])
    (tmp_path / "stage-then-serve.png").write_bytes((tmp_path / "eks-layout.png").read_bytes())
    assert pictures.stale_pictures(tmp_path) == ["ec2-boot-chain", "stage-then-serve"]


def test_the_pictures_show_the_real_structure(manifests):
    chain = manifests["ec2-boot-chain"]
    # The weights unit starts vLLM (never a dependency that a failed one-shot would fail for good).
    assert ["kimi-weights.service", "kimi-vllm.service", "starts"] in chain["edges"]
    eks = manifests["eks-layout"]["stacks"]
    gb300 = eks["gb300"]["shown"]
    assert [w["kind"] for w in gb300["workloads"]] == ["LeaderWorkerSet"] and gb300["workloads"][0]["group_size"] == 2
    assert gb300.get("compute_domains")
    for stack, doc in eks.items():
        assert any("gpu" in g["name"] for g in doc["shown"]["node_groups"]), stack


def test_the_readme_shows_the_three_pictures():
    readme = (REPO_ROOT / "README.md").read_text()
    for name in pictures.PICTURES:
        assert f"docs/pictures/{name}.png" in readme, name
