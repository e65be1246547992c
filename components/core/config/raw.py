"""Raw config: the shape of the YAML, camelCase as users write it (pydantic models; unknown keys
are rejected), and ``validate_raw``, which turns pydantic's first error into one ``ConfigError``
line naming the full key."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError

from ..errors import UNKNOWN_KEY_VALUE, ConfigError
from ..fsx import IMPORT_WAIT_SECONDS, MAX_IMPORT_WAIT_SECONDS
from ..model import MODELS
from ..versions import VLLM_PORT

# The largest USD per unit a `prices` entry takes: above any AWS unit price (the dearest GPU instance
# bills about USD 150/h), so a typo of several orders of magnitude is refused, not priced.
MAX_PRICE_OVERRIDE_USD = 10_000.0

# Config keys that hold secrets, with what each is (the configuration reference prints it). Set only
# with `pulumi config set --secret`; they never enter the spec: only whether they are set.
SECRETS: Mapping[str, str] = MappingProxyType(
    {
        "hfToken": "Hugging Face read token for the weight sync's hub download (model.source huggingface); kept in an SSM "
        "SecureString parameter (aws-ec2) or a Kubernetes Secret, never in argv or user data.",
        "modelscopeToken": "ModelScope token for the weight sync's hub download (model.source modelscope); kept like hfToken.",
        "apiKey": "The vLLM API key clients send (Authorization: Bearer); optional: generated once and kept in the stack "
        "state when unset (stack output apiKey). At least 15 characters (API_KEY_MIN_CHARS); never empty.",
        "kubeconfig": "kubernetes platform: the kubeconfig of the existing cluster (`pulumi config set --secret "
        "kimi-deploy:kubeconfig < ~/.kube/config`); without it `pulumi up` uses the ambient kubeconfig.",
    }
)
SECRET_KEYS: tuple[str, ...] = tuple(SECRETS)

# The shortest apiKey `pulumi up` accepts, characters: NIST SP 800-63B-4 (August 2024) section
# 3.1.1.2 ("passwords that are used as a single-factor authentication mechanism [...] a minimum of
# 15 characters"); the API key is the endpoint's single factor. The generated key has 48
# (program._api_key). The API guard in the image (scripts/node/kimi_vllm_api_guard.py
# MIN_API_KEY_CHARS, standard library only) refuses to serve below the same figure.
API_KEY_MIN_CHARS = 15

DEFAULT_TRIAL_TTL_HOURS = 72

# Upper bounds of numeric settings (each reaches a rendered file: user data, the vLLM argv and env,
# probes, the FSx and EC2 API inputs). Where an API states its range the bound is that range;
# elsewhere it is a typo guard far above any real value, named here with its reason.
# A price per node-hour: 70x the dearest GPU instance on demand (p6-b300.48xlarge, USD 142.42;
# targets.py), so no price in the plan can be a slipped decimal point of a real one.
MAX_USD_PER_NODE_HOUR = 10_000.0
# Instances in one capacity block: "Each Capacity Block can have up to 64 instances" (EC2 user
# guide, capacity-blocks-purchase).
MAX_CAPACITY_BLOCK_INSTANCES = 64
# FSx for Lustre API ranges (botocore's fsx service model: StorageCapacity 0..2147483647 GiB,
# PerUnitStorageThroughput 12..1000 MB/s/TiB, MetadataIops 1500..192000).
FSX_STORAGE_CAPACITY_GIB_RANGE = (0, 2_147_483_647)
FSX_THROUGHPUT_PER_TIB_RANGE = (12, 1000)
FSX_METADATA_IOPS_RANGE = (1500, 192_000)
# A measured read or copy rate: 1 TB/s, ten times the sum of 16 NVMe devices at PCIe 5.0 x4
# (storage.readGBps is checked against the kind's own ceiling after this).
MAX_MEASURED_GBPS = 1000.0
# A measured phase of the time to ready: a day (the first hub download takes about 52 min at the slow
# end of the hub's range, hours on a slow hub; timeToReady.engineInitSeconds reaches VLLM_ENGINE_READY_TIMEOUT_S).
MAX_MEASURED_PHASE_SECONDS = 86_400.0
# Decode context parallelism divides the tensor-parallel group: at most the largest group of a
# target (gb200: 16 GPUs; the vllm check then requires it to divide the stack's TP).
MAX_DECODE_CONTEXT_PARALLEL_SIZE = 16
# A measured KV capacity: 10 billion tokens, hundreds of times what a copy of any profile holds
# (Kimi K3.1 Pro on 8x B300 at DCP8: about 19M), a typo guard.
MAX_KV_CACHE_TOKENS = 10_000_000_000
# The longest context of a model profile (Kimi K3.1 Pro: 1,048,576 tokens; model.py).
MAX_MODEL_LEN_TOKENS = max(m.max_context_tokens for m in MODELS.values())


def _decimal_as_pulumi_writes_it(value: Any) -> Any:
    """A decimal given as text (``"0.9"``) as its number: `pulumi config set --path K 0.9` stores a decimal as
    text (pulumi/pulumi sdk/go/common/resource/config/map.go adjustObjectValue types only true/false and
    integers). Anything else is handed on unchanged, for StrictFloat to judge (a boolean stays refused)."""
    if isinstance(value, str) and _is_number_text(value):
        return float(value.strip())
    return value


ConfigFloat = Annotated[StrictFloat, BeforeValidator(_decimal_as_pulumi_writes_it)]
"""A decimal config value: a YAML number or decimal text (what `pulumi config set --path` writes); not a boolean."""


class _Raw(BaseModel):
    # Booleans are StrictBool everywhere: true or false, as Pulumi's config reads them (Config.get_bool:
    # true/True/false/False at the top level, where config.reader decodes the text; JSON booleans
    # inside a map): `yes`, `on`, `1` are refused by every key alike, never taken by one and refused
    # by another. Whole numbers likewise (StrictInt): a quoted `"8000"` inside a map is text and refused.
    # Decimals are ConfigFloat: a number, or the decimal text that `pulumi config set --path K 0.9` writes
    # (only true/false and integers become typed there), never a boolean. No coercion of numbers to strings:
    # `revision: 1234` is an error, not "1234" (the engine hands top-level values as strings already;
    # config.reader decodes them by type). Each field's
    # docstring is its description (``use_attribute_docstrings``): the configuration reference
    # (docs/configuration.md, scripts/dev/config_reference.py) prints it.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True)


def _derived(rule: str) -> dict[str, Any]:
    """``json_schema_extra`` of a field whose value, when unset, is computed: ``rule`` says from
    what (the configuration reference shows ``derived: <rule>`` as its default)."""
    return {"derived": rule}


class ModelConfig(_Raw):
    """``kimi-deploy:model``: which checkpoint, from where, at which revision."""

    profile: str = "kimi-k3.1-pro"
    """The model profile: hub repositories, weight size, context length and serving recipe (components/core/model.py)."""
    source: Literal["huggingface", "modelscope"] = "huggingface"
    """The hub the weights come from: huggingface, or modelscope (for networks inside China)."""
    revision: str = "main"
    """The hub revision: a 40-hex commit; a branch or tag only in a trial (the weight sync records the commit it resolved)."""
    license_acknowledged: StrictBool | None = Field(None, alias="licenseAcknowledged")
    """Must be true: you accept the model's license (README "License of the model")."""
    served_model_name: str | None = Field(None, alias="servedModelName", json_schema_extra=_derived("the model profile's name"))
    """The name clients send as `model` (vLLM `--served-model-name`)."""


class CapacityConfig(_Raw):
    """``kimi-deploy:compute.capacity``: where the GPU capacity comes from."""

    type: Literal["on-demand", "odcr", "capacity-block"] = "on-demand"
    """How the GPU instances are bought: on-demand, a targeted on-demand capacity reservation (odcr), or an EC2 capacity block."""
    reservation_id: str | None = Field(None, alias="reservationId")
    """The capacity reservation (ODCR or capacity block) the GPU nodes launch into (cr-...)."""
    availability_zone: str | None = Field(None, alias="availabilityZone")
    """The reservation's availability zone (or Local Zone): GPU subnets and FSx are pinned to it."""
    ends_at: datetime | None = Field(None, alias="endsAt")
    """When the capacity block ends (ISO 8601; no zone means UTC): AWS terminates its instances shortly before (capacity.py)."""
    usd_per_hour: ConfigFloat | None = Field(None, alias="usdPerHour", gt=0, le=MAX_USD_PER_NODE_HOUR)
    """The capacity block's price per instance-hour, USD (no public price exists for some blocks): the plan and cost
    reports use it."""
    block_instances: StrictInt | None = Field(
        None, alias="blockInstances", ge=1, le=MAX_CAPACITY_BLOCK_INSTANCES,
        json_schema_extra=_derived("the smallest UltraServer of the instance type that holds the GPU nodes"),
    )
    """Instances (trays) in an UltraServer capacity block as bought: the whole block is billed."""


class WeightsRetryConfig(_Raw):
    """``kimi-deploy:compute.weightsRetry`` (``aws-ec2``): the boot's weights unit is tried
    ``attempts`` times (systemd ``StartLimitBurst``), ``delaySeconds`` apart (``RestartSec``),
    then stays failed until ``systemctl reset-failed`` (docs/operations.md, "When the EC2 boot fails")."""

    attempts: StrictInt = Field(3, ge=1, le=20)
    """Attempts of the weights unit before it stays failed (systemd StartLimitBurst)."""
    delay_seconds: StrictInt = Field(120, alias="delaySeconds", ge=1, le=3600)
    """Seconds between attempts of the weights unit (systemd RestartSec)."""


class ComputeConfig(_Raw):
    """``kimi-deploy:compute``: GPU nodes."""

    instance_type: str | None = Field(
        None, alias="instanceType", json_schema_extra=_derived("the target's instance type on the platform (targets.py)")
    )
    """The GPU nodes' instance type; it must have the target's GPU model, GPU count and GPU memory."""
    availability_zone: str | None = Field(
        None, alias="availabilityZone",
        json_schema_extra=_derived("compute.capacity.availabilityZone, else the region's first AZ that offers the instance type"),
    )
    """The availability zone of the GPU nodes (and FSx)."""
    replicas: StrictInt = Field(1, ge=1, le=64)
    """Model copies (one vLLM server or LeaderWorkerSet group each); with autoscaling, the initial count."""
    efa: StrictBool | None = None
    """EFA interfaces on the GPU nodes and in the vLLM pods; unset means false. Needs a vllm.image with libfabric's EFA
    provider and aws-ofi-nccl."""
    capacity: CapacityConfig = CapacityConfig()
    """Where the GPU capacity comes from."""
    root_volume_gib: StrictInt = Field(
        500, alias="rootVolumeGib", ge=100, le=16_384,
        json_schema_extra=_derived("500; aws-eks GPU nodes with instance-store NVMe: 100 (containerd and kubelet use the RAID0)"),
    )
    """Size of the GPU nodes' encrypted gp3 root volume, GiB (OS and the vLLM image)."""
    ami_id: str | None = Field(
        None, alias="amiId", json_schema_extra=_derived(
            "aws-ec2: the Deep Learning AMI from its public SSM parameter, pinned at creation; aws-eks: EKS's NVIDIA AMI type"
        ),
    )
    """A custom AMI for the GPU nodes (ami-...); needs compute.amiArchitecture."""
    ami_architecture: Literal["x86_64", "arm64"] | None = Field(None, alias="amiArchitecture")
    """The CPU architecture of compute.amiId; it must match the instance type's."""
    usd_per_hour: ConfigFloat | None = Field(
        None, alias="usdPerHour", gt=0, le=MAX_USD_PER_NODE_HOUR,
        json_schema_extra=_derived("compute.capacity.usdPerHour, else the on-demand list price (targets.py), else unknown"),
    )
    """Price per GPU node-hour, USD, for the plan and cost reports (where no public price exists: GB300 blocks, MI355X)."""
    weights_retry: WeightsRetryConfig = Field(WeightsRetryConfig(), alias="weightsRetry")
    """aws-ec2: how often the boot's weights unit is tried, and how far apart."""


class NetworkConfig(_Raw):
    """``kimi-deploy:network``: VPC, subnets and who may reach the API port."""

    vpc_id: str | None = Field(None, alias="vpcId")
    """An existing VPC to use instead of creating one (with network.privateSubnetIds)."""
    private_subnet_ids: tuple[str, ...] = Field((), alias="privateSubnetIds")
    """The existing VPC's private subnets for the nodes (required with network.vpcId)."""
    vpc_cidr: str = Field("10.42.0.0/16", alias="vpcCidr")
    """The address range of the VPC the stack creates (subnets are a sixteenth of it)."""
    allowed_cidrs: tuple[str, ...] = Field((), alias="allowedCidrs")
    """Client networks admitted to the vLLM API port (security group; on EKS also the NetworkPolicy)."""
    allowed_security_group_ids: tuple[str, ...] = Field((), alias="allowedSecurityGroupIds")
    """Security groups whose members are admitted to the vLLM API port."""
    s3_gateway_endpoint: StrictBool = Field(True, alias="s3GatewayEndpoint")
    """Create an S3 gateway endpoint on the private route tables; set false in an existing VPC that already routes S3
    through one (a second one fails)."""
    api_server_access: Literal["public-cidrs", "private"] | None = Field(
        None, alias="apiServerAccess", json_schema_extra=_derived("public-cidrs (aws-eks)")
    )
    """aws-eks: how `pulumi up` (and preview, destroy, the sweeper) reach the cluster's Kubernetes API: public-cidrs (the
    public endpoint, IAM-authenticated, from network.apiServerPublicCidrs only) or private (no public endpoint; an
    existing VPC, network.vpcId, that the deploying machine reaches, admitted by network.apiServerPrivateCidrs or
    apiServerPrivateSecurityGroupIds). docs/aws.md, "How pulumi reaches the cluster"."""
    api_server_public_cidrs: tuple[str, ...] = Field((), alias="apiServerPublicCidrs")
    """aws-eks: the public addresses admitted to the public EKS API endpoint: this machine's egress (curl
    https://checkip.amazonaws.com) and your CI runners' (required with apiServerAccess public-cidrs; at most 40, no
    reserved ranges)."""
    api_server_private_cidrs: tuple[str, ...] = Field((), alias="apiServerPrivateCidrs")
    """aws-eks: addresses admitted on port 443 of the cluster security group (the private endpoint): a VPN, a peered or
    transit-gateway network, the subnet of a runner inside the VPC."""
    api_server_private_security_group_ids: tuple[str, ...] = Field((), alias="apiServerPrivateSecurityGroupIds")
    """aws-eks: security groups (of a CI runner or bastion in the VPC) admitted on port 443 of the cluster security
    group."""


class MirrorConfig(_Raw):
    """``kimi-deploy:storage.mirror``: the in-region S3 mirror of the checkpoint."""

    enabled: StrictBool = True
    """Keep an in-region S3 mirror of the checkpoint: the hub is read once, nodes copy from the mirror."""
    bucket_name: str | None = Field(
        None, alias="bucketName", json_schema_extra=_derived("a name Pulumi generates for the created bucket")
    )
    """The mirror bucket's name: the bucket to create, or (with create false) the existing mirror to use."""
    create: StrictBool = True
    """Create the mirror bucket in this stack (retained on `pulumi destroy`); false reuses the one named by bucketName."""
    prefix: str = "models"
    """Key prefix of the checkpoints in the bucket: s3://<bucket>/<prefix>/<repo>/<revision>/."""
    endpoint_url: str | None = Field(None, alias="endpointUrl")
    """Kubernetes platforms: an S3-compatible endpoint the weight sync and engine cache use for the mirror
    (AWS_ENDPOINT_URL_S3)."""
    region: str | None = None
    """kubernetes platform: the AWS region of the existing mirror bucket (AWS_REGION of the pods that publish to or read
    it); required there with a mirror. The AWS platforms use aws:region."""


class FsxConfig(_Raw):
    """``kimi-deploy:storage.fsx``: FSx for Lustre settings (used when storage.kind needs FSx)."""

    deployment_type: str = Field("PERSISTENT_2", alias="deploymentType")
    """The FSx for Lustre deployment type."""
    throughput_per_tib: StrictInt = Field(
        1000, alias="throughputPerTib", ge=FSX_THROUGHPUT_PER_TIB_RANGE[0], le=FSX_THROUGHPUT_PER_TIB_RANGE[1]
    )
    """Throughput tier, MB/s per TiB of storage: the file system serves capacity x tier."""
    capacity_gib: StrictInt | None = Field(
        None, alias="capacityGib", ge=FSX_STORAGE_CAPACITY_GIB_RANGE[0], le=FSX_STORAGE_CAPACITY_GIB_RANGE[1],
        json_schema_extra=_derived("the weights plus storage.fsx.headroomFraction, rounded up to a valid size"),
    )
    """Storage capacity of the file system, GiB."""
    headroom_fraction: ConfigFloat = Field(0.10, alias="headroomFraction", ge=0, le=2)
    """Room above the weights when the capacity is derived (0.10 = 10%)."""
    efa: StrictBool = False
    """An EFA-enabled file system (PERSISTENT_2 only; set at creation)."""
    metadata_iops: StrictInt | None = Field(
        None, alias="metadataIops", ge=FSX_METADATA_IOPS_RANGE[0], le=FSX_METADATA_IOPS_RANGE[1],
        json_schema_extra=_derived("AUTOMATIC metadata mode (FSx sizes it to the capacity)"),
    )
    """Provisioned metadata IOPS (USER_PROVISIONED mode, paid; PERSISTENT_2 only)."""
    import_wait_seconds: StrictInt = Field(
        IMPORT_WAIT_SECONDS, alias="importWaitSeconds", ge=0, le=MAX_IMPORT_WAIT_SECONDS
    )
    """Seconds a node copy waits for the S3 import to produce a listed file (nvme-from-fsx)."""


class StorageConfig(_Raw):
    """``kimi-deploy:storage``: where the weights live while being served."""

    kind: Literal["nvme", "fsx", "nvme-from-fsx", "pvc"] = "nvme"
    """Where vLLM reads the weights: nvme (the node's instance-store RAID0, synced from the mirror or hub), fsx (FSx for
    Lustre, imported from the mirror), nvme-from-fsx (FSx imports once, each node copies to its NVMe), pvc (an existing
    PersistentVolumeClaim)."""
    read_gbps: ConfigFloat | None = Field(
        None, alias="readGBps", gt=0, le=MAX_MEASURED_GBPS,
        json_schema_extra=_derived("an estimate for storage.kind (labelled so in the plan)"),
    )
    """Measured read bandwidth of the weights' storage on one node, GB/s (fio): replaces the estimate behind load times and
    the startup budget."""
    existing_claim: str | None = Field(None, alias="existingClaim")
    """The PersistentVolumeClaim holding the weights (storage.kind pvc)."""
    mirror: MirrorConfig = MirrorConfig()
    """The in-region S3 mirror of the checkpoint."""
    fsx: FsxConfig = FsxConfig()
    """FSx for Lustre settings."""


class VllmConfig(_Raw):
    """``kimi-deploy:vllm``: serving options layered on the recipe."""

    image_tag: str | None = Field(None, alias="imageTag", json_schema_extra=_derived("the pinned vLLM release (versions.py)"))
    """A tag of the vLLM image of the target's family (vllm/vllm-openai or vllm/vllm-openai-rocm)."""
    image: str | None = Field(None, json_schema_extra=_derived("the image of the target's family at vllm.imageTag"))
    """The vLLM image, pinned immutably: name:nightly-<40-hex commit> or name@sha256:<digest>; required on a target
    whose pinned release does not serve the model (ROCm: no release wires K3.1's DSA there yet)."""
    port: StrictInt = Field(VLLM_PORT, ge=1024, le=65535)
    """The vLLM API port (also /health and /metrics)."""
    decode_context_parallel_size: StrictInt = Field(
        1, alias="decodeContextParallelSize", ge=1, le=MAX_DECODE_CONTEXT_PARALLEL_SIZE
    )
    """Decode context parallelism (DCP): 1 is plain tensor parallel; more holds more KV-cache tokens for slower decode (the
    plan shows both)."""
    max_model_len: int | None = Field(
        None, alias="maxModelLen", ge=1024, le=MAX_MODEL_LEN_TOKENS, json_schema_extra=_derived("the model's context length")
    )
    """The longest request context served, tokens (vLLM --max-model-len)."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None = Field(
        None, alias="kvCacheDtype", json_schema_extra=_derived("the recipe's (fp8 on CUDA, auto on ROCm)")
    )
    """The KV-cache data type (vLLM --kv-cache-dtype)."""
    indexer_cache_dtype: Literal["fp8", "mxfp4"] = Field("fp8", alias="indexerCacheDtype")
    """The DSA indexer's key cache: fp8 (132 B per token and DSA layer) or mxfp4 (68 B; NVIDIA SM10x GPUs only), merged into
    the recipe's --attention-config as indexer_kv_dtype; the plan's KV figure follows it."""
    kv_cache_tokens: StrictInt | None = Field(
        None, alias="kvCacheTokens", ge=1, le=MAX_KV_CACHE_TOKENS,
        json_schema_extra=_derived("an estimate from the engine's cache layout (labelled so in the plan)"),
    )
    """Measured KV-cache capacity of one model copy, tokens: the N of vLLM's startup log line "GPU KV cache size: N
    tokens" at this stack's parallelism and maxModelLen; replaces the estimate in the plan."""
    gpu_memory_utilization: ConfigFloat | None = Field(
        None, alias="gpuMemoryUtilization", gt=0.5, le=0.99,
        json_schema_extra=_derived("unset: vLLM 0.34.0 sizes the KV cache from memory measured after warm-up (1.0)"),
    )
    """Share of each GPU's memory vLLM may use (vLLM --gpu-memory-utilization, rendered only when set): only for a GPU
    shared with processes vLLM does not measure; a lower value takes memory from the KV cache."""
    enable_prefix_caching: StrictBool = Field(True, alias="enablePrefixCaching")
    """Reuse the KV cache of shared prompt prefixes (vLLM --enable-prefix-caching)."""
    extra_args: tuple[str, ...] = Field((), alias="extraArgs")
    """More vLLM arguments after the recipe's; flags the toolkit owns (--port, --model, ...) are refused."""


class MirrorSecretConfig(_Raw):
    """``kimi-deploy:kubernetes.mirrorCredentials.secret``: a Secret (in kubernetes.namespace) holding the keys."""

    name: str
    """The Secret's name; the pods read its keys through secretKeyRef (the values never enter the stack)."""
    access_key_id_key: str = Field("AWS_ACCESS_KEY_ID", alias="accessKeyIdKey")
    """The Secret's key holding the access key id."""
    secret_access_key_key: str = Field("AWS_SECRET_ACCESS_KEY", alias="secretAccessKeyKey")
    """The Secret's key holding the secret access key."""
    session_token_key: str | None = Field(None, alias="sessionTokenKey")
    """The Secret's key holding a session token (temporary credentials), if any."""


class MirrorCredentialsConfig(_Raw):
    """``kimi-deploy:kubernetes.mirrorCredentials``: how the pods that publish to or read the S3 mirror get AWS
    credentials on the kubernetes platform (exactly one of the three)."""

    secret: MirrorSecretConfig | None = None
    """Access keys from a Secret of the namespace (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN])."""
    service_account_annotations: dict[str, str] = Field(default_factory=dict, alias="serviceAccountAnnotations")
    """The cluster's workload identity: annotations put on the stack's weight-sync and mirror-publish service accounts
    (e.g. IRSA's eks.amazonaws.com/role-arn: arn:aws:iam::123456789012:role/NAME)."""
    service_account_name: str | None = Field(None, alias="serviceAccountName")
    """A service account of the namespace, bound to an identity outside this stack, that the pods touching the mirror
    run as."""


class KubernetesConfig(_Raw):
    """``kimi-deploy:kubernetes``: the workload side (EKS or an existing cluster)."""

    namespace: str = "kimi"
    """The namespace of the workloads (aws-eks, kubernetes); the stack creates it and deletes it on destroy, so not one the
    cluster owns (default, kube-*) nor observability.prometheusNamespace / grafanaNamespace."""
    installed_addons: tuple[str, ...] = Field((), alias="installedAddons")
    """Cluster software already installed, so it is not installed again (device plugins, LWS, KEDA, exporters, operators)."""
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    """Labels of the GPU nodes the vLLM pods must run on (added to the platform's own)."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """Tolerations of the GPU pods (Kubernetes Toleration objects), for the GPU nodes' taints."""
    service_type: Literal["ClusterIP", "internal-nlb"] = Field("ClusterIP", alias="serviceType")
    """How the API is exposed: ClusterIP (inside the cluster), or an internal Network Load Balancer (aws-eks)."""
    allowed_namespaces: tuple[str, ...] = Field((), alias="allowedNamespaces")
    """Namespaces whose pods the NetworkPolicy admits to the API port."""
    allowed_cidrs: tuple[str, ...] = Field((), alias="allowedCidrs")
    """Address ranges the NetworkPolicy admits to the API port."""
    cluster_cidrs: tuple[str, ...] = Field((), alias="clusterCidrs")
    """kubernetes platform: the ranges the cluster's pods and nodes take addresses from; the NetworkPolicy excludes them
    from allowedCidrs (an ipBlock admits every pod whose address it covers). On aws-eks the stack knows its node
    subnets."""
    nvme_host_path: str = Field("/mnt/k8s-disks/0", alias="nvmeHostPath")
    """kubernetes platform: where the GPU node's NVMe is mounted; pods mount only the kimi-deploy directories below it
    (aws-eks uses its own mount)."""
    context: str | None = None
    """kubernetes platform: the kubeconfig context to use (default: the kubeconfig's current context)."""
    mirror_credentials: MirrorCredentialsConfig | None = Field(None, alias="mirrorCredentials")
    """kubernetes platform: the AWS credentials of the pods that publish to or read an existing S3 mirror (a Secret, or
    the cluster's workload identity); required there with a mirror. The AWS platforms use EKS Pod Identity."""
    admin_role_arns: tuple[str, ...] = Field((), alias="adminRoleArns")
    """aws-eks: IAM roles or users granted cluster admin (EKS access entries), besides the creator."""
    eks_version: str | None = Field(None, alias="eksVersion", json_schema_extra=_derived("versions.EKS_VERSION"))
    """aws-eks: the EKS (Kubernetes minor) version of the cluster."""
    eks_support_type: Literal["STANDARD", "EXTENDED"] = Field("STANDARD", alias="eksSupportType")
    """aws-eks: the upgrade policy: STANDARD (upgraded by EKS at the end of standard support) or EXTENDED (stays, billed at
    the extended-support rate past it)."""


class ScheduleWindowConfig(_Raw):
    """``kimi-deploy:autoscaling.schedule[i]``: a serving window as two cron expressions (KEDA's
    cron scaler: ``start``/``end`` in ``timezone``). Outside every window the stack may scale to
    zero (``autoscaling.minReplicas: 0``)."""

    start: str
    """When the window opens: a 5-field cron expression (minute hour day-of-month month day-of-week)."""
    end: str
    """When the window closes: a 5-field cron expression."""
    timezone: str = "UTC"
    """The IANA time zone of start and end (UTC, Europe/Berlin, ...)."""


class AutoscalingConfig(_Raw):
    """``kimi-deploy:autoscaling``: replicas that follow vLLM's queue and KV-cache usage."""

    enabled: StrictBool = False
    """Scale replicas on vLLM's queue and KV-cache usage (aws-eks, kubernetes); needs a Prometheus (observability)."""
    min_replicas: StrictInt = Field(1, alias="minReplicas", ge=0, le=64)
    """The fewest replicas; 0 needs autoscaling.schedule (nothing sees demand with no replica)."""
    max_replicas: StrictInt | None = Field(None, alias="maxReplicas", ge=1, le=64, json_schema_extra=_derived("compute.replicas"))
    """The most replicas (a reservation must hold maxReplicas x nodes per copy)."""
    controller: Literal["keda", "hpa"] = "keda"
    """keda: a KEDA ScaledObject (KEDA installed unless listed in installedAddons); hpa: an autoscaling/v2 HPA on external
    metrics from an installed prometheus-adapter."""
    schedule: tuple[ScheduleWindowConfig, ...] = ()
    """Serving windows (KEDA cron triggers): at least compute.replicas replicas inside them."""
    queue_per_replica: ConfigFloat = Field(4.0, alias="queuePerReplica", gt=0, le=10_000)
    """Waiting requests per replica the scaler aims at (vllm:num_requests_waiting)."""
    kv_cache_usage_target: ConfigFloat = Field(0.8, alias="kvCacheUsageTarget", gt=0, le=1)
    """KV-cache usage per replica the scaler aims at (vllm:kv_cache_usage_perc, 0-1)."""
    scale_down_delay_seconds: StrictInt | None = Field(
        None, alias="scaleDownDelaySeconds", ge=60, le=86_400,
        json_schema_extra=_derived("the modelled scale-up time plus a margin (scaling.py)"),
    )
    """How long demand must stay low before a replica is removed, seconds; more than a scale-up takes."""


class ObservabilityConfig(_Raw):
    """``kimi-deploy:observability``: where Prometheus and Grafana run, dashboards and alerts."""

    prometheus_namespace: str | None = Field(None, alias="prometheusNamespace")
    """The namespace of the Prometheus that scrapes vLLM (admitted to /metrics) and answers the scaler."""
    prometheus_url: str | None = Field(None, alias="prometheusUrl")
    """The URL of a Prometheus that reads prometheus.io/* pod annotations, for the scaler (instead of the operator's
    prometheus-operated)."""
    grafana_namespace: str | None = Field(None, alias="grafanaNamespace")
    """Where the dashboard ConfigMap goes (labelled grafana_dashboard for the Grafana sidecar)."""
    alerts: StrictBool = True
    """A PrometheusRule with the stack's alerts (when prometheus-operator is in kubernetes.installedAddons)."""
    gpu_exporter: StrictBool = Field(True, alias="gpuExporter")
    """Install the GPU vendor's metrics exporter (DCGM or AMD) when a Prometheus or Grafana namespace is set."""
    prometheus_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}, alias="prometheusPodLabels"
    )
    """Labels of the Prometheus pods the NetworkPolicy admits to the metrics port (the Prometheus Operator's label its pods
    so)."""
    monitor_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"}, alias="monitorLabels"
    )
    """Labels the Prometheus selects PodMonitors, ServiceMonitors and PrometheusRules by (kube-prometheus-stack:
    release=<its Helm release>; {} for one that selects all)."""
    queue_alert_minutes: StrictInt = Field(10, alias="queueAlertMinutes", ge=1, le=1440)
    """Minutes the request queue must grow before KimiVllmQueueGrowing fires."""
    kv_cache_alert_fraction: ConfigFloat = Field(0.95, alias="kvCacheAlertFraction", gt=0, le=1)
    """KV-cache usage (0-1) above which KimiVllmKvCacheNearFull fires."""


class TimeToReadyConfig(_Raw):
    """``kimi-deploy:timeToReady``: measured figures that replace the estimates of
    ``time_to_ready.py`` (each optional; seconds up to ``MAX_MEASURED_PHASE_SECONDS``, GB/s up to
    ``MAX_MEASURED_GBPS``, all > 0)."""

    infrastructure_seconds: ConfigFloat | None = Field(
        None, alias="infrastructureSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS
    )
    """Measured seconds from `pulumi up` to the GPU instance requested (VPC, cluster, node group)."""
    instance_boot_seconds: ConfigFloat | None = Field(None, alias="instanceBootSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS)
    """Measured seconds from instance launch to the node ready for work."""
    image_pull_seconds: ConfigFloat | None = Field(None, alias="imagePullSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS)
    """Measured seconds to pull the vLLM image."""
    hub_download_gbps: ConfigFloat | None = Field(None, alias="hubDownloadGBps", gt=0, le=MAX_MEASURED_GBPS)
    """Measured rate of the hub download (`hf download` of the checkpoint from the hub), GB/s; replaces both ends of the
    public range (time_inputs.HUB_DOWNLOAD_*)."""
    copy_gbps: ConfigFloat | None = Field(None, alias="copyGBps", gt=0, le=MAX_MEASURED_GBPS)
    """Measured rate of the weight copy from the mirror onto a node's NVMe, GB/s."""
    engine_init_seconds: ConfigFloat | None = Field(None, alias="engineInitSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS)
    """Measured seconds of a cold engine start after the weights load (compilation, CUDA graphs); also sets the startup budget."""
    engine_init_cached_seconds: ConfigFloat | None = Field(
        None, alias="engineInitCachedSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS
    )
    """Measured seconds of an engine start with the engine cache restored."""
    stager_boot_seconds: ConfigFloat | None = Field(None, alias="stagerBootSeconds", gt=0, le=MAX_MEASURED_PHASE_SECONDS)
    """aws-ec2, phase stage: measured seconds from the stager instance's launch to its publish starting."""


class RawConfig(_Raw):
    """The whole ``kimi-deploy:*`` namespace of a stack (secrets excluded)."""

    target: str
    """The hardware profile: GPU model, GPUs per node, nodes per model copy (components/core/targets.py)."""
    platform: str
    """Where it runs: aws-ec2 (one EC2 instance, vLLM under systemd), aws-eks (a new EKS cluster) or kubernetes (an
    existing cluster, through the kubeconfig secret)."""
    environment: str
    """trial, staging or prod: how long the stack lives and what guards its data (prod: protected, no expiry, a commit-
    pinned model)."""
    owner: str
    """The owning team or person: an AWS tag and Kubernetes label on everything; the sweeper reports by it."""
    region: str | None = None
    """The AWS region, read from aws:region (not a kimi-deploy key)."""
    expires_at: datetime | None = Field(
        None, alias="expiresAt",
        json_schema_extra=_derived("a trial: trialTtlHours after its first `pulumi up` (fixed then); staging and prod: none"),
    )
    """When the stack expires (ISO 8601; no zone means UTC): tagged expires-at for the sweeper; not on prod."""
    trial_ttl_hours: StrictInt = Field(DEFAULT_TRIAL_TTL_HOURS, alias="trialTtlHours", ge=1, le=24 * 30)
    """A trial's time to live without expiresAt, hours from its first `pulumi up` (the expiry is fixed then)."""
    protect: StrictBool | None = Field(None, json_schema_extra=_derived("true in prod, else false"))
    """Protect the resources holding data (mirror bucket, file system) from deletion."""
    phase: Literal["stage", "serve"] = "serve"
    """stage: create everything the weights need (network, S3 mirror, storage, the hub -> mirror publish on compute
    with no GPU) and nothing that needs a GPU; serve: the whole deployment (config/phase.py)."""
    model: ModelConfig = ModelConfig()
    """Which checkpoint, from where, at which revision."""
    compute: ComputeConfig = ComputeConfig()
    """The GPU nodes."""
    network: NetworkConfig = NetworkConfig()
    """VPC, subnets and who may reach the API port."""
    storage: StorageConfig = StorageConfig()
    """Where the weights live while being served."""
    vllm: VllmConfig = VllmConfig()
    """Serving options layered on the recipe."""
    kubernetes: KubernetesConfig = KubernetesConfig()
    """The workload side (EKS or an existing cluster)."""
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    """Replicas that follow vLLM's queue and KV-cache usage."""
    observability: ObservabilityConfig = ObservabilityConfig()
    """Where Prometheus and Grafana run, dashboards and alerts."""
    time_to_ready: TimeToReadyConfig = Field(TimeToReadyConfig(), alias="timeToReady")
    """Measured figures that replace the time-to-ready estimates."""
    prices: dict[str, Annotated[ConfigFloat, Field(ge=0, le=MAX_PRICE_OVERRIDE_USD)]] = Field(default_factory=dict)
    """USD per unit for entries of the price table (components/core/prices.py), replacing its list price: e.g.
    {natGatewayHour: 0.048} for another region or a negotiated rate. The GPU price is compute.usdPerHour."""


def validate_raw(config: Mapping[str, Any]) -> tuple[RawConfig, dict[str, Any]]:
    """The raw model of a ``kimi-deploy`` namespace map, and the map without secret keys.

    Raises:
        ConfigError: pydantic's first error, as one line naming the full key.
    """
    plain = {k: v for k, v in config.items() if k not in SECRET_KEYS}
    try:
        raw = RawConfig.model_validate(plain)
    except ValidationError as err:
        raise _pydantic_error(err, plain) from None
    return raw, plain


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _pydantic_error(err: ValidationError, raw: Mapping[str, Any]) -> ConfigError:
    """The first pydantic error as a one-line ConfigError naming the full key."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    key = _fmt_loc(loc)
    value: Any = raw
    for part in loc:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and isinstance(part, int) and part < len(value):
            value = value[part]
        else:
            value = first.get("input")
            break
    kind = first["type"]
    if kind == "extra_forbidden":
        from ..errors import did_you_mean

        if key in REPLACED_KEYS:
            return ConfigError(key, value, REPLACED_KEYS[key])

        siblings = _model_keys_at(loc[:-1])
        hint = did_you_mean(str(loc[-1]), siblings) or (f" (keys: {', '.join(siblings)})" if siblings else "")
        # Never the value: a token under a misspelt key would be printed (errors.UNKNOWN_KEY_VALUE).
        return ConfigError(key, UNKNOWN_KEY_VALUE, "is not a known key" + hint)
    if kind in ("model_type", "dict_type"):
        keys = _model_keys_at(loc)
        return ConfigError(key, value, "is not a map" + (f" (keys: {', '.join(keys)})" if keys else " (write its keys under it)"))
    if kind == "string_type" and isinstance(value, (int, float)):
        what = "a boolean" if isinstance(value, bool) else "a number"
        if isinstance(value, float):
            # YAML read the digits as a number and dropped what a number does not keep: `1.30` is 1.3, so
            # quoting the value read back ('1.3') would name another version.
            return ConfigError(key, value, f"is {what} as YAML reads it (trailing zeros dropped), not a string: quote it "
                                           f"in the stack file exactly as meant (e.g. '{value}0' if you wrote {value}0)")
        return ConfigError(key, value, f"is {what}, not a string: quote it in the stack file ('{value}')")
    if kind == "missing":
        return ConfigError(key, None, "is required")
    if kind == "literal_error":
        expected = first.get("ctx", {}).get("expected", "")
        return ConfigError(key, value, f"is not allowed (allowed: {expected})")
    if isinstance(value, str) and (
            (kind in ("int_type", "int_parsing") and value.strip().lstrip("+-").isdigit())
            or (kind in ("bool_type", "bool_parsing") and value.strip() in ("true", "false"))):
        # `"8000"` / `"true"` in quotes: YAML text, which the map hands the program as a string (`pulumi config
        # set --path` writes integers and true/false typed, so only a hand-quoted value reaches here; a decimal
        # as text is what it writes, and ConfigFloat takes it).
        what = "a whole number" if kind.startswith("int") else "a boolean (allowed: true, false)"
        return ConfigError(key, value, f"is not {what}: it is quoted, so YAML reads it as text; write {value.strip()} "
                                       "without quotes")
    if kind in ("int_type", "int_from_float") and isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        # YAML reads `1e9` (and `1000.0`) as a float: a whole number in float notation.
        return ConfigError(key, value, f"is a whole number written as a float (YAML reads exponent notation and a "
                                       f"'.0' so): write its digits, {int(value)}")
    if kind in _TYPE_WORDS:
        return ConfigError(key, value, _TYPE_WORDS[kind])
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ConfigError(key, value, f"is out of range (allowed: {range_text(_field_at(loc), first.get('ctx', {}))})")
    return ConfigError(key, value, f"is not valid: {first['msg'].lower()}")


def _is_number_text(text: str) -> bool:
    """Whether ``text`` is a finite decimal number as written in YAML (``0.9``, ``-1e3``, ``4``)."""
    try:
        number = float(text.strip())
    except ValueError:
        return False
    return number == number and abs(number) != float("inf")


# Keys a release replaced: the error names what took their place instead of "not a known key".
REPLACED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "network.apiServerPrivateOnly": "was replaced by network.apiServerAccess: public-cidrs (with "
        "network.apiServerPublicCidrs) or private (with network.vpcId and network.apiServerPrivateCidrs); "
        'docs/aws.md, "How pulumi reaches the cluster"',
    }
)


# pydantic error types -> the project's wording (one line: what the value is not, what to write).
_ISO_TIME = "is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)"
_TYPE_WORDS: dict[str, str] = {
    "tuple_type": "is not a list (write one item per line, each starting with '- ')",
    "list_type": "is not a list (write one item per line, each starting with '- ')",
    "string_type": "is not a string",
    "int_type": "is not a whole number",
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "float_parsing": "is not a number",
    "bool_type": "is not a boolean (allowed: true, false)",
    "bool_parsing": "is not a boolean (allowed: true, false)",
    "datetime_type": _ISO_TIME,
    "datetime_parsing": _ISO_TIME,
    "datetime_from_date_parsing": _ISO_TIME,
}


def _field_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic ``FieldInfo`` at location ``loc`` in ``RawConfig`` (list indexes skipped), or None."""
    model: Any = RawConfig
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        info = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if info is None:
            return None
        candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return info


def range_text(info: Any, ctx: Mapping[str, Any] | None = None) -> str:
    """A field's bounds as words: ``1 to 720``, ``more than 0 and at most 2``; from its
    ``Field(ge=..., le=...)`` metadata (else from the one bound pydantic reported in ``ctx``);
    ``""`` for a field without bounds. The range errors and the configuration reference use it."""
    bounds: dict[str, Any] = {}
    for meta in getattr(info, "metadata", ()) or ():
        for name in ("gt", "ge", "lt", "le"):
            if getattr(meta, name, None) is not None:
                bounds[name] = getattr(meta, name)
    if not bounds and ctx:
        bounds = {name: ctx[name] for name in ("gt", "ge", "lt", "le") if name in ctx}
    if "ge" in bounds and "le" in bounds:
        return f"{bounds['ge']} to {bounds['le']}"
    words = {"gt": "more than", "ge": "at least", "lt": "less than", "le": "at most"}
    return " and ".join(f"{words[name]} {bounds[name]}" for name in ("gt", "ge", "lt", "le") if name in bounds)


def _model_keys_at(loc: tuple[Any, ...]) -> list[str]:
    """Config keys (aliases) of the model at pydantic location ``loc`` in ``RawConfig``, sorted."""
    model: Any = RawConfig
    for part in loc:
        info = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None) if isinstance(part, str) else None
        if info is None:
            if isinstance(part, int):
                continue
            return []
        candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(f.alias or n for n, f in model.model_fields.items() if n != "region" or model is not RawConfig)
