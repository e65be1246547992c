"""``phase``: ``stage`` (the weights and the infrastructure they need, no GPU) or ``serve`` (the default).

A stage ``pulumi up`` creates the network, the S3 mirror, IAM, storage and the publish (hub -> mirror,
verified) on compute that needs no GPU: on ``aws-ec2`` a CPU instance that terminates itself when the
mirror is complete (``components/aws/stager.py``), on ``aws-eks`` the publish Job on the system nodes
with no GPU node group, on ``kubernetes`` the publish Job alone. Switching to ``serve`` adds the GPUs,
which find a complete mirror; the resources both phases declare keep their names (the same URNs).
An engine build known not to serve the model blocks ``serve`` only (``spec.blockers``).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..platforms import PlatformProfile
from .raw import RawConfig

PHASES: tuple[str, ...] = ("stage", "serve")
# What to run once a stage's mirror is complete (its marker exists; `kimi-deploy preflight` passes
# the mirror check): the stack output ``switchToServe`` and the preflight message say it.
SWITCH_TO_SERVE = "pulumi config set kimi-deploy:phase serve && pulumi up"


def check_phase(raw: RawConfig, platform: PlatformProfile) -> None:
    """A stage needs a mirror to fill: ``storage.mirror.enabled``, and on a platform that does not
    create AWS resources an existing bucket (``storage.mirror.bucketName``, ``create: false``).

    Raises:
        ConfigError: ``phase: stage`` without such a mirror (named with what to set).
    """
    if raw.phase != "stage":
        return
    mirror = raw.storage.mirror
    if not mirror.enabled:
        # Off AWS the stack creates no bucket: say what a mirror takes there (mi355x ships without one).
        how = ("set storage.mirror.enabled: true" if platform.provisions_aws else
               f"on platform {raw.platform} an existing bucket: storage.mirror {{enabled: true, create: false, bucketName, "
               "region} and kubernetes.mirrorCredentials (docs/kubernetes.md)")
        raise ConfigError(
            "phase", raw.phase,
            f"needs the S3 mirror (storage.mirror.enabled is false) for staging to fill: {how}; without one the weights "
            "are copied from the hub on the GPU node at serve (use phase: serve)",
        )
    if not platform.provisions_aws and (mirror.create or not mirror.bucket_name):
        raise ConfigError(
            "phase", raw.phase,
            f"on platform {raw.platform} needs an existing mirror: set storage.mirror.bucketName and "
            "storage.mirror.create: false",
        )
