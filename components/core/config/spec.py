"""The validated spec (``DeploymentSpec``) and its derived properties; UTC time helpers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .. import naming
from ..errors import ConfigError
from ..model import ModelProfile
from ..platforms import PlatformProfile, platform_profile
from ..targets import InstanceFacts, TargetProfile
from .patterns import COMMIT_RE
from .raw import RawConfig


@dataclass(frozen=True)
class DeploymentSpec:
    """Everything that is deployed, validated: the single input of sizing, the vLLM command,
    the Pulumi components and the scripts.

    Attributes:
        project, stack: Pulumi project and stack names.
        target: the target profile (``TARGETS``).
        platform: ``aws-ec2``, ``aws-eks`` or ``kubernetes``.
        environment: ``trial``, ``staging`` or ``prod``.
        owner: team or person tagged as owner.
        region: AWS region (None for the kubernetes platform).
        expires_at: explicit expiry (UTC) or None. A trial without one expires
            ``trial_ttl_hours`` after its first ``pulumi up`` (fixed at creation).
        trial_ttl_hours: default time to live of a trial, hours.
        protect: resources holding data (mirror, file system) are protected from deletion.
        model: the model profile; ``revision``/``model_source`` say which commit from where.
        instance: instance facts of one node.
        config: the raw, validated config (for settings that need no derivation).
        secrets_set: names of the secret keys that have a value in the stack's config.
        warnings: things the plan must show (for example a trial following a branch).
        blockers: ``ConfigError``s that stop `pulumi up` but let the offline plan render: an
            engine build known not to serve the model (``engine.engine_blocker``; it stops the
            ``serve`` phase only, a ``stage`` declares no engine), and ``every_phase_blockers``.
        every_phase_blockers: the blockers that stop `pulumi up` in every phase, a stage too (a
            documentation range as the EKS API's only source: ``network.api_server_blockers``; an
            example value shipped in stacks/: ``examples.example_value_blockers``).
            Also in ``blockers``; ``up_blockers`` picks what applies to the stack's phase.
    """

    project: str
    stack: str
    target: TargetProfile
    platform: str
    environment: str
    owner: str
    region: str | None
    expires_at: datetime | None
    trial_ttl_hours: int
    protect: bool
    model: ModelProfile
    revision: str
    model_source: str
    instance: InstanceFacts
    config: RawConfig
    secrets_set: frozenset[str]
    warnings: tuple[str, ...]
    # Config errors that stop `pulumi up` but not the offline plan (an engine known not to serve the
    # model): ``program.build_context`` raises the first; the plan lists them at its top.
    blockers: tuple[Exception, ...] = ()
    every_phase_blockers: tuple[Exception, ...] = ()

    @property
    def up_blockers(self) -> tuple[Exception, ...]:
        """The blockers `pulumi up` raises for this stack's phase (``program.build_context`` raises
        the first): all of them in ``serve``; in ``stage`` only ``every_phase_blockers``."""
        return self.every_phase_blockers if self.staging else self.blockers

    @property
    def staging(self) -> bool:
        """``phase: stage``: the weights and what they need, no GPU resource (``config/phase.py``)."""
        return self.config.phase == "stage"

    @property
    def revision_is_commit(self) -> bool:
        """Whether the model revision is pinned to a 40-hex commit."""
        return bool(COMMIT_RE.match(self.revision))

    @property
    def profile(self) -> PlatformProfile:
        """The platform's facts (``platforms.PlatformProfile``): ask its fields, never the name."""
        return platform_profile(self.platform)

    @property
    def nodes_per_copy(self) -> int:
        """Nodes in one model copy (tensor-parallel group)."""
        return self.target.nodes_per_copy

    @property
    def spans_nvlink_domain(self) -> bool:
        """A model copy spans nodes over multi-node NVLink (GB300/GB200 NVL72 with more than one
        node per copy): its pods join a ComputeDomain and its group must stay in one NVLink clique
        (GPU Feature Discovery's ``nvidia.com/gpu.clique``; components/k8s/vllm_service.py
        ``nvlink_clique_affinity``)."""
        return self.target.needs_compute_domain and self.nodes_per_copy > 1

    @property
    def replicas(self) -> int:
        """Model copies (independent vLLM servers or LeaderWorkerSet groups)."""
        return self.config.compute.replicas

    @property
    def gpu_nodes(self) -> int:
        """GPU nodes in all: replicas x nodes per copy."""
        return self.replicas * self.nodes_per_copy

    @property
    def availability_zone(self) -> str | None:
        """The AZ GPU nodes are pinned to (capacity reservation's AZ wins), or None."""
        return self.config.compute.capacity.availability_zone or self.config.compute.availability_zone

    @property
    def efa_enabled(self) -> bool:
        """EFA on GPU nodes and in the vLLM pods: only when ``compute.efa`` is true.

        Off by default: the stock vLLM image has neither libfabric's EFA provider nor
        aws-ofi-nccl, so NCCL could not use the devices (it would fall back to sockets);
        GB300 TP8 runs over multi-node NVLink inside one NVL72 domain (ComputeDomain) anyway.
        """
        return bool(self.config.compute.efa)

    @property
    def served_model_name(self) -> str:
        """The name clients send as ``model``."""
        return self.config.model.served_model_name or self.model.name

    @property
    def hub_repo(self) -> str:
        """Repository id at the configured hub."""
        return self.model.hf_repo if self.model_source == "huggingface" else self.model.modelscope_repo

    @property
    def hub_uri(self) -> str:
        """Source URI of the weight sync: ``hf://ORG/REPO@REV`` or ``modelscope://ORG/REPO@REV``."""
        scheme = "hf" if self.model_source == "huggingface" else "modelscope"
        return f"{scheme}://{self.hub_repo}@{self.revision}"

    @property
    def hub_token_key(self) -> str:
        """Config key of the hub token secret for the configured source."""
        return "hfToken" if self.model_source == "huggingface" else "modelscopeToken"

    @property
    def tags(self) -> dict[str, str]:
        """Tags every taggable resource carries (``expires-at`` is added where it is known)."""
        tags = {
            naming.TAG_STACK: self.stack,
            naming.TAG_ENVIRONMENT: self.environment,
            naming.TAG_TARGET: self.target.name,
            naming.TAG_OWNER: self.owner,
            naming.TAG_PROJECT: self.project,
        }
        if self.expires_at is not None:
            tags[naming.TAG_EXPIRES_AT] = format_utc(self.expires_at)
        return tags


def format_utc(moment: datetime) -> str:
    """``moment`` as an RFC 3339 UTC string with seconds, e.g. ``2026-12-01T00:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str, key: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (``Z`` allowed; no zone means UTC) as an aware UTC datetime.

    Args:
        text: the time as given.
        key: the flag, env var or config key it came from (named in the error).

    Raises:
        ConfigError: not a time.
    """
    try:
        moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(key, text, "is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)") from None
    try:
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00:00-05:00 is past the last date Python represents in UTC
        raise ConfigError(key, text, "is out of range (it is past 9999-12-31 in UTC)") from None


# The clock a plan, diff or sweep may be told (``--now``): a typo guard. The program adds hours to
# the clock (a trial's trialTtlHours, the time to ready), so a far-future clock overflows dates
# (9999-12-31 + 72 h), and no deployment runs in another century.
CLOCK_MIN = datetime(2000, 1, 1, tzinfo=UTC)
CLOCK_MAX = datetime(2100, 1, 1, tzinfo=UTC)


def parse_clock(text: str, key: str) -> datetime:
    """``parse_utc`` of a clock (``--now``), at or after ``CLOCK_MIN`` and before ``CLOCK_MAX``.

    Raises:
        ConfigError: empty, not a time, or out of that range (one line naming ``key``).
    """
    if not text.strip():
        # An empty flag (`--now "$UNSET_VAR"`) is a mistake, not "use the clock".
        raise ConfigError(key, text, "is empty: give an ISO 8601 time (e.g. 2026-12-01T00:00:00Z) or leave the flag out")
    moment = parse_utc(text, key)
    if not CLOCK_MIN <= moment < CLOCK_MAX:
        raise ConfigError(
            key, text, f"is out of range (allowed: {format_utc(CLOCK_MIN)} up to {format_utc(CLOCK_MAX)}, exclusive)"
        )
    return moment
