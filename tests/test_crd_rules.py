"""The CRDs' transition rules (``x-kubernetes-validations`` reading ``oldSelf``): the table in
components/core/crd_rules.py is what the pinned CRD files say, the ComputeDomain's immutable spec
is a replacement in its resource options and in the plan diff, and rules are evaluated with CEL
(cel-python) on real old/new pairs."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

import pytest

from components.core import crd_rules
from scripts.dev.crds import CRDS
from scripts.ops import plan_diff
from scripts.ops.diff import rules as diff_rules
from tests.conftest import plan_for
from tests.test_k8s_schemas import _load_crd, crds_dir

COMPUTE_DOMAIN = "kubernetes:resource.nvidia.com/v1beta1:ComputeDomain"
FIXED_NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _all_rules_in_the_pinned_crds() -> tuple[crd_rules.TransitionRule, ...]:
    out: list[crd_rules.TransitionRule] = []
    for crd in CRDS:
        out += crd_rules.transition_rules_of(_load_crd(crds_dir() / crd.file), f"{crd.project} {crd.tag} {crd.path}")
    return tuple(out)


def test_the_table_is_every_oldself_rule_of_the_pinned_crds():
    found = _all_rules_in_the_pinned_crds()
    assert found == crd_rules.TRANSITION_RULES
    # Seven CRDs read (LWS, ComputeDomain, KEDA x2, prometheus-operator x3); one transition rule in all.
    assert len(CRDS) == 7 and [(r.kind, r.path, r.rule) for r in found] == [("ComputeDomain", "spec", "self == oldSelf")]


def test_a_rule_without_oldself_is_not_a_transition_rule():
    """KEDA's ScaledObject rule (minReplicaCount <= maxReplicaCount) is checked on create too: no replacement."""
    scaled = next(c for c in CRDS if c.kind == "ScaledObject")
    text = json.dumps(_load_crd(crds_dir() / scaled.file))
    assert "x-kubernetes-validations" in text and crd_rules.transition_rules_of(_load_crd(crds_dir() / scaled.file)) == ()


def _rendered_compute_domain() -> dict:
    from tests.test_k8s_workloads import one

    return one(plan_for("gb300"), "ComputeDomain")


def test_the_crd_rule_evaluated_by_cel_on_a_rendered_old_new_pair():
    """The rule as read from the CRD file, evaluated by cel-python on the rendered ComputeDomain and a
    changed copy: refused when the spec changes, accepted when only metadata changes."""
    [rule] = [r for r in _all_rules_in_the_pinned_crds() if r.kind == "ComputeDomain"]
    old = _rendered_compute_domain()
    new = copy.deepcopy(old)
    new["spec"]["channel"]["resourceClaimTemplate"]["name"] = "another-channel"
    assert crd_rules.update_refused(rule, old, new) is True
    relabelled = copy.deepcopy(old)
    relabelled["metadata"].setdefault("labels", {})["team"] = "b"
    assert crd_rules.update_refused(rule, old, relabelled) is False
    # Equal maps in another key order are equal in CEL too.
    reordered = copy.deepcopy(old)
    reordered["spec"] = dict(reversed(list(old["spec"].items())))
    assert crd_rules.update_refused(rule, old, reordered) is False


def test_the_compute_domain_replaces_on_a_spec_change_in_its_resource_options():
    [res] = [r for r in plan_for("gb300").resources if r.type == COMPUTE_DOMAIN]
    assert res.replace_on_changes == ("spec",)
    assert crd_rules.replace_on_changes("resource.nvidia.com/v1beta1", "ComputeDomain") == ["spec"]
    assert not [r for r in plan_for("gb300").resources if r.replace_on_changes and r.type != COMPUTE_DOMAIN]


@pytest.fixture(scope="module")
def gb300_document() -> dict:
    from scripts.ops.plan import build_plan_document

    return build_plan_document("gb300", now=FIXED_NOW)


def _with_compute_domain(document: dict, change) -> dict:
    new = copy.deepcopy(document)
    [res] = [r for r in new["resources"] if r["type"] == COMPUTE_DOMAIN]
    change(res)
    return new


def test_a_changed_compute_domain_spec_is_a_replacement_in_the_diff(gb300_document, monkeypatch):
    [res] = [r for r in gb300_document["resources"] if r["type"] == COMPUTE_DOMAIN]
    assert res["replace_on_changes"] == ["spec"]

    def more_nodes(r):
        r["inputs"]["spec"]["numNodes"] = 2

    diff = plan_diff.diff_documents(gb300_document, _with_compute_domain(gb300_document, more_nodes))
    [change] = diff["changed"]
    assert change["type"] == COMPUTE_DOMAIN and change["action"] == "replace" and diff["summary"]["replaced"] == 1
    assert "computeDomain.spec is immutable" in change["fields"][0]["note"]
    # The resource's own replace_on_changes, recorded in the plan, replaces even without the table's row.
    monkeypatch.setitem(diff_rules.REPLACE_ON_CHANGE, COMPUTE_DOMAIN, ())
    diff = plan_diff.diff_documents(gb300_document, _with_compute_domain(gb300_document, more_nodes))
    assert diff["changed"][0]["action"] == "replace"

    def relabel(r):
        r["inputs"]["metadata"].setdefault("labels", {})["team"] = "b"

    diff = plan_diff.diff_documents(gb300_document, _with_compute_domain(gb300_document, relabel))
    assert diff["changed"][0]["action"] == "update"


# A CRD with rules that are more than `self == oldSelf` (none of the pinned CRDs has one today).
_GROWING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "spec": {
        "group": "example.com",
        "names": {"kind": "Volume"},
        "versions": [{
            "name": "v1", "served": True,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object",
                "properties": {
                    "sizeGiB": {"type": "integer",
                                "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "sizeGiB may only grow"}]},
                    "zone": {"type": "string"},
                },
                "x-kubernetes-validations": [
                    {"rule": "!has(oldSelf.zone) || (has(self.zone) && self.zone == oldSelf.zone)",
                     "message": "zone is set once"},
                    {"rule": "has(self.sizeGiB)", "message": "sizeGiB is required"},
                ],
            }}}},
        }],
    },
}
VOLUME = "kubernetes:example.com/v1:Volume"


def _volume_doc(spec: dict) -> dict:
    return {"stack": "s", "resources": [{"type": VOLUME, "name": "v", "inputs": {"metadata": {"name": "v"}, "spec": spec}}]}


def test_rules_beyond_equality_are_evaluated_with_cel_in_the_diff(monkeypatch):
    rules = crd_rules.transition_rules_of(_GROWING_CRD)
    assert [(r.path, r.immutable) for r in rules] == [("spec", False), ("spec.sizeGiB", False)]
    # replace_on_changes cannot be conditional: a rule that refuses only some changes is not listed.
    assert crd_rules.replace_on_changes("example.com/v1", "Volume", rules) == []
    monkeypatch.setattr(diff_rules, "REPLACE_ON_CHANGE", {**diff_rules.REPLACE_ON_CHANGE, **diff_rules.crd_rows(rules)})
    monkeypatch.setattr("scripts.ops.diff.engine.REPLACE_ON_CHANGE", diff_rules.REPLACE_ON_CHANGE)

    def action(old: dict, new: dict) -> str:
        return plan_diff.diff_documents(_volume_doc(old), _volume_doc(new))["changed"][0]["action"]

    assert action({"sizeGiB": 100}, {"sizeGiB": 200}) == "update"
    assert action({"sizeGiB": 200}, {"sizeGiB": 100}) == "replace"
    assert action({"sizeGiB": 100}, {"sizeGiB": 100, "zone": "a"}) == "update"
    assert action({"sizeGiB": 100, "zone": "a"}, {"sizeGiB": 100, "zone": "b"}) == "replace"


def test_a_rule_that_is_not_a_bool_is_an_error():
    with pytest.raises(ValueError, match="not a bool"):
        crd_rules.evaluate("self + 1", 1, 1)
    with pytest.raises(ValueError, match="does not compile"):
        crd_rules.evaluate("self ==", 1, 1)
