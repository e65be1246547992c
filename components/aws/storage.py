"""Weight storage: the in-region S3 mirror of the checkpoint and the optional FSx for Lustre.

The mirror bucket is retained on ``pulumi destroy`` (``retain_on_delete``), with its
encryption, public-access block, ownership and TLS-only policy, because 1.56 TB take hours to
download again; in prod it is also protected. The file system (PERSISTENT_2 by default) is
sized by the core sizing (valid capacity and throughput by construction: ``spec/fsx.py``) and
imports the served revision's mirror prefix through a data repository association with auto-import.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core import naming
from components.core.config import DeploymentSpec
from components.core.sizing import Sizing
from components.core.vllm import API_GUARD_SOURCE
from components.core.weights import FSX_MOUNT_PATH, mirror_key_prefix
from components.sync_artifact import SYNC_PACKAGE_DIR, sync_artifact

from .common import TOOLS_PREFIX, child, tags
from .iam import tls_only_bucket_policy


def mirror_tags(ctx_tags, name: str) -> dict:
    """The mirror bucket's tags: the stack's, marked retained, and without ``expires-at``:
    the mirror outlives the trial that created it (the sweeper never deletes it)."""
    out = {k: v for k, v in tags(ctx_tags, name).items() if k != naming.TAG_EXPIRES_AT}
    out[naming.TAG_ROLE] = naming.ROLE_WEIGHTS_MIRROR
    out[naming.TAG_RETAIN] = "true"
    return out


REPO_ROOT = Path(__file__).resolve().parents[2]
# The weight-sync program: shipped to EC2 nodes as an S3 object (user data is limited to 16 KB),
# the deterministic zipapp of scripts/node/weight_sync/ (components/sync_artifact.py).
WEIGHT_SYNC_SOURCE = SYNC_PACKAGE_DIR
WEIGHT_SYNC_KEY = f"{TOOLS_PREFIX}/weight_sync.pyz"
# The engine-cache program (restore before vLLM starts, save after its first healthy start).
ENGINE_CACHE_SOURCE = REPO_ROOT / "scripts" / "node" / "engine_cache.py"
ENGINE_CACHE_KEY = f"{TOOLS_PREFIX}/engine_cache.py"
# The API guard vLLM loads with --middleware (components/core/vllm.py API_GUARD_SOURCE).
API_GUARD_KEY = f"{TOOLS_PREFIX}/{API_GUARD_SOURCE.name}"


def tool_sha256(source: Path) -> str:
    """sha256 (hex) of a tool program's text as uploaded (the node checks it before running it)."""
    import hashlib

    return hashlib.sha256(source.read_text().encode()).hexdigest()
# Incomplete multipart uploads (an interrupted publish) are removed after this many days.
ABORT_INCOMPLETE_UPLOADS_DAYS = 3
# Lustre version: 2.15 supports data repository associations, metadata configuration and EFA.
LUSTRE_VERSION = "2.15"
DRA_AUTO_IMPORT_EVENTS: tuple[str, ...] = ("NEW", "CHANGED", "DELETED")


@dataclass
class WeightMirrorArgs:
    """Inputs of ``WeightMirror``.

    Attributes:
        spec: the deployment spec (``storage.mirror``, protection).
        tags: the stack's tags.
        partition: the AWS partition.
        upload_tools: upload the weight-sync zipapp (``scripts/node/weight_sync/``), ``scripts/node/engine_cache.py`` and
            the API guard (``scripts/node/kimi_vllm_api_guard.py``) under ``_tools/`` (EC2 nodes fetch and verify them).
    """

    spec: DeploymentSpec
    tags: dict[str, Any]
    partition: pulumi.Input[str]
    upload_tools: bool = False


class WeightMirror(pulumi.ComponentResource):
    """The S3 mirror bucket (created, or an existing one named in config).

    Attributes:
        bucket_name: the bucket's name.
        bucket_arn: its ARN.
        tools_object_key: key of the uploaded weight-sync program, or None.
        weight_sync_sha256: sha256 (hex) of that program's bytes (the zipapp), or None.
    """

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]

    def __init__(self, name: str, args: WeightMirrorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:WeightMirror", name, None, opts)
        spec = args.spec
        mirror = spec.config.storage.mirror
        self.tools_object_key: str | None = None
        self.weight_sync_sha256: str | None = None
        if mirror.create:
            self._create_bucket(name, args)
        else:
            self.bucket_name = pulumi.Output.from_input(mirror.bucket_name or "")
            self.bucket_arn = pulumi.Output.concat("arn:", args.partition, ":s3:::", self.bucket_name)
        if args.upload_tools:
            self._upload_tools(name, args)
        self.register_outputs({"bucketName": self.bucket_name, "bucketArn": self.bucket_arn})

    def _create_bucket(self, name: str, args: WeightMirrorArgs) -> None:
        spec = args.spec
        mirror = spec.config.storage.mirror
        # Everything that guards the data goes (or stays) with the bucket.
        keep = dict(retain_on_delete=True, protect=spec.protect)
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket=mirror.bucket_name,
            force_destroy=False,
            tags=mirror_tags(args.tags, f"{spec.stack}-weight-mirror"),
            opts=child(self, **keep),
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child(self, **keep),
        )
        pab = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access-block",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child(self, **keep),
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                    bucket_key_enabled=True,
                )
            ],
            opts=child(self, **keep),
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=pulumi.Output.all(args.partition, bucket.bucket).apply(lambda a: tls_only_bucket_policy(a[0], a[1])),
            # The public-access block must exist first (it would reject nothing here, but the
            # order makes the bucket private before it has any policy).
            opts=child(self, depends_on=[pab], **keep),
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-multipart-uploads",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=ABORT_INCOMPLETE_UPLOADS_DAYS
                    ),
                )
            ],
            opts=child(self, **keep),
        )
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn

    def _upload_tools(self, name: str, args: WeightMirrorArgs) -> None:
        artifact = sync_artifact()
        self.weight_sync_sha256 = artifact.sha256
        self.tools_object_key = WEIGHT_SYNC_KEY
        # The zipapp's bytes (base64 in the plan; S3 stores the decoded bytes), its sha256 and
        # size also as object metadata (x-amz-meta-*), readable without downloading it.
        aws.s3.BucketObjectv2(
            f"{name}-weight-sync-script",
            bucket=self.bucket_name,
            key=WEIGHT_SYNC_KEY,
            content_base64=base64.b64encode(artifact.data).decode("ascii"),
            content_type="application/zip",
            metadata={"sha256": artifact.sha256, "size-bytes": str(artifact.size_bytes)},
            server_side_encryption="AES256",
            tags=tags(args.tags),
            opts=child(self),
        )
        # The node's single-file Python tools under _tools/: the API guard and the engine-cache program.
        for suffix, key, source in (("api-guard", API_GUARD_KEY, API_GUARD_SOURCE),
                                    ("engine-cache-script", ENGINE_CACHE_KEY, ENGINE_CACHE_SOURCE)):
            aws.s3.BucketObjectv2(
                f"{name}-{suffix}",
                bucket=self.bucket_name,
                key=key,
                content=source.read_text(),
                content_type="text/x-python",
                server_side_encryption="AES256",
                tags=tags(args.tags),
                opts=child(self),
            )


@dataclass
class LustreArgs:
    """Inputs of ``LustreStorage``.

    Attributes:
        spec, sizing: the deployment spec and its sizing (capacity and throughput).
        tags: the stack's tags.
        subnet_id: the subnet in the GPU AZ.
        security_group_ids: the file system's groups (Lustre ports; the EFA group when EFA is on).
        mirror_bucket: the mirror bucket's name.
        security_group_rules: the rules of those groups; the file system depends on them (FSx
            validates the Lustre port rules at creation: InvalidNetworkSettings otherwise).
    """

    spec: DeploymentSpec
    sizing: Sizing
    tags: dict[str, Any]
    subnet_id: pulumi.Input[str]
    security_group_ids: list[pulumi.Input[str]]
    mirror_bucket: pulumi.Input[str]
    security_group_rules: list[pulumi.Resource] = field(default_factory=list)


class LustreStorage(pulumi.ComponentResource):
    """FSx for Lustre with a data repository association to the served revision's mirror prefix.

    The association maps ``/<prefix>/<org>/<repo>/<revision>`` on the file system to
    ``s3://<bucket>/<prefix>/<org>/<repo>/<revision>/`` (``weights.mirror_key_prefix``), so the
    revision appears at ``/fsx/<prefix>/<org>/<repo>/<revision>`` (``weights.fsx_weights_path``) and
    nothing else of the mirror (other revisions, engine-cache tarballs) is imported.

    Attributes:
        file_system_id, dns_name, mount_name: what a Lustre client (or the FSx CSI driver) needs.
        file_system_path: the association's path on the file system.
    """

    file_system_id: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    mount_name: pulumi.Output[str]

    def __init__(self, name: str, args: LustreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:LustreStorage", name, None, opts)
        spec, plan = args.spec, args.sizing.storage
        fc = spec.config.storage.fsx
        persistent_2 = fc.deployment_type == "PERSISTENT_2"
        extra: dict[str, Any] = {}
        if fc.deployment_type != "SCRATCH_2":
            extra["per_unit_storage_throughput"] = plan.fsx_throughput_per_tib_mbps
            # The file system is a cache of the mirror: backups would only bill storage.
            extra["automatic_backup_retention_days"] = 0
            extra["skip_final_backup"] = True
        if persistent_2:
            extra["metadata_configuration"] = aws.fsx.LustreFileSystemMetadataConfigurationArgs(
                mode="USER_PROVISIONED" if fc.metadata_iops else "AUTOMATIC",
                iops=fc.metadata_iops,
            )
        if fc.efa:
            extra["efa_enabled"] = True
        fs = aws.fsx.LustreFileSystem(
            f"{name}-fs",
            deployment_type=fc.deployment_type,
            storage_type="SSD",
            storage_capacity=plan.fsx_capacity_gib,
            file_system_type_version=LUSTRE_VERSION,
            subnet_ids=args.subnet_id,
            security_group_ids=args.security_group_ids,
            data_compression_type="NONE",
            log_configuration=aws.fsx.LustreFileSystemLogConfigurationArgs(level="WARN_ERROR"),
            tags=tags(args.tags, f"{spec.stack}-weights"),
            opts=child(self, protect=spec.protect, depends_on=list(args.security_group_rules)),
            **extra,
        )
        # Scoped to the served revision (models/<org>/<repo>/<revision>/): the rest of the mirror
        # (other revisions, the engine-cache tarballs) is not imported into the file system.
        prefix = mirror_key_prefix(spec)
        self.file_system_path = f"/{prefix}"
        aws.fsx.DataRepositoryAssociation(
            f"{name}-mirror-dra",
            file_system_id=fs.id,
            file_system_path=self.file_system_path,
            data_repository_path=pulumi.Output.concat("s3://", args.mirror_bucket, "/", prefix, "/"),
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(events=list(DRA_AUTO_IMPORT_EVENTS)),
            ),
            tags=tags(args.tags),
            # Not protected: it holds no data (deleteDataInFilesystem false) and a new revision
            # replaces it; the file system and the mirror bucket keep their protection.
            opts=child(self),
        )
        self.file_system_id = fs.id
        self.dns_name = fs.dns_name
        self.mount_name = fs.mount_name
        self.mount_path = FSX_MOUNT_PATH
        self.register_outputs(
            {"fileSystemId": fs.id, "dnsName": fs.dns_name, "mountName": fs.mount_name, "fileSystemPath": self.file_system_path}
        )
