"""The pod security posture asserted without checkov: the checks checkov runs on the rendered
manifests, evaluated in plain Python (``tests/pod_posture.py``), fail exactly where the written
allow-list (``pod_security.CHECKOV_ALLOWED``) says a workload may fail them, on every Kubernetes
stack; a pod stripped of the posture fails them. Where checkov is installed, the evaluation and
checkov's own findings are held equal (tests/test_pod_security.py runs checkov itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.core import pod_security as ps
from tests.conftest import plan_for
from tests.pod_posture import CHECKS, POD_CHECKS, evaluate
from tests.test_k8s_workloads import K8S_STACKS, of_kind
from tests.test_pod_security import CHECKOV_ENV, CHECKOV_VENV, findings, scanned_documents, workload_of


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_the_posture_fails_only_what_the_allow_list_names(stack):
    run = plan_for(stack)
    assert evaluate(scanned_documents(run), workload_of) == ps.allowed_findings(run.context.spec)


def test_every_allow_list_check_is_evaluated():
    assert {a.check_id for a in ps.CHECKOV_ALLOWED} <= set(CHECKS)


def test_a_pod_without_the_posture_fails_the_checks():
    """mi355x's Deployment without its seccomp profile, capabilities and memory limit, and with a
    privileged, host-networked container: each removal is found."""
    (deployment,) = of_kind(plan_for("mi355x"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    pod.pop("securityContext")
    pod["hostNetwork"] = True
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    vllm["securityContext"] = {"privileged": True}
    vllm["resources"]["limits"].pop("memory")
    init = pod["initContainers"][0]
    init["securityContext"] = {**init["securityContext"], "allowPrivilegeEscalation": True}
    found = {check for check, _ in evaluate([deployment], workload_of)}
    assert {"CKV_K8S_13", "CKV_K8S_16", "CKV_K8S_19", "CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_31", "CKV_K8S_37"} <= found


def test_the_evaluation_agrees_with_checkov_where_it_runs(tmp_path):
    import os

    path = os.environ.get(CHECKOV_ENV) or str(CHECKOV_VENV / "bin" / "checkov")
    if not Path(path).is_file():
        pytest.skip("checkov is not installed: the evaluation above stands alone (make checkov to compare)")
    real = findings(str(tmp_path))
    ids = set(CHECKS) | set(POD_CHECKS)
    for stack in K8S_STACKS:
        theirs = {f for f in real[stack] if f[0] in ids}
        assert evaluate(scanned_documents(plan_for(stack)), workload_of) == theirs, stack
