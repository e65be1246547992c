"""Expiry enforced in the cloud (components/aws/expiry.py) and on the instance
(components/aws/userdata.py ``watch_units``), and the vLLM watchdog that shares its timer.

A b300 (aws-ec2) and a gb300 (aws-eks) trial each declare a one-shot EventBridge Scheduler
schedule at ``expires-at``; the schedule and its role are created from the rendered inputs in
moto (server mode on 127.0.0.1), and the request the target sends is checked against the SDK's
model of the API it calls. The instance's own check (``watch.sh``) runs here against stand-ins:
a local HTTP server that answers, then hangs; an ``aws`` and a ``systemctl`` that record calls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components.aws import expiry, userdata
from components.core.errors import ConfigError
from tests.conftest import FIXED_NOW, REPO_ROOT, plan_for

SCHEDULE = "aws:scheduler/schedule:Schedule"


def _expiry_resources(run, launch: bool = False):
    """The stack's schedule, its role and the role's one inline policy (recorded inputs); with
    ``launch``, the EKS stack's second schedule (the Auto Scaling group's Launch suspended)."""
    [schedule] = [r for r in run.resources if r.type == SCHEDULE and ("-launch-expiry-" in r.name) == launch]
    base = schedule.name.removesuffix("-expiry-stop")
    role = run.named(f"{base}-expiry-role")
    policy = run.named(f"{base}-expiry-role-stop-at-expiry")
    return schedule, role, policy


def _check_request(value, shape, where: str = "input") -> None:
    """``value`` (decoded JSON) fits botocore's ``shape``: known members only, required ones set,
    types as modelled. A universal target sends its input as the API's request."""
    kind = shape.type_name
    if kind == "structure":
        assert isinstance(value, dict), where
        unknown = set(value) - set(shape.members)
        assert not unknown, f"{where}: {sorted(unknown)} not in {sorted(shape.members)}"
        assert set(shape.required_members) <= set(value), (where, shape.required_members)
        for key, item in value.items():
            _check_request(item, shape.members[key], f"{where}.{key}")
    elif kind == "list":
        assert isinstance(value, list) and value, where
        for item in value:
            _check_request(item, shape.member, f"{where}[]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), where
    elif kind == "string":
        assert isinstance(value, str) and value, where
    else:
        raise AssertionError(f"{where}: unexpected shape {kind}")


@pytest.mark.parametrize(
    ("stack", "service", "operation", "action"),
    [("b300", "ec2", "StopInstances", "ec2:StopInstances"),
     ("gb300", "eks", "UpdateNodegroupConfig", "eks:UpdateNodegroupConfig")],
)
def test_a_trial_has_a_cloud_side_stop_at_its_expiry(stack, service, operation, action, moto_server, fake_aws_env):
    import boto3
    import botocore.session

    run = plan_for(stack)
    schedule, role, policy = _expiry_resources(run)
    expires_at = run.outputs["expiresAt"]
    assert expires_at == (FIXED_NOW + timedelta(hours=run.context.spec.trial_ttl_hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    target = schedule.inputs["target"]
    request = json.loads(target["input"])

    # The request names this stack's GPU resource and fits the API's model.
    model = botocore.session.get_session().get_service_model(service).operation_model(operation).input_shape
    _check_request(request, model)
    if service == "ec2":
        instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
        assert request == {"InstanceIds": [instance.resource_id]}
        named = f"instance/i-{instance.name}"  # the mock's ARN of that instance
    else:
        group = run.named("eks-gpu")
        assert request == {"clusterName": group.inputs["clusterName"], "nodegroupName": f"{group.name}-20261130",
                           "scalingConfig": {"desiredSize": 0, "minSize": 0}}
        named = f"nodegroup/{group.inputs['clusterName']}/{group.name}-20261130/"

    # The role: trusted by the scheduler alone; its one permission is the one call on the one resource.
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"] == [{"Action": "sts:AssumeRole", "Effect": "Allow",
                                   "Principal": {"Service": "scheduler.amazonaws.com"}}]
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == action and statement["Effect"] == "Allow"
    assert statement["Resource"].startswith(f"arn:aws:{service}:us-east-1:") and named in statement["Resource"]

    # Created from the rendered inputs in moto: what the scheduler stores is what was rendered.
    iam = boto3.client("iam", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    created = iam.create_role(RoleName=f"{stack}-expiry", AssumeRolePolicyDocument=role.inputs["assumeRolePolicy"])
    iam.put_role_policy(RoleName=f"{stack}-expiry", PolicyName=policy.inputs["name"], PolicyDocument=policy.inputs["policy"])
    scheduler = boto3.client("scheduler", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    retry = target["retryPolicy"]
    scheduler.create_schedule(
        Name=f"{stack}-expiry",
        ScheduleExpression=schedule.inputs["scheduleExpression"],
        ScheduleExpressionTimezone=schedule.inputs["scheduleExpressionTimezone"],
        FlexibleTimeWindow={"Mode": schedule.inputs["flexibleTimeWindow"]["mode"]},
        Target={"Arn": target["arn"], "RoleArn": created["Role"]["Arn"], "Input": target["input"],
                "RetryPolicy": {"MaximumRetryAttempts": retry["maximumRetryAttempts"],
                                "MaximumEventAgeInSeconds": retry["maximumEventAgeInSeconds"]}},
    )
    got = scheduler.get_schedule(Name=f"{stack}-expiry")
    assert got["ScheduleExpression"] == f"at({expires_at.removesuffix('Z')})"
    assert got["ScheduleExpressionTimezone"] == "UTC" and got["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert got["Target"]["Arn"] == f"arn:aws:scheduler:::aws-sdk:{service}:{operation[0].lower()}{operation[1:]}"
    assert got["Target"]["RoleArn"] == created["Role"]["Arn"]
    assert json.loads(got["Target"]["Input"]) == request
    stored = iam.get_role_policy(RoleName=f"{stack}-expiry", PolicyName=policy.inputs["name"])["PolicyDocument"]
    assert stored["Statement"][0]["Action"] == action


def test_a_stack_that_does_not_expire_has_no_schedule():
    run = plan_for("b300-prod")
    assert "expiresAt" not in run.outputs
    assert not [r for r in run.resources if r.type == SCHEDULE or "expiry" in r.name]


def test_pulumi_up_after_the_expiry_is_refused_in_one_line():
    expires = "2026-12-03T12:00:00Z"
    assert expiry.check_not_expired(expires, FIXED_NOW, key="trialTtlHours") == expires
    with pytest.raises(ConfigError) as info:
        expiry.check_not_expired(expires, datetime(2026, 12, 3, 12, 0, tzinfo=UTC), key="trialTtlHours")
    msg = str(info.value)
    assert msg.startswith("kimi-deploy:trialTtlHours: 'expired at 2026-12-03T12:00:00Z' is past (now 2026-12-03T12:00:00Z)")
    assert "`pulumi destroy`" in msg and "kimi-deploy:expiresAt" in msg and "\n" not in msg


def test_the_ec2_instance_reads_its_expiry_from_a_parameter_it_may_read():
    """The expiry is an SSM String parameter the instance role may read (so extending a trial
    changes no launch template); the user data names the parameter, never the time."""
    run = plan_for("b300")
    param = run.named("gpu-expires-at")
    assert param.inputs["type"] == "String" and param.inputs["insecureValue"] == run.outputs["expiresAt"]
    boot = json.loads(run.named("gpu-role-boot-secrets").inputs["policy"])
    resources = [r for st in boot["Statement"] for r in ([st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"])]
    assert any(r.endswith(f"parameter{param.inputs['name']}") for r in resources), resources
    import base64

    text = base64.b64decode(run.named("gpu-lt").inputs["userData"]).decode()
    assert param.inputs["name"] in text and run.outputs["expiresAt"] not in text


# --- the instance's own check: watch.sh against stand-ins -------------------------------------


class _Health:
    """A /health on 127.0.0.1 that answers 200 until ``hang`` is set, then never answers."""

    def __init__(self):
        self.hang = threading.Event()
        self.release = threading.Event()
        health = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if health.hang.is_set():
                    health.release.wait()  # the process is up, the engine does not answer
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _stand_ins(tmp_path: Path, *, active_since: datetime, expires_at: str | None = None) -> dict[str, str]:
    """A ``systemctl`` that answers for an active unit and records restart/poweroff, an ``aws``
    that answers the expiry parameter (or fails), and the script's two files under ``tmp_path``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    since = active_since.strftime("%a %Y-%m-%d %H:%M:%S UTC")
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$1" in\n'
        "  is-active) echo active ;;\n"
        f'  show) case "$3" in InvocationID) echo run-1 ;; *) echo "{since}" ;; esac ;;\n'
        "esac\n"
    )
    answer = f'echo "{expires_at}"' if expires_at else "exit 254"
    (bin_dir / "aws").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'aws-calls'}\n{answer}\n")
    for exe in ("systemctl", "aws"):
        (bin_dir / exe).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KIMI_SYSTEMCTL": str(bin_dir / "systemctl"),
        "KIMI_WATCH_STATE": str(tmp_path / "run/watch.state"),
        "KIMI_WATCH_EXPIRY": str(tmp_path / "lib/expires-at"),
    }


def _watch(tmp_path: Path, env: dict[str, str], url: str, *, budget: int, parameter: str = "-") -> list[str]:
    """Run watch.sh once (as the timer does); return the systemctl calls that change something."""
    script = tmp_path / "watch.sh"
    script.write_text(userdata.without_comments(userdata.watch_script()))
    script.chmod(0o755)
    args = [parameter, "us-east-1", url, str(budget), str(userdata.WATCH_FAILURES_BEFORE_RESTART), "1", "kimi-vllm.service"]
    proc = subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return [c for c in calls if c.split()[0] in ("restart", "poweroff")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_watchdog_restarts_a_hung_engine_after_n_failed_checks(tmp_path):
    env = _stand_ins(tmp_path, active_since=datetime.now(UTC) - timedelta(hours=2))
    with _Health() as health:
        for _ in range(3):
            assert _watch(tmp_path, env, health.url, budget=3600) == []  # healthy: nothing happens
        health.hang.set()  # the process stays up; /health stops answering
        for _ in range(userdata.WATCH_FAILURES_BEFORE_RESTART - 1):
            assert _watch(tmp_path, env, health.url, budget=3600) == []
        assert _watch(tmp_path, env, health.url, budget=3600) == ["restart --no-block kimi-vllm.service"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_watchdog_waits_out_the_startup_budget_of_an_engine_that_never_answered(tmp_path):
    env = _stand_ins(tmp_path, active_since=datetime.now(UTC) - timedelta(minutes=5))
    with _Health() as health:
        health.hang.set()
        for _ in range(userdata.WATCH_FAILURES_BEFORE_RESTART + 1):
            assert _watch(tmp_path, env, health.url, budget=3600) == []  # still loading: 5 min of a 1 h budget
        for _ in range(userdata.WATCH_FAILURES_BEFORE_RESTART - 1):
            assert _watch(tmp_path, env, health.url, budget=60) == []  # past a 1 min budget: failures count
        assert _watch(tmp_path, env, health.url, budget=60) == ["restart --no-block kimi-vllm.service"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_instance_powers_off_once_its_expiry_has_passed_and_keeps_the_last_value(tmp_path):
    past = (datetime.now(UTC) - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with _Health() as health:
        (tmp_path / "a").mkdir()
        env = _stand_ins(tmp_path / "a", active_since=datetime.now(UTC), expires_at=future)
        assert _watch(tmp_path / "a", env, health.url, budget=3600, parameter="/kimi-deploy/b300/expires-at") == []
        asked = (tmp_path / "a/aws-calls").read_text()
        assert "ssm get-parameter --region us-east-1 --name /kimi-deploy/b300/expires-at" in asked
        assert (tmp_path / "a/lib/expires-at").read_text().strip() == future

        (tmp_path / "b").mkdir()
        env = _stand_ins(tmp_path / "b", active_since=datetime.now(UTC), expires_at=past)
        assert _watch(tmp_path / "b", env, health.url, budget=3600, parameter="/kimi-deploy/b300/expires-at") == ["poweroff"]

        # SSM does not answer: the last value read still powers the instance off.
        (tmp_path / "c").mkdir()
        env = _stand_ins(tmp_path / "c", active_since=datetime.now(UTC))
        (tmp_path / "c/lib").mkdir()
        (tmp_path / "c/lib/expires-at").write_text(past + "\n")
        assert _watch(tmp_path / "c", env, health.url, budget=3600, parameter="/kimi-deploy/b300/expires-at") == ["poweroff"]
        # ... and with nothing read ever, nothing happens (never a power-off on an empty value).
        (tmp_path / "d").mkdir()
        env = _stand_ins(tmp_path / "d", active_since=datetime.now(UTC))
        assert _watch(tmp_path / "d", env, health.url, budget=3600, parameter="/kimi-deploy/b300/expires-at") == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt: systemd)")
def test_the_watch_units_pass_systemd_analyze_verify(tmp_path):
    from tests.unit_verify import verify_units

    files = _user_data_files(plan_for("b300"))
    units = {p.rsplit("/", 1)[1]: t for p, t in files.items() if p.rsplit("/", 1)[1] in userdata.WATCH_UNITS}
    assert set(units) == set(userdata.WATCH_UNITS)
    proc, ours = verify_units(units, tmp_path / "root", (userdata.WATCH_SCRIPT,), {})
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr
    timer = units["kimi-watch.timer"]
    assert f"OnUnitActiveSec={userdata.WATCH_INTERVAL_SECONDS}" in timer and "WantedBy=timers.target" in timer
    service = units["kimi-watch.service"]
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart=")).split("=", 1)[1].split()
    spec = plan_for("b300").context
    assert exec_start == [userdata.WATCH_SCRIPT, "/kimi-deploy/b300/expires-at", "us-east-1", "http://127.0.0.1:8000/health",
                          str(spec.sizing.startup_budget_seconds), str(userdata.WATCH_FAILURES_BEFORE_RESTART),
                          str(userdata.WATCH_TIMEOUT_SECONDS), "kimi-vllm.service"]
    # Enabled by the user data, so it runs at every boot.
    import yaml

    doc = yaml.safe_load(_user_data_text(plan_for("b300")))
    assert ["systemctl", "enable", "--now", "kimi-watch.timer"] in doc["runcmd"]


def _user_data_text(run) -> str:
    import base64

    return base64.b64decode(run.named("gpu-lt").inputs["userData"]).decode()


def _user_data_files(run) -> dict[str, str]:
    import yaml

    return {f["path"]: f["content"] for f in yaml.safe_load(_user_data_text(run))["write_files"]}


def test_the_plan_says_what_stops_at_the_expiry_and_what_keeps_billing():
    from scripts.ops import plan as plan_script

    ec2 = plan_script.build_plan_document("b300", now=FIXED_NOW)["at_expiry"]
    assert ec2.startswith("the GPU instance stops (EventBridge Scheduler: ec2:StopInstances")
    assert "still billing:" in ec2 and "NAT gateway" in ec2 and "`pulumi up` is refused after it" in ec2
    eks = plan_script.build_plan_document("gb300", now=FIXED_NOW)["at_expiry"]
    assert eks.startswith("the GPU node group scales to 0") and "EKS cluster" in eks
    assert plan_script.build_plan_document("b300-prod", now=FIXED_NOW)["at_expiry"] is None


def test_a_trial_on_an_existing_cluster_says_nothing_stops_its_gpus(tmp_path):
    """New-user trial t762: a mi355x trial said "the sweeper acts on the expires-at tag"; the
    sweeper sweeps AWS regions only, so the cluster's GPU workload runs on after the expiry."""
    from scripts.ops import plan as plan_script

    text = (REPO_ROOT / "stacks" / "Pulumi.mi355x.yaml").read_text()
    assert "kimi-deploy:environment: staging" in text
    (tmp_path / "Pulumi.t762.yaml").write_text(text.replace("kimi-deploy:environment: staging", "kimi-deploy:environment: trial"))
    said = plan_script.build_plan_document("t762", now=FIXED_NOW, stacks_dir=tmp_path)["at_expiry"]
    assert said == ("nothing stops by itself: the sweeper only sweeps AWS, so the GPU workload on this cluster keeps "
                    "running (its GPUs allocated) after the expiry; stop it with `pulumi destroy --stack t762`")


def test_an_autoscaled_eks_trial_stays_stopped_the_node_group_stops_launching(moto_server, fake_aws_env):
    """maxSize cannot go below 1 (EKS), so the scale to zero alone lets a cluster autoscaler raise
    the desired size for a pending pod. A second schedule at the same expiry suspends the Launch
    process of the node group's Auto Scaling group: rendered, created in moto, and its request run
    against moto's Auto Scaling API leaves the group unable to launch."""
    import boto3
    import botocore.session

    eks_model = botocore.session.get_session().get_service_model("eks").shape_for("NodegroupScalingConfig")
    assert eks_model.members["maxSize"].metadata["min"] == 1  # why the scale to zero alone cannot hold
    run = plan_for("gb300")
    stop, _, _ = _expiry_resources(run)
    schedule, role, policy = _expiry_resources(run, launch=True)
    assert schedule.inputs["scheduleExpression"] == stop.inputs["scheduleExpression"]
    target = schedule.inputs["target"]
    assert target["arn"] == "arn:aws:scheduler:::aws-sdk:autoscaling:suspendProcesses"
    request = json.loads(target["input"])
    model = botocore.session.get_session().get_service_model("autoscaling").operation_model("SuspendProcesses").input_shape
    _check_request(request, model)
    group = run.named("eks-gpu")
    asg_name = f"eks-{group.name}-20261130-0123abcd-0123-4567-89ab-0123456789ab"
    assert request == {"AutoScalingGroupName": asg_name, "ScalingProcesses": ["Launch"]}
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == "autoscaling:SuspendProcesses"
    assert statement["Resource"] == (
        f"arn:aws:autoscaling:us-east-1:*:autoScalingGroup:*:autoScalingGroupName/{asg_name}")
    assert "scheduler.amazonaws.com" in role.inputs["assumeRolePolicy"]

    # The schedule as rendered is accepted by the scheduler API.
    iam = boto3.client("iam", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    created = iam.create_role(RoleName="gb300-launch", AssumeRolePolicyDocument=role.inputs["assumeRolePolicy"])
    scheduler = boto3.client("scheduler", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    scheduler.create_schedule(
        Name="gb300-launch", ScheduleExpression=schedule.inputs["scheduleExpression"],
        ScheduleExpressionTimezone="UTC", FlexibleTimeWindow={"Mode": "OFF"},
        Target={"Arn": target["arn"], "RoleArn": created["Role"]["Arn"], "Input": target["input"]},
    )
    assert json.loads(scheduler.get_schedule(Name="gb300-launch")["Target"]["Input"]) == request

    # What the target does at the expiry, against an Auto Scaling group of that name.
    autoscaling = boto3.client("autoscaling", endpoint_url=moto_server.endpoint, region_name="us-east-1")
    autoscaling.create_launch_configuration(LaunchConfigurationName="gpu", ImageId="ami-12c6146b", InstanceType="t3.micro")
    autoscaling.create_auto_scaling_group(AutoScalingGroupName=asg_name, LaunchConfigurationName="gpu", MinSize=0,
                                          MaxSize=2, DesiredCapacity=0, AvailabilityZones=["us-east-1a"])
    autoscaling.suspend_processes(**request)
    [asg] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg_name])["AutoScalingGroups"]
    assert [p["ProcessName"] for p in asg["SuspendedProcesses"]] == ["Launch"]


def test_the_deploying_policy_may_resume_a_stopped_node_group():
    from scripts.ops.deploy_policy import declared, policy_document

    actions = json.dumps(policy_document(*declared("gb300", FIXED_NOW)))
    assert "autoscaling:ResumeProcesses" in actions and "scheduler:CreateSchedule" in actions
