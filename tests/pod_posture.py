"""Helper (not a test module): the pod security checks the posture is judged by, evaluated in plain
Python on rendered manifests, so the posture is asserted where checkov is not installed too.

Each check is one of checkov's Kubernetes checks (``checkov --framework kubernetes``; ids and names as
checkov's), read as checkov reads it: which containers it looks at (``containers`` alone, or the init
containers too) and what passes. ``tests/test_pod_posture.py`` holds the evaluation equal to checkov's
own findings where checkov runs, and to the written allow-list (``pod_security.CHECKOV_ALLOWED``)
everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Container = dict[str, Any]
Pod = dict[str, Any]


def _pull_always_or_digest(c: dict) -> bool:
    """As checkov 3 reads it (ImagePullPolicyAlways.py): an image pinned by digest passes whatever its
    policy; otherwise the policy is Always, or unset with a tag of ``latest`` or none (Kubernetes then
    defaults it to Always)."""
    image = c.get("image")
    if not isinstance(image, str) or not image.strip():
        return False
    name, has_digest = image.split("@", 1)[0], "@" in image
    if has_digest:
        return True
    if "imagePullPolicy" in c:
        return c["imagePullPolicy"] == "Always"
    last = name.rsplit("/", 1)[-1]
    return ":" not in last or last.rsplit(":", 1)[1] == "latest"


def _sc(c: Container) -> dict[str, Any]:
    return c.get("securityContext") or {}


def _limits(c: Container) -> dict[str, Any]:
    return (c.get("resources") or {}).get("limits") or {}


def _seccomp(pod: Pod, c: Container) -> str | None:
    own = _sc(c).get("seccompProfile") or {}
    return own.get("type") or ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")


def _run_as(pod: Pod, c: Container, key: str) -> Any:
    return _sc(c).get(key, (pod.get("securityContext") or {}).get(key))


# check id -> (what it asks, whether init containers count, whether Jobs are judged, passes(pod, container)).
CHECKS: dict[str, tuple[str, bool, bool, Callable[[Pod, Container], bool]]] = {
    "CKV_K8S_8": ("Liveness Probe Should be Configured", False, False, lambda p, c: "livenessProbe" in c),
    "CKV_K8S_9": ("Readiness Probe Should be Configured", False, False, lambda p, c: "readinessProbe" in c),
    "CKV_K8S_11": ("CPU limits should be set", True, True, lambda p, c: "cpu" in _limits(c)),
    "CKV_K8S_13": ("Memory limits should be set", True, True, lambda p, c: "memory" in _limits(c)),
    "CKV_K8S_15": ("Image Pull Policy should be Always", True, True, lambda p, c: _pull_always_or_digest(c)),
    "CKV_K8S_16": ("Container should not be privileged", True, True, lambda p, c: _sc(c).get("privileged") is not True),
    "CKV_K8S_20": ("Containers should not run with allowPrivilegeEscalation", True, True,
                   lambda p, c: _sc(c).get("allowPrivilegeEscalation") is False),
    "CKV_K8S_22": ("Use read-only filesystem for containers where possible", True, True,
                   lambda p, c: _sc(c).get("readOnlyRootFilesystem") is True),
    "CKV_K8S_23": ("Minimize the admission of root containers", True, True,
                   lambda p, c: _run_as(p, c, "runAsNonRoot") is True),
    "CKV_K8S_28": ("Minimize the admission of containers with the NET_RAW capability", True, True,
                   lambda p, c: bool({"ALL", "NET_RAW"} & set((_sc(c).get("capabilities") or {}).get("drop") or []))),
    "CKV_K8S_31": ("Ensure that the seccomp profile is set to docker/default or runtime/default", True, True,
                   lambda p, c: _seccomp(p, c) == "RuntimeDefault"),
    "CKV_K8S_35": ("Prefer using secrets as files over secrets as environment variables", True, True,
                   lambda p, c: not any("secretKeyRef" in (e.get("valueFrom") or {}) for e in c.get("env") or [])),
    # As checkov 3 reads it (MinimizeCapabilities.py): passes when ``drop`` holds ALL, whatever is added.
    "CKV_K8S_37": ("Minimize the admission of containers with capabilities assigned", True, True,
                   lambda p, c: any("ALL" in d or "all" in d for d in (_sc(c).get("capabilities") or {}).get("drop") or [])),
    "CKV_K8S_40": ("Containers should run as a high UID to avoid host conflict", True, True,
                   lambda p, c: isinstance(_run_as(p, c, "runAsUser"), int) and _run_as(p, c, "runAsUser") >= 10000),
    "CKV_K8S_43": ("Image should use digest", True, True, lambda p, c: "@sha256:" in str(c.get("image", ""))),
}
# Pod-level checks: id -> (what it asks, passes(pod)).
POD_CHECKS: dict[str, tuple[str, Callable[[Pod], bool]]] = {
    "CKV_K8S_17": ("Containers should not share the host process ID namespace", lambda p: p.get("hostPID") is not True),
    "CKV_K8S_18": ("Containers should not share the host IPC namespace", lambda p: p.get("hostIPC") is not True),
    "CKV_K8S_19": ("Containers should not share the host network namespace", lambda p: p.get("hostNetwork") is not True),
}


def pods(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], Pod]]:
    """``(kind, document, pod spec)`` of every workload document with a pod template."""
    for doc in documents:
        template = (doc.get("spec") or {}).get("template")
        if doc.get("kind") in ("Deployment", "Job", "DaemonSet", "StatefulSet") and template:
            yield doc["kind"], doc, template["spec"]


def evaluate(documents: list[dict[str, Any]], workload: Callable[[str], str]) -> set[tuple[str, str]]:
    """``(check_id, workload(resource id))`` of every failed check over ``documents`` (as checkov
    names a resource: ``Kind.namespace.name``)."""
    failed: set[tuple[str, str]] = set()
    for kind, doc, pod in pods(documents):
        resource = f"{kind}.{doc['metadata'].get('namespace', 'default')}.{doc['metadata']['name']}"
        for check_id, (_, with_init, jobs, passes) in CHECKS.items():
            if kind == "Job" and not jobs:
                continue
            containers = [*pod.get("containers", []), *(pod.get("initContainers", []) if with_init else [])]
            if not all(passes(pod, c) for c in containers):
                failed.add((check_id, workload(resource)))
        for check_id, (_, passes_pod) in POD_CHECKS.items():
            if not passes_pod(pod):
                failed.add((check_id, workload(resource)))
    return failed
