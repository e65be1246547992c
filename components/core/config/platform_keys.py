"""Which platform reads which config key: one table, one rule, applied to every key a stack sets.

A key the stack's platform never reads (an EC2 boot setting on a Kubernetes cluster, an EKS
endpoint setting on EC2, FSx settings without FSx) changes nothing on that platform, so a user
who sets it believes something that is not true. ``check_platform_keys`` walks every key the stack
file sets explicitly (pydantic's ``model_fields_set``, at every depth) to a value other than its
default (unset, null, empty and default values change nothing anywhere: ``serviceType: ClusterIP``
copied into an EC2 stack misleads no one) and refuses the first one no rule of ``KEY_READERS`` lets the
platform read, naming the platforms that do. A key without a rule is read on every platform.

Readers are named by ``PlatformProfile`` fields (components/core/platforms.py), not by platform
names, so a new platform gets the answer its profile gives; the message lists the platforms of
``PLATFORM_PROFILES`` whose profile has them. tests/test_platform_keys.py sets every key of the
model on a stack of every platform and holds each against this table; the sources of each row are
the modules that read the key (named in ``what``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from ..errors import ConfigError
from ..platforms import PLATFORM_PROFILES, PlatformProfile
from .raw import RawConfig

# A rule with no value applies to every value of its key.
ANY_VALUE: Any = object()


@dataclass(frozen=True)
class KeyReaders:
    """The platforms that read a key (or one value of it), and the settings it is read with.

    Attributes:
        key: a camelCase config key (``compute.weightsRetry.attempts``) or a section
            (``compute.capacity``: every key below it).
        reads: ``PlatformProfile`` boolean fields; a platform reads the key when all are true.
        what: what reads it there (the module or resource), for the message.
        value: the one value the rule is about (``internal-nlb``), or ``ANY_VALUE``; a tuple holds
            several values.
        when: read only while another key has one of some values: ``(("storage.kind", ("fsx",
            "nvme-from-fsx")),)`` (FSx settings without FSx are read by nothing).
        instead: what to do instead (default: remove it).
    """

    key: str
    reads: tuple[str, ...]
    what: str
    value: Any = ANY_VALUE
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    instead: str = "remove it"

    def platforms(self) -> tuple[str, ...]:
        """The platforms of ``PLATFORM_PROFILES`` that read the key."""
        return tuple(name for name, profile in PLATFORM_PROFILES.items() if self.read_by(profile))

    def read_by(self, profile: PlatformProfile) -> bool:
        """Whether ``profile``'s platform reads the key."""
        return all(getattr(profile, field) for field in self.reads)

    def covers(self, key: str, value: Any) -> bool:
        """Whether the rule is about ``key`` (itself or a key below its section) with ``value``."""
        if key != self.key and not key.startswith(self.key + "."):
            return False
        if self.value is ANY_VALUE:
            return True
        return value in self.value if isinstance(self.value, tuple) else value == self.value


_AWS = ("provisions_aws",)
_K8S = ("runs_kubernetes",)
_EKS = ("creates_cluster",)
_EC2 = ("serves_under_systemd",)
_EXISTING_CLUSTER = ("needs_kubeconfig",)
_FSX = ("fsx_available",)
_FSX_KINDS = ("fsx", "nvme-from-fsx")

KEY_READERS: tuple[KeyReaders, ...] = (
    # lifecycle: only a trial expires (the sweeper tears it down); staging and prod live until destroyed.
    KeyReaders("trialTtlHours", (), "the trial's expiry, which the sweeper acts on", when=(("environment", ("trial",)),),
               instead="remove it (only a trial expires; expiresAt is refused outside trials too)"),
    # compute: the AWS instances, how they are bought and booted (components/aws).
    KeyReaders("compute.availabilityZone", _AWS, "the zone of the GPU subnets and FSx"),
    KeyReaders("compute.efa", _AWS, "EFA interfaces of the GPU instances"),
    KeyReaders("compute.rootVolumeGib", _AWS, "the GPU instances' root volume"),
    KeyReaders("compute.amiId", _AWS, "the GPU instances' launch template"),
    KeyReaders("compute.amiArchitecture", _AWS, "the GPU instances' launch template"),
    KeyReaders("compute.capacity", _AWS, "how the GPU instances are bought: on-demand, ODCR or capacity block"),
    KeyReaders("compute.capacity.usdPerHour", _AWS, "the capacity block's price in the plan and cost",
               when=(("compute.capacity.type", ("capacity-block",)),),
               instead="use compute.usdPerHour (on-demand and ODCR instances bill at the on-demand rate)"),
    KeyReaders("compute.capacity.endsAt", _AWS, "the capacity block's end, when AWS terminates its instances",
               when=(("compute.capacity.type", ("capacity-block",)),)),
    KeyReaders("compute.weightsRetry", _EC2, "the boot's weights unit under systemd"),
    # network: the VPC the stack creates or uses, and the EKS API endpoint (components/aws/network.py).
    KeyReaders("network.vpcId", _AWS, "the VPC of the stack"),
    KeyReaders("network.privateSubnetIds", _AWS, "the VPC of the stack"),
    KeyReaders("network.vpcCidr", _AWS, "the VPC the stack creates"),
    KeyReaders("network.allowedCidrs", _AWS, "the API port's security group; on an existing cluster use "
               "kubernetes.allowedCidrs"),
    KeyReaders("network.allowedSecurityGroupIds", _AWS, "the API port's security group"),
    KeyReaders("network.s3GatewayEndpoint", _AWS, "the VPC's route tables"),
    KeyReaders("network.apiServerPublicCidrs", _EKS, "the API endpoint of the EKS cluster the stack creates"),
    KeyReaders("network.apiServerAccess", _EKS, "the API endpoint of the EKS cluster the stack creates"),
    KeyReaders("network.apiServerPrivateCidrs", _EKS, "the EKS cluster security group's rules on 443"),
    KeyReaders("network.apiServerPrivateSecurityGroupIds", _EKS, "the EKS cluster security group's rules on 443"),
    # storage: FSx where the platform mounts it, a claim where pods run.
    KeyReaders("storage.kind", _FSX, "FSx for Lustre reaches the pods through the FSx CSI driver, an EKS add-on; "
               "the EC2 boot mounts no file system", value=_FSX_KINDS, instead="use storage.kind nvme"),
    KeyReaders("storage.kind", _K8S, "a PersistentVolumeClaim mounted into the vLLM pods", value="pvc",
               instead="use storage.kind nvme"),
    KeyReaders("storage.existingClaim", _K8S, "the vLLM pods' volume", when=(("storage.kind", ("pvc",)),)),
    KeyReaders("storage.fsx.importWaitSeconds", _FSX, "the node copy from FSx",
               when=(("storage.kind", ("nvme-from-fsx",)),)),
    KeyReaders("storage.fsx", _FSX, "the FSx for Lustre file system", when=(("storage.kind", _FSX_KINDS),)),
    KeyReaders("storage.mirror.enabled", (), "the weight sync"),
    KeyReaders("storage.mirror", (), "the S3 mirror of the weights", when=(("storage.mirror.enabled", (True,)),)),
    KeyReaders("storage.mirror.region", _EXISTING_CLUSTER, "AWS_REGION of the pods that publish or read the mirror; "
               "on AWS the stack's aws:region", instead="remove it (aws:region)"),
    KeyReaders("kubernetes.mirrorCredentials", _EXISTING_CLUSTER, "the AWS credentials of the pods that publish or read "
               "the mirror; on AWS the mirror is granted through IAM", instead="remove it (IAM grants the mirror)"),
    KeyReaders("storage.mirror.endpointUrl", _K8S, "AWS_ENDPOINT_URL_S3 of the weight sync and engine cache pods; "
               "the EC2 boot reads the mirror through the VPC's S3 endpoint", when=(("storage.mirror.enabled", (True,)),)),
    # storage.mirror.create (default true) on a platform that creates no AWS resource: a mirror
    # enabled there must name an existing bucket with create: false (config/storage.py).
    # kubernetes: the workloads, where they run (components/k8s).
    KeyReaders("kubernetes.serviceType", _EKS, "AWS load balancer annotations make an internal Network Load Balancer; "
               "on another cluster they may make a public one", value="internal-nlb",
               instead="use ClusterIP and the cluster's own way in"),
    KeyReaders("kubernetes.adminRoleArns", _EKS, "EKS access entries of the cluster the stack creates"),
    KeyReaders("kubernetes.eksVersion", _EKS, "the EKS cluster the stack creates"),
    KeyReaders("kubernetes.eksSupportType", _EKS, "the EKS cluster the stack creates"),
    KeyReaders("kubernetes.clusterCidrs", _EXISTING_CLUSTER, "the NetworkPolicy on an existing cluster; the stack "
               "knows the node subnets of a cluster it creates"),
    KeyReaders("kubernetes.nvmeHostPath", _EXISTING_CLUSTER, "the GPU pods' hostPath on an existing cluster; EKS "
               "nodes mount their RAID0 where the stack says"),
    KeyReaders("kubernetes.context", _EXISTING_CLUSTER, "the kubeconfig of an existing cluster"),
    KeyReaders("kubernetes", _K8S, "the Kubernetes workloads; on aws-ec2 vLLM runs under systemd"),
    KeyReaders("autoscaling.enabled", _K8S, "the scaler of the vLLM workloads; one EC2 instance serves one copy"),
    KeyReaders("autoscaling", _K8S, "the scaler of the vLLM workloads; one EC2 instance serves one copy",
               when=(("autoscaling.enabled", (True,)),)),
    KeyReaders("observability", _K8S, "the Prometheus and Grafana objects of the Kubernetes workloads"),
    KeyReaders("timeToReady.stagerBootSeconds", _EC2, "the stage phase's CPU stager instance"),
)


def readers_of(key: str, value: Any = ANY_VALUE) -> KeyReaders | None:
    """The rule of ``KEY_READERS`` that decides ``key`` (set to ``value``): the most specific key,
    a rule about the value before one about every value; None: every platform reads it. Without
    ``value`` only rules about every value are considered."""
    rules = [r for r in KEY_READERS
             if (key == r.key or key.startswith(r.key + "."))
             and (r.value is ANY_VALUE or (value is not ANY_VALUE and r.covers(key, value)))]
    return max(rules, key=lambda r: (len(r.key), r.value is not ANY_VALUE), default=None)


def explicit_settings(model: BaseModel, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """``(camelCase key, value)`` of every leaf ``model`` sets explicitly to a value other than its
    default, depth first in field order: a section is walked; a null, empty or default value is not
    a setting."""
    for name, info in type(model).model_fields.items():
        if name not in model.model_fields_set or (not prefix and name == "region"):
            continue
        value = getattr(model, name)
        key = (*prefix, info.alias or name)
        if isinstance(value, BaseModel):
            yield from explicit_settings(value, key)
        elif value is None or (isinstance(value, (tuple, list, dict)) and not value):
            continue
        elif value != info.get_default(call_default_factory=True):
            yield ".".join(key), value


def setting(raw: RawConfig, key: str) -> Any:
    """The value of the camelCase ``key`` (``storage.mirror.enabled``) in ``raw``, set or default."""
    node: Any = raw
    for part in key.split("."):
        name = next(n for n, f in type(node).model_fields.items() if part in (n, f.alias))
        node = getattr(node, name)
    return node


def _word(value: Any) -> str:
    """A value as YAML writes it (``true``, ``nvme``)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _shown(value: Any) -> Any:
    """``value`` as the stack file wrote it: tuples as lists, sections as their camelCase maps."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_unset=True)
    if isinstance(value, (tuple, list)):
        return [_shown(item) for item in value]
    if isinstance(value, datetime):  # as ISO 8601, the way the stack file gives it
        return value.isoformat().replace("+00:00", "Z")
    return value


def check_platform_keys(raw: RawConfig, platform: PlatformProfile) -> None:
    """Every key ``raw`` sets is read on its platform (``KEY_READERS``), and with its storage kind.

    Raises:
        ConfigError: the first key (or value) the platform does not read, naming the platforms that
            do and what reads it there.
    """
    for key, value in explicit_settings(raw):
        rule = readers_of(key, value)
        if rule is None:
            continue
        shown = _shown(value)
        if not rule.read_by(platform):
            verb = "is read only on" if rule.value is ANY_VALUE else "needs"
            raise ConfigError(
                key, shown, f"{verb} {', '.join(rule.platforms())} ({rule.what}), not {raw.platform}: {rule.instead}"
            )
        for other, values in rule.when:
            current = setting(raw, other)
            if current not in values:
                raise ConfigError(
                    key, shown,
                    f"is read only with {other} {' or '.join(_word(v) for v in values)} ({rule.what}); this stack's "
                    f"{other} is {_word(current)}: {rule.instead}",
                )


# Keys a second key makes unread: (key, the key that wins, what reads the winner). Setting both is
# setting one value nothing reads (new-user trial: each was accepted and ignored).
IGNORED_BESIDE: tuple[tuple[str, str, str], ...] = (
    ("trialTtlHours", "expiresAt", "the expiry is expiresAt itself (config/lifecycle.py)"),
    ("network.vpcCidr", "network.vpcId", "an existing VPC keeps its own CIDR blocks (aws/network.py creates no VPC)"),
    ("compute.capacity.usdPerHour", "compute.usdPerHour",
     "the price per node-hour is compute.usdPerHour when both are set (sizing.py)"),
)


def check_ignored_beside(raw: RawConfig, warnings: list[str]) -> None:
    """A warning for every key set beside the key that makes it unread (``IGNORED_BESIDE``): one
    rule for every pair, one line naming both keys and which one is read."""
    explicit = dict(explicit_settings(raw))
    for key, winner, why in IGNORED_BESIDE:
        if key in explicit and winner in explicit:
            warnings.append(f"{key} {_shown(explicit[key])} is ignored beside {winner}: {why}; remove one of them")
