"""One pod security posture on every platform (issue 28 item 6), checked by the real checkov.

``checkov --framework kubernetes`` (PyPI; its own venv, ``make checkov``: it pins boto3 and
packaging versions the project's venv cannot take) runs over every stack's rendered manifests, the
LeaderWorkerSet's leader and worker templates included (checkov does not know the kind, so each is
scanned as a Deployment of that template). Every finding must be an entry of the written allow-list
(``components/core/pod_security.py`` ``CHECKOV_ALLOWED``, shown in docs/kubernetes.md) that applies
to the stack, and every entry that applies must still be found (no stale exception).

Without checkov: skipped on a laptop (``make checkov``), FAILED under ``CI=true``. checkov runs with
``--skip-download`` and ``BC_SKIP_MAPPING=TRUE`` (no call to its vendor's API) and, where this
process may, in a network namespace of its own.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.core import pod_security as ps
from components.core.config import read_stack_config
from tests.conftest import REPO_ROOT, plan_for
from tests.test_k8s_workloads import K8S_STACKS, k8s_objects, manifest, of_kind, vllm_container, vllm_pods

CHECKOV_ENV = "KIMI_CHECKOV"
CHECKOV_VENV = REPO_ROOT / ".venv-checkov"
CHECKOV_TIMEOUT_SECONDS = 600
DOC = REPO_ROOT / "docs" / "kubernetes.md"
DOC_BEGIN, DOC_END = "<!-- pod-security allow-list (components/core/pod_security.py) -->", "<!-- end allow-list -->"


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def checkov_binary() -> str:
    """``$KIMI_CHECKOV``, else ``.venv-checkov/bin/checkov`` (``make checkov``); skips where missing,
    fails under ``CI=true``."""
    path = os.environ.get(CHECKOV_ENV) or str(CHECKOV_VENV / "bin" / "checkov")
    if Path(path).is_file():
        return path
    message = f"checkov is not installed at {path}: run `make checkov` (PyPI, its own venv)"
    if _ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)
    raise AssertionError("unreachable")


def scanned_documents(run) -> list[dict[str, Any]]:
    """The stack's manifests as checkov sees them: every Kubernetes object, and each
    LeaderWorkerSet template as a Deployment named ``<lws>-leader`` / ``<lws>-worker``."""
    docs = [manifest(r) for r in k8s_objects(run)]
    out = [d for d in docs if d.get("kind") != "LeaderWorkerSet"]
    for lws in (d for d in docs if d.get("kind") == "LeaderWorkerSet"):
        templates = lws["spec"]["leaderWorkerTemplate"]
        for role, key in (("leader", "leaderTemplate"), ("worker", "workerTemplate")):
            meta = {"name": f"{lws['metadata']['name']}-{role}", "namespace": lws["metadata"]["namespace"],
                    "labels": lws["metadata"].get("labels", {})}
            out.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                        "spec": {"replicas": 1, "selector": {"matchLabels": templates[key]["metadata"]["labels"]},
                                 "template": templates[key]}})
    return out


def run_checkov(directory: Path) -> list[dict[str, Any]]:
    """checkov's failed checks over every ``*.yaml`` in ``directory`` (one JSON report)."""
    cmd = [checkov_binary(), "--framework", "kubernetes", "-d", str(directory), "--compact", "-o", "json",
           "--skip-download", "--quiet"]
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        cmd = ["unshare", "-n", *cmd]  # no network at all: checkov reads only the files
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_NO_OUTPUT_VERSION_CHECK": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=CHECKOV_TIMEOUT_SECONDS, check=False)
    assert done.returncode in (0, 1), f"checkov exited {done.returncode}: {done.stderr[-2000:]}"
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed: list[dict[str, Any]] = []
    for report in reports:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        failed += report["results"]["failed_checks"]
    return failed


def workload_of(resource: str) -> str:
    """``VLLM`` / ``SYNC`` of a checkov resource id (``Kind.namespace.name``), else the id itself."""
    kind, _, name = resource.split(".", 2)
    if kind == "Deployment" and name.startswith("kimi-vllm"):
        return ps.VLLM
    if kind == "Job" and name.startswith("kimi-weights-"):
        return ps.SYNC
    return resource


@functools.cache
def findings(tmp_root: str) -> dict[str, set[tuple[str, str]]]:
    """stack -> ``(check_id, workload)`` checkov reports on its manifests (one checkov run)."""
    root = Path(tmp_root)
    for stack in K8S_STACKS:
        (root / f"{stack}.yaml").write_text(yaml.safe_dump_all(scanned_documents(plan_for(stack)), sort_keys=False))
    out: dict[str, set[tuple[str, str]]] = {stack: set() for stack in K8S_STACKS}
    for f in run_checkov(root):
        out[Path(f["file_path"]).stem].add((f["check_id"], workload_of(f["resource"])))
    return out


@pytest.fixture(scope="module")
def stack_findings(tmp_path_factory) -> dict[str, set[tuple[str, str]]]:
    return findings(str(tmp_path_factory.mktemp("checkov")))


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_checkov_finds_nothing_outside_the_written_allow_list(stack, stack_findings):
    spec = plan_for(stack).context.spec
    allowed = ps.allowed_findings(spec)
    unexplained = sorted(stack_findings[stack] - allowed)
    assert not unexplained, f"{stack}: checkov findings with no written reason: {unexplained}"
    stale = sorted(allowed - stack_findings[stack])
    assert not stale, f"{stack}: allow-list entries checkov no longer reports (remove them): {stale}"


def test_the_scan_covers_every_pod_template(stack_findings):
    """gb300's vLLM pods are LeaderWorkerSet templates, which checkov skips as an unknown kind:
    the scan turns each into a Deployment, so its findings are the vLLM workload's."""
    docs = scanned_documents(plan_for("gb300"))
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    assert names == {"kimi-vllm-leader", "kimi-vllm-worker"}
    assert ("CKV_K8S_23", ps.VLLM) in stack_findings["gb300"]


def test_checkov_would_report_what_the_posture_removed(tmp_path):
    """The same run over a vLLM pod without the posture (no seccomp, default capabilities, no
    memory limit: today's mi355x Deployment before this change) reports those checks."""
    (deployment,) = of_kind(plan_for("mi355x"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    pod.pop("securityContext")
    container = next(c for c in pod["containers"] if c["name"] == "vllm")
    container["securityContext"] = {"allowPrivilegeEscalation": False}
    container["resources"]["limits"].pop("memory")
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(deployment, sort_keys=False))
    found = {f["check_id"] for f in run_checkov(tmp_path)}
    assert {"CKV_K8S_13", "CKV_K8S_28", "CKV_K8S_29", "CKV_K8S_31", "CKV_K8S_37"} <= found


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_every_container_has_the_posture(stack):
    """Independent of checkov: every pod has a seccomp profile, every container drops every
    capability (IPC_LOCK alone back on the vLLM container with EFA), never escalates, and has a
    memory limit; every helper a CPU limit and a read-only root."""
    run = plan_for(stack)
    spec = run.context.spec
    for doc in scanned_documents(run):
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["seccompProfile"]["type"] in ("RuntimeDefault", "Unconfined"), doc["metadata"]["name"]
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]
            if c["name"] == "vllm":
                assert set(sc["capabilities"].get("add", [])) <= set(ps.EFA_CAPABILITIES)
                continue
            assert c["resources"]["limits"]["cpu"] and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc.get("seccompProfile", pod["securityContext"]["seccompProfile"])["type"] == "RuntimeDefault", c["name"]
    for pod in vllm_pods(run).values():
        assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == ps.vllm_seccomp_profile(spec)
        assert vllm_container(pod)["resources"]["limits"]["memory"] == f"{ps.vllm_memory_limit_gib(spec)}Gi"


def test_ipc_lock_only_with_efa_in_the_pod():
    compute = {**read_stack_config("gb300")["kimi-deploy:compute"], "efa": True}
    # EFA needs an image with libfabric's EFA provider and aws-ofi-nccl (config refuses the stock one)
    vllm = {k: v for k, v in read_stack_config("gb300")["kimi-deploy:vllm"].items() if k != "imageTag"}
    vllm["image"] = "registry.example.com/vllm-efa@sha256:" + "a" * 64
    efa = plan_for("gb300", overrides={"kimi-deploy:compute": compute, "kimi-deploy:vllm": vllm})
    for run, want in ((plan_for("gb300"), None), (efa, list(ps.EFA_CAPABILITIES))):
        for pod in vllm_pods(run).values():
            assert vllm_container(pod)["securityContext"]["capabilities"].get("add") == want
    assert ps._efa_in_pod(efa.context.spec) and not ps._efa_in_pod(plan_for("gb300").context.spec)


def test_the_docs_show_the_allow_list():
    text = DOC.read_text()
    assert DOC_BEGIN in text and DOC_END in text, f"{DOC.name}: markers {DOC_BEGIN!r} ... {DOC_END!r} missing"
    shown = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip("\n") + "\n"
    assert shown == ps.allow_list_markdown(), (
        f"{DOC.name}'s allow-list differs from components/core/pod_security.py; put this between the markers:\n"
        + ps.allow_list_markdown())
    for entry in ps.CHECKOV_ALLOWED:
        assert entry.reason and entry.check_id.startswith("CKV_K8S_")
