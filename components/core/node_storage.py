"""The GPU node's NVMe as pods see it: the directories kimi-deploy keeps there, and the node's own
state that shares the array and must never be mounted into a pod.

On EKS AL2023 nodes with nodeadm ``localStorage: RAID0`` the AMI's ``setup-local-disks raid0``
mounts the array at ``/mnt/k8s-disks/0`` and moves the kubelet's, containerd's, the SOCI
snapshotter's and the pod-log directories onto it: it copies ``/var/lib/kubelet`` to
``<array>/kubelet`` (the mount point's basename) and bind-mounts it back, and the same for
``/var/lib/containerd``, ``/var/lib/soci-snapshotter-grpc`` and ``/var/log/pods``
(awslabs/amazon-eks-ami v20260724 ``templates/al2023/runtime/bin/setup-local-disks``, ``maybe_raid``:
``array_mount_point="${MNT_DIR}/0"``, ``BIND_MOUNTS``, ``array_mount_point_unit=...$(basename)``;
``nodeadm/internal/system/local_disk.go`` runs it). A hostPath volume of the array root would
hand a pod every container's snapshot, the kubelet's pod volumes (other pods' secrets) and all
pod logs.

So pods mount only dedicated directories below ``<nvme root>/kimi-deploy/``: ``weights`` (the
node-local copy; read-write only in the weight writer, read-only everywhere else), ``staging``
(the mirror publish's hub files before upload) and ``engine-cache`` (the compile caches vLLM
writes). ``nvme root`` is the platform's RAID0 mount (``naming.NVME_RAID0_HOST_PATH`` on EKS) or
``kubernetes.nvmeHostPath``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

# Directories setup-local-disks bind-mounts onto the array: host path -> its directory on the array
# (awslabs/amazon-eks-ami v20260724 templates/al2023/runtime/bin/setup-local-disks, maybe_raid).
RAID0_BIND_MOUNTS: dict[str, str] = {
    "/var/lib/kubelet": "kubelet",
    "/var/lib/containerd": "containerd",
    "/var/lib/soci-snapshotter-grpc": "soci-snapshotter-grpc",
    "/var/log/pods": "pods",
}
# Node state outside the array on any Kubernetes node: the kubelet's and the runtime's state, their
# sockets, the node's logs and its configuration (kubelet --root-dir default /var/lib/kubelet;
# containerd root /var/lib/containerd, state /run/containerd; pod and container logs under /var/log).
NODE_STATE_PATHS: tuple[str, ...] = (
    "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/soci-snapshotter-grpc", "/run/containerd", "/var/log",
    "/etc/kubernetes", "/etc/eks",
)
# The host's own system directories (Filesystem Hierarchy Standard 3.0, "The Root Filesystem"; /proc and
# /sys are kernel interfaces, /tmp is often tmpfs): never where a 1.56 TB array is mounted.
SYSTEM_DIRS: tuple[str, ...] = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin",
                                "/sys", "/tmp", "/usr")
# The directory kimi-deploy owns below the NVMe root, and its parts.
KIMI_NODE_DIR = "kimi-deploy"
WEIGHTS_SUBDIR = "weights"
STAGING_SUBDIR = "staging"
ENGINE_CACHE_SUBDIR = "engine-cache"


@dataclass(frozen=True)
class NodeDirs:
    """Host paths of the directories kimi-deploy keeps on a node's NVMe.

    Attributes:
        weights: the node-local weight copy (``<root>/kimi-deploy/weights``).
        staging: hub files staged by the mirror publish (``<root>/kimi-deploy/staging``).
        engine_cache: the engine's compile caches (``<root>/kimi-deploy/engine-cache``).
    """

    weights: str
    staging: str
    engine_cache: str


def node_dirs(nvme_root: str) -> NodeDirs:
    """The dedicated directories below ``nvme_root`` (an absolute host path)."""
    base = PurePosixPath(nvme_root) / KIMI_NODE_DIR
    return NodeDirs(str(base / WEIGHTS_SUBDIR), str(base / STAGING_SUBDIR), str(base / ENGINE_CACHE_SUBDIR))


def node_state_paths(nvme_root: str) -> tuple[str, ...]:
    """Host paths holding kubelet, container-runtime or log state on a node whose NVMe array is
    mounted at ``nvme_root``: ``NODE_STATE_PATHS`` and their copies on the array (``RAID0_BIND_MOUNTS``)."""
    root = PurePosixPath(nvme_root)
    return NODE_STATE_PATHS + tuple(str(root / sub) for sub in RAID0_BIND_MOUNTS.values())


# Directories that are another's alias on every current Linux distribution (FHS 3.0 5.13 "/var/run":
# "replaced by /run"; systemd's tmpfiles make /var/run and /var/lock symbolic links into /run).
HOST_PATH_ALIASES: tuple[tuple[str, str], ...] = (("/var/run", "/run"), ("/var/lock", "/run/lock"))


class HostPathError(ValueError):
    """A host path that names no directory once normalised (``normal_host_path``); ``str`` says why."""


def normal_host_path(host_path: str) -> str:
    """``host_path`` as the node resolves it: the one spelling every host-path check compares.

    Doubled slashes collapse (``//var/lib/kubelet`` -> ``/var/lib/kubelet``; POSIX leaves a leading
    ``//`` to the implementation, Linux reads it as ``/``), ``.`` parts and a trailing slash go, and
    an alias in ``HOST_PATH_ALIASES`` is replaced by its target (``/var/run/x`` -> ``/run/x``).

    Raises:
        HostPathError: not absolute, a ``..`` part (it may climb out of any directory checked), or
            whitespace or a control character anywhere (a trailing space or newline names another,
            new directory: ``DirectoryOrCreate`` would create it on the root disk).
    """
    if not host_path.startswith("/"):
        raise HostPathError("is not absolute (it starts without /)")
    if any(ch.isspace() or not ch.isprintable() for ch in host_path):
        raise HostPathError("holds whitespace or a control character (a trailing space or newline names another directory)")
    parts = [part for part in host_path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise HostPathError("holds '..'")
    path = "/" + "/".join(parts)
    for alias, target in HOST_PATH_ALIASES:
        if path == alias or path.startswith(alias + "/"):
            path = target + path[len(alias):]
    return path


def _within(path: PurePosixPath, other: PurePosixPath) -> bool:
    return path == other or other in path.parents


def _normal(host_path: str) -> PurePosixPath:
    """``normal_host_path`` as a ``PurePosixPath``; a path it refuses is compared as written (the
    config check refuses it first, in its own words)."""
    try:
        return PurePosixPath(normal_host_path(host_path))
    except HostPathError:
        return PurePosixPath(host_path)


def state_containing(host_path: str) -> str | None:
    """The first of ``NODE_STATE_PATHS`` that ``host_path`` lies in (or is), else None: a directory
    there belongs to the kubelet, the runtime or the logs, never to kimi-deploy. Compared in
    ``normal_host_path``'s spelling."""
    path = _normal(host_path)
    return next((state for state in NODE_STATE_PATHS if _within(path, PurePosixPath(state))), None)


def system_dir_containing(host_path: str) -> str | None:
    """The first of ``SYSTEM_DIRS`` that ``host_path`` lies in (or is), else None (compared in
    ``normal_host_path``'s spelling)."""
    path = _normal(host_path)
    return next((d for d in SYSTEM_DIRS if _within(path, PurePosixPath(d))), None)


def exposed_node_state(host_path: str, nvme_root: str) -> str | None:
    """The node state a hostPath volume of ``host_path`` would expose: the first of
    ``node_state_paths(nvme_root)`` that lies inside it (the volume holds it) or contains it (the
    volume is part of it); None when it exposes none. Both compared in ``normal_host_path``'s spelling."""
    path = _normal(host_path)
    for state in node_state_paths(str(_normal(nvme_root))):
        other = _normal(state)
        if _within(other, path) or _within(path, other):
            return state
    return None


__all__ = [
    "HOST_PATH_ALIASES", "HostPathError", "normal_host_path",
    "SYSTEM_DIRS",
    "system_dir_containing",
    "ENGINE_CACHE_SUBDIR", "KIMI_NODE_DIR", "NODE_STATE_PATHS", "RAID0_BIND_MOUNTS", "STAGING_SUBDIR", "WEIGHTS_SUBDIR",
    "NodeDirs", "exposed_node_state", "node_dirs", "node_state_paths", "state_containing",
]
