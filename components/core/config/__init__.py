"""The typed config: a stack's ``kimi-deploy:*`` config as pydantic models, its checks, and the
frozen ``DeploymentSpec`` they build.

This package is the layer above the facts and ``errors`` and below the domain: it imports only
those (tests/test_layout.py holds it). The entry that runs it, ``load.parse_spec`` (the plain config
mapping -> ``DeploymentSpec``, or ``ConfigError`` with one line naming the key, the value and what
is allowed) and ``load.load_stack`` (a stack file), sits above the domain, with the checks that need
the domain (``checks``) between them. No Pulumi import here: ``__main__.py`` reads the config through
Pulumi and hands it in; scripts read the stack file.

In parts (each importable and testable alone; the names below are importable from here):

- ``patterns``: value formats (regexes); ``ConfigError`` is ``components.core.errors``.
- ``raw``: the pydantic models of the YAML (``RawConfig`` and one per section) and
  ``validate_raw`` (pydantic's first error as one line).
- one module of checks per section, each function taking the raw config and what it needs:
  ``plain_secrets`` (credential-shaped values), ``target`` (target, platform), ``tags`` (owner),
  ``model`` (profile, revision, license), ``compute`` (instance, region, AZ, capacity, EFA,
  AMI), ``network``, ``storage`` (with the mirror and FSx), ``vllm`` (with the engine build),
  ``kubernetes`` (with EKS), ``scaling`` (autoscaling, observability), ``lifecycle``
  (environment, expiresAt, trialTtlHours, protect).
- ``spec``: ``DeploymentSpec`` and its derived properties; ``stack_file``: stack files read and
  decoded; ``reader``: the config strings decoded as the Pulumi engine hands them.
"""

from __future__ import annotations

from .compute import block_instances
from .kubernetes import eks_version_of
from .lifecycle import ENVIRONMENTS, MAX_TRIAL_HOURS
from .network import MIN_CLIENT_PREFIX_LENGTH, ApiServerAccess, api_server_access
from .raw import (
    DEFAULT_TRIAL_TTL_HOURS,
    SECRET_KEYS,
    SECRETS,
    AutoscalingConfig,
    CapacityConfig,
    ComputeConfig,
    FsxConfig,
    KubernetesConfig,
    MirrorConfig,
    ModelConfig,
    NetworkConfig,
    ObservabilityConfig,
    RawConfig,
    ScheduleWindowConfig,
    StorageConfig,
    TimeToReadyConfig,
    VllmConfig,
)
from .spec import CLOCK_MAX, CLOCK_MIN, DeploymentSpec, format_utc, parse_clock, parse_utc
from .stack_file import (
    CONFIG_OVERLAY_ENV,
    REPO_ROOT,
    STACK_FILE_KEYS,
    STACKS_DIR,
    StackFileError,
    config_overlay,
    namespace_config,
    read_stack_config,
    stack_names,
)

__all__ = [
    "CLOCK_MAX", "CLOCK_MIN", "CONFIG_OVERLAY_ENV", "DEFAULT_TRIAL_TTL_HOURS", "ENVIRONMENTS", "MAX_TRIAL_HOURS",
    "MIN_CLIENT_PREFIX_LENGTH", "REPO_ROOT", "SECRETS", "SECRET_KEYS", "STACKS_DIR", "STACK_FILE_KEYS",
    "ApiServerAccess", "AutoscalingConfig", "CapacityConfig", "ComputeConfig", "DeploymentSpec", "FsxConfig",
    "KubernetesConfig", "MirrorConfig", "ModelConfig", "NetworkConfig", "ObservabilityConfig", "RawConfig",
    "ScheduleWindowConfig", "StackFileError", "StorageConfig", "TimeToReadyConfig", "VllmConfig", "api_server_access",
    "block_instances", "config_overlay", "eks_version_of", "format_utc", "namespace_config", "parse_clock",
    "parse_utc", "read_stack_config", "stack_names",
]
