"""The weight flow: which weight-sync runs (``scripts/node/weight_sync/``, shipped as a zipapp) happen, where, with which
arguments.

hub -> S3 mirror (``publish-mirror``, once per revision, skipped when complete) -> serving copy
(``node-copy``: per node for node-local NVMe, once for a shared claim; none for ``fsx``, where
FSx imports from the mirror through a data repository association). The Kubernetes Jobs and
the EC2 user data both run exactly these argv lists inside the pinned vLLM image.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config.spec import DeploymentSpec
from .naming import MANIFEST_NAME, MARKER_NAME  # noqa: F401  re-exported: defined once in naming.py

# Paths inside the containers that run the sync and vLLM.
WEIGHTS_MOUNT_PATH = "/models"
FSX_MOUNT_PATH = "/fsx"
# The weight-sync zipapp (components/sync_artifact.py), run as `python3 SYNC_SCRIPT_PATH ...`.
SYNC_SCRIPT_PATH = "/opt/kimi-deploy/weight_sync.pyz"
# Publishing to the mirror verifies hub files on local disk before upload (workers x largest
# shard, hundreds of GB): on the node's NVMe, mounted at WEIGHTS_MOUNT_PATH, never the root disk.
STAGING_DIR = f"{WEIGHTS_MOUNT_PATH}/.kimi-deploy-staging"
# Parallel transfers per sync (files in flight; ranged parts within a file are the tool's own).
SYNC_WORKERS = 16
# Environment variable that carries the hub token into the weight sync, per model source.
HUB_TOKEN_ENV = {"huggingface": "HF_TOKEN", "modelscope": "MODELSCOPE_API_TOKEN"}


@dataclass(frozen=True)
class SyncStep:
    """One run of the weight sync.

    Attributes:
        name: ``publish-mirror`` or ``node-copy``.
        source, dest: URIs / paths as the weight sync takes them (container paths).
        per_node: runs on every GPU node (node-local copy) rather than once.
        needs_hub_token: reads from the hub (the token secret is mounted as env).
        needs_fsx: mounts the FSx file system at ``FSX_MOUNT_PATH``.
        argv: the complete command.
        source_wait_seconds: how long the step waits for its source's files to be imported
            (``--source-wait-seconds``; a file system fed by S3 import), 0 for none.
    """

    name: str
    source: str
    dest: str
    per_node: bool
    needs_hub_token: bool
    needs_fsx: bool
    argv: tuple[str, ...]
    source_wait_seconds: int = 0


def mirror_key_prefix(spec: DeploymentSpec) -> str:
    """S3 key prefix of this model revision in the mirror: ``<prefix>/<org>/<repo>/<revision>``."""
    return f"{spec.config.storage.mirror.prefix.strip('/')}/{spec.hub_repo}/{spec.revision}"


def mirror_uri(spec: DeploymentSpec, bucket: str) -> str:
    """``s3://<bucket>/<prefix>/<org>/<repo>/<revision>``."""
    return f"s3://{bucket}/{mirror_key_prefix(spec)}"


def fsx_weights_path(spec: DeploymentSpec) -> str:
    """Where the revision appears on the FSx mount (the DRA maps ``/<prefix>`` to the mirror prefix)."""
    return f"{FSX_MOUNT_PATH}/{mirror_key_prefix(spec)}"


def serving_path(spec: DeploymentSpec) -> str:
    """The weights directory vLLM is started on (inside the container).

    FSx serves from the file system itself; every other kind from a local copy at
    ``/models/<profile>/<revision>`` (a new revision never rewrites the copy being served).
    """
    if spec.config.storage.kind == "fsx":
        return fsx_weights_path(spec)
    return f"{WEIGHTS_MOUNT_PATH}/{spec.model.name}/{spec.revision}"


def _argv(source: str, dest: str) -> tuple[str, ...]:
    return ("python3", SYNC_SCRIPT_PATH, "--source", source, "--dest", dest, "--workers", str(SYNC_WORKERS), "--json")


# A bucket name that only stands in for "a mirror is used": the steps' order, kinds and volumes
# do not depend on the name, so callers that need the shape before the bucket exists use this.
SHAPE_BUCKET = "mirror-bucket"


def per_node_copy_step(spec: DeploymentSpec, with_mirror: bool) -> tuple[int, SyncStep] | None:
    """``(index, step)`` of the ``node-copy`` step that runs on every GPU node (on Kubernetes an
    init container of every vLLM pod, run as the weight-sync service account), or None (``pvc``:
    one Job; ``fsx``: no copy). ``step`` is built with ``SHAPE_BUCKET`` when ``with_mirror``: use
    ``sync_steps(spec, bucket)[index]`` for the real argv."""
    steps = sync_steps(spec, SHAPE_BUCKET if with_mirror else None)
    return next(((i, s) for i, s in enumerate(steps) if s.name == "node-copy" and s.per_node), None)


def sync_steps(spec: DeploymentSpec, mirror_bucket: str | None) -> tuple[SyncStep, ...]:
    """The ordered sync runs for ``spec``.

    Args:
        spec: the deployment spec.
        mirror_bucket: the mirror bucket's name when a mirror is used, else None.

    Raises:
        ValueError: the storage kind needs a mirror and ``mirror_bucket`` is None.
    """
    kind = spec.config.storage.kind
    mirror = spec.config.storage.mirror.enabled and mirror_bucket is not None
    if kind in ("fsx", "nvme-from-fsx") and not mirror:
        raise ValueError(f"storage.kind {kind} needs the S3 mirror bucket")
    steps: list[SyncStep] = []
    source = spec.hub_uri
    if mirror:
        dest = mirror_uri(spec, mirror_bucket)  # type: ignore[arg-type]
        argv = _argv(source, dest) + ("--staging-dir", STAGING_DIR)
        steps.append(SyncStep("publish-mirror", source, dest, False, True, False, argv))
        source = dest
    if kind == "fsx":
        return tuple(steps)
    wait_seconds = 0
    if kind == "nvme-from-fsx":
        # FSx imports the mirror's objects asynchronously, in no order: the copy waits for a listed
        # file the import has not produced yet (scripts/node/weight_sync/ready.py), within
        # storage.fsx.importWaitSeconds (default fsx.IMPORT_WAIT_SECONDS, an estimate).
        source, wait_seconds = "file://" + fsx_weights_path(spec), spec.config.storage.fsx.import_wait_seconds
    dest = serving_path(spec)
    argv = _argv(source, dest) + (("--source-wait-seconds", str(wait_seconds)) if wait_seconds else ())
    steps.append(
        SyncStep(
            "node-copy",
            source,
            dest,
            per_node=kind != "pvc",
            needs_hub_token=source == spec.hub_uri,
            needs_fsx=kind == "nvme-from-fsx",
            argv=argv,
            source_wait_seconds=wait_seconds,
        )
    )
    return tuple(steps)


@dataclass(frozen=True)
class ServeCommit:
    """Which commit of the model serve loads.

    Attributes:
        commit: the 40-hex commit when ``model.revision`` pins one, else None (a branch or tag).
        marker: the completion marker serve reads the commit from (a branch with a mirror:
            ``s3://<bucket>/<prefix>/<org>/<repo>/<branch>/.weights-complete.json``), else None.
        summary: one line for the plan (the marker by its key in the mirror).
    """

    commit: str | None
    marker: str | None
    summary: str


def serve_commit(spec: DeploymentSpec, mirror_bucket: str | None) -> ServeCommit:
    """Which commit serve loads (the plan's ``weights commit`` row).

    A pinned commit is itself. A branch with a mirror is resolved once, by the publish that fills
    the mirror (``phase: stage``, or the first serve's ``publish-mirror``): the weight sync records
    the commit in the mirror's marker and every later publish and node copy keeps it without asking
    the hub (``scripts/node/weight_sync`` ``S3Destination``; ``--follow-branch`` moves it). Without
    a mirror each node copy resolves the branch at the hub when it runs.

    Args:
        spec: the deployment spec.
        mirror_bucket: the mirror bucket's name when a mirror is used, else None.
    """
    if spec.revision_is_commit:
        return ServeCommit(spec.revision, None, f"{spec.revision} (model.revision pins it)")
    if spec.config.storage.mirror.enabled and mirror_bucket is not None:
        marker = f"{mirror_uri(spec, mirror_bucket)}/{MARKER_NAME}"
        return ServeCommit(None, marker, f"the commit staging resolved: read from the mirror's "
                                         f"{mirror_key_prefix(spec)}/{MARKER_NAME} at serve time")
    return ServeCommit(None, None, f"the commit '{spec.revision}' points to when each node copies from the hub "
                                   "(no mirror records one)")
