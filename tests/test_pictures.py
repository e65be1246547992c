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


def _dot_source(draw, manifest, tmp_path, monkeypatch) -> str:
    """The graphviz source ``draw`` builds for ``manifest`` (rendered nowhere: the test reads the graph)."""
    import diagrams

    sources: list[str] = []

    def keep(self) -> None:
        sources.append(self.dot.source)
        open(self.filename, "w").close()  # Diagram.__exit__ removes it

    monkeypatch.setattr(diagrams.Diagram, "render", keep)
    monkeypatch.setattr(pictures.shutil, "move", lambda *_: None)
    draw(manifest, tmp_path / "out.png")
    (source,) = sources
    return source


def _nodes_and_edges(source: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """``node id -> "label|icon path"`` and ``(from, to, attributes)`` of a graphviz source (ids quoted or not)."""
    import re

    nodes = {m[1]: f"{m[2].strip(chr(34))}|{m[3]}" for m in re.finditer(
        r'^\s*"?(\w+)"? \[label=("(?:[^"\\]|\\.)*"|\S+) [^\]]*?image="([^"]*)"', source, re.M)}
    edges = [(m[1], m[2], m[3]) for m in re.finditer(r'^\s*"?(\w+)"? -> "?(\w+)"? \[([^\]]*)\]', source, re.M)]
    return nodes, edges


def test_the_eks_picture_draws_what_each_thing_is_and_arrows_end_on_nodes(manifests, tmp_path, monkeypatch):
    """The EKS picture drew its arrows with ortho splines, which ended them beside their nodes in empty
    space; drew the ComputeDomain (a custom resource) with a pod's icon; and sent the mirror's copy to
    the last node group by name (the system nodes), not the GPU nodes."""
    source = _dot_source(pictures.draw_eks_layout, manifests["eks-layout"], tmp_path, monkeypatch)
    assert "ortho" not in source and "splines=spline" in source
    nodes, edges = _nodes_and_edges(source)
    domains = [n for n, text in nodes.items() if "ComputeDomain" in text]
    assert domains and all("/k8s/others/crd" in nodes[n] and "/compute/pod" not in nodes[n] for n in domains), nodes
    pods = {n for n, text in nodes.items() if "leader (rank 0)" in text or text.startswith("worker|")}
    assert {dst for src, dst, _ in edges if src in domains} == pods
    for _src, dst, attrs in edges:
        if "copy to NVMe" in attrs:
            assert "gpu" in nodes[dst].split("|")[0] and "m7i" not in nodes[dst], nodes[dst]


def test_every_unit_of_the_boot_chain_is_connected(manifests):
    """kimi-watch.timer was drawn alone: a timer without Unit= starts the service of its name."""
    chain = manifests["ec2-boot-chain"]
    assert ["kimi-watch.timer", "kimi-watch.service", "triggers"] in chain["edges"]
    on_edges = {u for edge in chain["edges"] for u in edge[:2]}
    assert set(chain["units"]) == on_edges, set(chain["units"]) - on_edges
    assert all(chain["units"].values()), chain["units"]  # the timer says its schedule
