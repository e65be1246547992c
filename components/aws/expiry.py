"""Expiry enforced in the cloud: at a stack's ``expires-at`` its GPU spend stops by itself.

The ``expires-at`` tag and the sweeper only report; a trial created from a laptop would bill
until someone noticed (a GPU instance bills by the hour). So every AWS stack that
expires (a trial: ``trialTtlHours`` after its first `pulumi up`, or ``expiresAt``) gets an
EventBridge Scheduler one-shot schedule (an ``at(yyyy-mm-ddThh:mm:ss)`` expression in UTC) with a
universal target, run by a role that may do that one call on that one resource:

- ``aws-ec2``: ``ec2:StopInstances`` on the GPU instance (``stop_instance_input``). The instance
  also powers itself off within a minute of the expiry, which it reads from an SSM parameter
  (``userdata.watch_units``: a systemd timer), a second net should the schedule or its role be
  deleted.
- ``aws-eks``: ``eks:UpdateNodegroupConfig`` of the GPU node group to ``desiredSize 0, minSize 0``
  (``scale_to_zero_input``): EKS drains and terminates the GPU nodes. ``maxSize`` cannot follow
  (EKS's ``NodegroupScalingConfig.maxSize`` is at least 1), so a cluster autoscaler that sees
  pending pods would raise the desired size again; a second schedule at the same time suspends
  the ``Launch`` process of the node group's Auto Scaling group (``autoscaling:SuspendProcesses``,
  ``suspend_launch_input``): whatever sets the desired size afterwards (the cluster autoscaler,
  Karpenter-less scale-ups, a console click), the group launches no instance until the process
  is resumed (``aws autoscaling resume-processes``; docs/operations.md, "When a trial expires").

What keeps billing after expiry (docs/operations.md, "When a trial expires"): the mirror bucket
(retained by design), the NAT gateway, the EKS control plane and system nodes, an FSx file system,
the stopped instance's root volume, and a reservation (an ODCR bills until cancelled, a capacity
block is paid for its term). `pulumi destroy` removes all of it but the mirror.

`pulumi up` after the expiry is refused (``check_not_expired``): an update could launch GPU
capacity again (a replaced instance starts running; an autoscaled node group's ``minSize`` comes
back) under a schedule that has already fired. (An explicit ``expiresAt`` in the past is refused
at config time, ``config.lifecycle.check_expiry``; this check covers the expiry fixed at the
first `pulumi up`.) To resume, set ``kimi-deploy:expiresAt`` to a later time, run `pulumi up`
(the schedule moves; on aws-ec2 the instance's SSM parameter too) and start the instance or
scale the node group back; to end, `pulumi destroy`.

Sources (retrieved 2026-12-07): EventBridge Scheduler user guide, "Schedule types" (one-time
``at()`` schedules, ``ScheduleExpressionTimezone``) and "Using universal targets" (target ARN
``arn:aws:scheduler:::aws-sdk:<service>:<apiAction>``, the input is the API's request in JSON with
its parameter names as the API reference spells them), "Set up the execution role" (trust in
``scheduler.amazonaws.com``); EC2 API reference ``StopInstances`` (``InstanceIds``); EKS API
reference ``UpdateNodegroupConfig`` (``clusterName``, ``nodegroupName``, ``scalingConfig``) and
``NodegroupScalingConfig`` (``maxSize``: minimum value 1); Amazon EC2 Auto Scaling API reference
``SuspendProcesses`` (``AutoScalingGroupName``, ``ScalingProcesses``: ``Launch`` "adds instances
to the Auto Scaling group when the group scales out"; a suspended Launch also stops the group
replacing unhealthy instances) and the Auto Scaling service authorization reference (the
``autoScalingGroup`` ARN with a ``*`` group id); EKS "Managed node groups" (the group is an EC2
Auto Scaling group named in ``Nodegroup.resources.autoScalingGroups``);
tests/test_aws_expiry.py checks every request against the SDK's models (botocore).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core import naming
from components.core.config import DeploymentSpec, format_utc, parse_utc
from components.core.errors import ConfigError

from . import iam
from .common import child

SCHEDULER_SERVICE = "scheduler.amazonaws.com"
# Universal targets (the partition is the stack's): the API action as the SDK names it.
STOP_INSTANCES_TARGET = "arn:{partition}:scheduler:::aws-sdk:ec2:stopInstances"
SCALE_NODEGROUP_TARGET = "arn:{partition}:scheduler:::aws-sdk:eks:updateNodegroupConfig"
# IAM actions the schedule's role holds (one each, on one resource).
STOP_INSTANCES_ACTION = "ec2:StopInstances"
SCALE_NODEGROUP_ACTION = "eks:UpdateNodegroupConfig"
SUSPEND_LAUNCH_TARGET = "arn:{partition}:scheduler:::aws-sdk:autoscaling:suspendProcesses"
SUSPEND_LAUNCH_ACTION = "autoscaling:SuspendProcesses"
# The Auto Scaling process suspended at the expiry (the one that adds instances).
SUSPENDED_PROCESS = "Launch"
# The schedules' expressions are written in UTC, like expires-at.
SCHEDULE_TIMEZONE = "UTC"
# What stops at the expiry, per platform that declares the stop (the plan's "expires" row; what keeps
# billing is read from the stack's own bill, prices.py, so it names every line that survives the stop).
AT_EXPIRY: dict[str, str] = {
    "aws-ec2": "the GPU instance stops (EventBridge Scheduler: ec2:StopInstances; its own timer powers it off too)",
    "aws-eks": "the GPU node group scales to 0 and its Auto Scaling group stops launching, so no autoscaler "
               "brings it back (EventBridge Scheduler: eks:UpdateNodegroupConfig, autoscaling:SuspendProcesses Launch)",
}
# Retries of a failed stop (the target's retry policy): a throttled call is tried again for up
# to an hour (a choice: the schedule's one chance to stop the spend; the timer backs it on EC2).
STOP_RETRY_ATTEMPTS = 10
STOP_RETRY_WINDOW_SECONDS = 3600


def schedule_expression(expires_at: str) -> str:
    """The one-shot EventBridge Scheduler expression of ``expires_at``: ``at(2026-12-03T12:00:00)``
    (read in ``SCHEDULE_TIMEZONE``; seconds kept, sub-seconds dropped)."""
    return f"at({parse_utc(expires_at, naming.TAG_EXPIRES_AT).strftime('%Y-%m-%dT%H:%M:%S')})"


def check_not_expired(expires_at: str, now: datetime, *, key: str) -> str:
    """``expires_at`` unchanged while it is after ``now``; `pulumi up` refuses a stack past it.

    Args:
        expires_at: RFC 3339 in UTC.
        now: the run's clock.
        key: the config key that set the expiry (``expiresAt``, or ``trialTtlHours`` when the
            expiry was fixed at the first `pulumi up`).

    Raises:
        ConfigError: the expiry is not after ``now`` (one line: what to do instead).
    """
    if parse_utc(expires_at, naming.TAG_EXPIRES_AT) > now:
        return expires_at
    raise ConfigError(
        key, expires_at if key == "expiresAt" else f"expired at {expires_at}",
        f"is past (now {format_utc(now)}): the stack's GPU spend was stopped at its expiry, and `pulumi up` would "
        "start it again; `pulumi destroy` the stack, or set kimi-deploy:expiresAt to a later time to extend it",
    )


def stop_instance_input(instance_id: str) -> str:
    """The ``StopInstances`` request of the EC2 schedule (JSON; the members as the SDK names them,
    as a universal target's input takes them)."""
    return json.dumps({"InstanceIds": [instance_id]}, sort_keys=True)


def scale_to_zero_input(cluster_name: str, nodegroup_name: str) -> str:
    """The ``UpdateNodegroupConfig`` request of the EKS schedule (JSON; EKS's members are
    lower camel case: ``clusterName``, ``nodegroupName``, ``scalingConfig``): desired and minimum 0
    (``maxSize`` must stay at least 1 and is left as it is)."""
    return json.dumps(
        {"clusterName": cluster_name, "nodegroupName": nodegroup_name, "scalingConfig": {"desiredSize": 0, "minSize": 0}},
        sort_keys=True,
    )


def suspend_launch_input(asg_name: str) -> str:
    """The ``SuspendProcesses`` request of the EKS stack's second schedule (JSON; Auto Scaling's
    members are upper camel case): the ``Launch`` process of the GPU node group's Auto Scaling group."""
    return json.dumps({"AutoScalingGroupName": asg_name, "ScalingProcesses": [SUSPENDED_PROCESS]}, sort_keys=True)


def asg_arn_pattern(partition: str, region: str, asg_name: str) -> str:
    """The IAM resource of one Auto Scaling group by name (its id is not known before it exists):
    ``arn:<partition>:autoscaling:<region>:*:autoScalingGroup:*:autoScalingGroupName/<name>``. The
    account is ``*``: a role acts in its own account only (an Auto Scaling group has no resource
    policy to admit another's), and the plan knows no account id before `pulumi up`."""
    return f"arn:{partition}:autoscaling:{region}:*:autoScalingGroup:*:autoScalingGroupName/{asg_name}"


def execution_policy(action: str, resource_arn: str) -> str:
    """The schedule role's only policy (JSON): ``action`` on ``resource_arn``."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Sid": "StopAtExpiry", "Effect": "Allow", "Action": action, "Resource": resource_arn}],
        },
        sort_keys=True,
    )


def declare_expiry_stop(
    parent: pulumi.Resource,
    name: str,
    *,
    ctx_tags: dict[str, Any],
    partition: pulumi.Input[str],
    expires_at: pulumi.Input[str],
    expiry_key: str,
    now: datetime,
    target: str,
    action: str,
    resource_arn: pulumi.Input[str],
    request: pulumi.Input[str],
    what: str,
) -> aws.scheduler.Schedule:
    """The role and the one-shot schedule that stop a GPU resource at ``expires_at``.

    Args:
        parent: the component the resources belong to.
        name: logical name prefix (``<name>-expiry-role``, ``<name>-expiry-stop``).
        ctx_tags: the stack's tags (on the role).
        partition: the AWS partition.
        expires_at: RFC 3339 expiry (an Output when fixed at the first `pulumi up`).
        expiry_key: the config key that set it (named by ``check_not_expired``).
        now: the run's clock.
        target: ``STOP_INSTANCES_TARGET`` or ``SCALE_NODEGROUP_TARGET`` (``{partition}`` unfilled).
        action, resource_arn: the one IAM action the role holds and its resource.
        request: the API request (JSON) the target sends.
        what: the schedule's description.

    Returns:
        The ``aws.scheduler.Schedule``.

    Raises:
        ConfigError: (when the expiry resolves) it is past (``check_not_expired``).
    """
    role = iam.role(
        f"{name}-expiry-role",
        parent=parent,
        ctx_tags=ctx_tags,
        service=SCHEDULER_SERVICE,
        partition=partition,
        inline={"stop-at-expiry": pulumi.Output.from_input(resource_arn).apply(lambda arn: execution_policy(action, arn))},
        description=f"EventBridge Scheduler: {what} at the stack's expiry ({action} only)",
    )
    expression = pulumi.Output.from_input(expires_at).apply(
        lambda when: schedule_expression(check_not_expired(when, now, key=expiry_key))
    )
    return aws.scheduler.Schedule(
        f"{name}-expiry-stop",
        description=f"kimi-deploy: {what} at expires-at",
        schedule_expression=expression,
        schedule_expression_timezone=SCHEDULE_TIMEZONE,
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        target=aws.scheduler.ScheduleTargetArgs(
            arn=pulumi.Output.from_input(partition).apply(lambda p: target.format(partition=p)),
            role_arn=role.arn,
            input=request,
            retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                maximum_retry_attempts=STOP_RETRY_ATTEMPTS, maximum_event_age_in_seconds=STOP_RETRY_WINDOW_SECONDS
            ),
        ),
        opts=child(parent, depends_on=[role]),
    )



def expiry_key(spec: DeploymentSpec) -> str:
    """The config key that set ``spec``'s expiry: ``expiresAt``, else ``trialTtlHours`` (a trial's
    expiry fixed at its first `pulumi up`)."""
    return "expiresAt" if spec.expires_at is not None else "trialTtlHours"
