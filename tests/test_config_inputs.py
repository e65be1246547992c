"""Inputs a new user gets wrong, each refused in one line that names the key, the value and what is
allowed (or, where valid, accepted): spellings of owned vLLM flags in ``vllm.extraArgs``, keys
the stack's platform does not read, resource ids, URLs, empty strings and booleans.

Every ``parse_spec`` call here is harvested into the recorded corpus (tests/config_corpus.py).
"""

from __future__ import annotations

import copy
import re

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import parse_spec
from components.core.vllm_options import OWNED_DESTS, OWNED_OPTIONS, owned_option
from tests.conftest import FIXED_NOW
from tests.test_config import reject  # one line naming the key, every fragment in it


def base(stack: str = "b300") -> dict:
    ns, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(ns)


def accept(config: dict, stack: str = "test"):
    return parse_spec(config, stack=stack, now=FIXED_NOW)


def with_extra(args: list[str], stack: str = "b300") -> dict:
    cfg = base(stack)
    cfg["vllm"] = {**cfg.get("vllm", {}), "extraArgs": args}
    return cfg


# --- vllm.extraArgs: by the destination vLLM's parser maps a spelling to --------------------------


@pytest.mark.parametrize(
    "args,option,how",
    [
        (["-tp", "4"], "-tp", ""),  # the short alias: vLLM reads TP 4, the plan sizes TP 8
        (["-tp=4"], "-tp", ""),
        (["--tensor_parallel_size", "4"], "--tensor-parallel-size", ""),  # `_` read as `-`
        (["--tensor-parallel=4"], "--tensor-parallel-size", "abbreviated"),  # argparse allow_abbrev
        (["--tensor-par", "4"], "--tensor-parallel-size", "abbreviated"),
        (["-t", "4"], "-tp", "abbreviated"),
        (["-pp", "2"], "-pp", ""),  # twice the GPUs of the copy the plan sizes
        (["-dp", "2"], "-dp", ""),
        (["-pcp", "2"], "-pcp", ""),
        (["-dcp", "8"], "-dcp", ""),
        (["--device-memory-utilization", "0.8"], "--device-memory-utilization", ""),  # an alias of --gpu-memory-...
        (["--max-model-len", "4096"], "--max-model-len", ""),
        (["--max_model_len=4096"], "--max-model-len", ""),
        (["--disable-prefix-caching"], "--disable-prefix-caching", ""),
        (["--no-enable-prefix-caching"], "--no-enable-prefix-caching", ""),
        (["--kv-cache-dtype", "auto"], "--kv-cache-dtype", ""),
        (["-n2"], "-n", "with its value attached"),  # --nnodes 2
        (["-r", "1"], "-r", ""),
        (["--port.x", "1"], "--port", ""),  # a dotted JSON argument is its option
        (["--served-model", "other"], "--served-model-name", "abbreviated"),
        (["--config", "/etc/vllm.yaml"], "--config", ""),
        (["--hf-token", "x"], "--hf-token", ""),
    ],
)
def test_extra_args_refuse_every_spelling_of_an_owned_flag(args, option, how):
    msg = reject(with_extra(["--max-num-seqs", "64", *args]), "vllm.extraArgs", f"sets {option}", "toolkit owns", how)
    assert repr(args[0]) in msg
    assert OWNED_DESTS[owned_option(args[0]).dest].instead in msg  # type: ignore[union-attr]


def test_extra_args_tp_names_where_the_layout_comes_from():
    msg = reject(with_extra(["-tp", "4"]), "vllm.extraArgs")
    assert msg == (
        "kimi-deploy:vllm.extraArgs: '-tp' sets -tp, vLLM's tensor_parallel_size, which the toolkit owns: the parallel "
        "layout is the target's (TP = GPUs per copy); more copies: compute.replicas"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs", "64"],
        ["--max-num-batched-tokens=8192"],
        ["--enable-chunked-prefill"],
        ["-dc", "{}"],  # --diffusion-config: an exact option wins over being a prefix of -dcp
        ["--compilation-config.mode", "3"],
        ["--override-generation-config", '{"temperature": 0.6}'],
        ["--disable-log-requests"],  # --middleware is refused: added after the guard, it runs before it (test_vllm_command)
    ],
)
def test_extra_args_accept_options_the_toolkit_does_not_own(args):
    spec = accept(with_extra(args))
    assert spec.config.vllm.extra_args == tuple(args)


@pytest.mark.parametrize("args,dest", [
    (["--load-format", "dummy"], "load_format"), (["--uds", "/tmp/vllm.sock"], "uds"), (["-q", "fp8"], "quantization"),
    (["--quantization=fp8"], "quantization"), (["--dtype", "float32"], "dtype"), (["--attention-config", "{}"],
                                                                                  "attention_config"),
    (["-ac.backend", "FLASHMLA_SPARSE"], "attention_config"), (["--attention-backend", "TRITON_MLA"], "attention_backend"),
    (["--data-parallel-size-local", "2"], "data_parallel_size_local"), (["-dpl", "2"], "data_parallel_size_local"),
    (["--dcp-comm-backend", "ag_rs"], "dcp_comm_backend"), (["--load_format", "dummy"], "load_format"),
])
def test_extra_args_that_replace_what_the_plan_sized_are_refused(args, dest):
    """A loader, listener, number format or attention backend other than the one the plan sizes and
    the probes reach (new-user trial: each was accepted and silently replaced the recipe's)."""
    reject(with_extra(args), "vllm.extraArgs", f"vLLM's {dest}, which the toolkit owns")


def test_extra_args_refuse_a_flag_and_value_in_one_item():
    reject(with_extra(["--max-num-seqs 64"]), "vllm.extraArgs", "'--max-num-seqs 64'", "its own list item")


def test_every_owned_option_string_is_refused_exactly():
    for option, dest in OWNED_OPTIONS.items():
        owned = owned_option(option)
        assert owned is not None and owned.dest == dest and owned.how == "exact", option
        assert owned_option(option + "=1") == owned


# --- resource ids, URLs, names: checked where they are given ---------------------------------------


@pytest.mark.parametrize(
    "network,key,fragment",
    [
        ({"allowedSecurityGroupIds": ["10.0.0.0/8"]}, "network.allowedSecurityGroupIds", "network.allowedCidrs"),
        ({"allowedSecurityGroupIds": ["sg-123"]}, "network.allowedSecurityGroupIds", "sg- and 8 or 17 hex digits"),
        ({"allowedSecurityGroupIds": ["sg-0123456789abcdef0", "sg-0123456789abcdef0"]},
         "network.allowedSecurityGroupIds", "twice"),
        ({"vpcId": "my-vpc", "privateSubnetIds": ["subnet-0123456789abcdef0"]}, "network.vpcId", "vpc- and 8 or 17"),
        ({"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["10.42.0.0/20"]}, "network.privateSubnetIds", "subnet-"),
        ({"vpcId": "vpc-0123456789ABCDEF0", "privateSubnetIds": ["subnet-0123456789abcdef0"]}, "network.vpcId", "hex"),
    ],
)
def test_resource_ids_are_ids_of_their_kind(network, key, fragment):
    cfg = base()
    cfg["network"] = {**cfg["network"], **network}
    reject(cfg, key, fragment)


def test_valid_resource_ids_pass():
    cfg = base()
    cfg["network"] = {**cfg["network"], "vpcId": "vpc-0123abcd", "privateSubnetIds": ["subnet-0123456789abcdef0"],
                      "allowedSecurityGroupIds": ["sg-0123456789abcdef0", "sg-89abcdef"]}
    assert accept(cfg).config.network.vpc_id == "vpc-0123abcd"


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("minio.storage.svc:9000", "http(s)"),
        ("ftp://minio.storage.svc", "http(s)"),
        ("http://", "with a host"),
        ("http://minio:99999", "is not a URL"),
        ("http://minio:9000/?versioning", "without a query"),
        ("http://minio.storage .svc:9000", "with a host"),
    ],
)
def test_mirror_endpoint_url_must_be_an_http_url(url, fragment):
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "kimi-weights",
                                                   "endpointUrl": url}}
    reject(cfg, "storage.mirror.endpointUrl", fragment, stack="mi355x")


@pytest.mark.parametrize("url", ["http://admin:s3cr3t@minio:9000", "https://key@minio.storage.svc", "http://a:b@minio:99999"])
def test_mirror_endpoint_url_with_credentials_is_refused_without_echoing_them(url):
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "kimi-weights",
                                                   "endpointUrl": url}}
    msg = reject(cfg, "storage.mirror.endpointUrl", "[URL with credentials]", "plain text", "service accounts",
                 stack="mi355x")
    assert "s3cr3t" not in msg and "key@" not in msg and "a:b" not in msg


def test_a_valid_endpoint_url_reaches_the_pods():
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "kimi-weights",
                                                   "endpointUrl": "https://minio.storage.svc:9000/s3",
                                                   "region": "us-east-1"}}
    cfg["kubernetes"] = {**cfg["kubernetes"], "mirrorCredentials": {"secret": {"name": "minio-keys"}}}
    assert accept(cfg).config.storage.mirror.endpoint_url == "https://minio.storage.svc:9000/s3"


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/", "http://169.254.170.2:9090", "http://[fe80::1]:9000",
                                 "http://[fd00:ec2::254]/"])
def test_a_link_local_host_is_no_mirror_endpoint_or_prometheus(url):
    # The instance metadata service answered as "a private address" (trial, round 6).
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "kimi-weights",
                                                   "endpointUrl": url}}
    reject(cfg, "storage.mirror.endpointUrl", "names a link-local host", stack="mi355x")
    cfg = base("mi355x")
    cfg["observability"] = {**cfg["observability"], "prometheusUrl": url}
    reject(cfg, "observability.prometheusUrl", "names a link-local host", stack="mi355x")


def test_prometheus_url_with_credentials_is_not_echoed():
    cfg = base("mi355x")
    cfg["observability"] = {**cfg["observability"], "prometheusUrl": "http://user:hunter2@prometheus:9090"}
    msg = reject(cfg, "observability.prometheusUrl", "[URL with credentials]", stack="mi355x")
    assert "hunter2" not in msg


@pytest.mark.parametrize(
    "mirror,key,fragment",
    [
        ({"enabled": True}, "storage.mirror.enabled", "needs an existing bucket"),
        ({"enabled": True, "bucketName": "kimi-weights"}, "storage.mirror.bucketName", "create: false"),
        ({"enabled": True, "bucketName": "kimi-weights", "create": True}, "storage.mirror.bucketName", "create: false"),
        ({"enabled": False, "bucketName": "kimi-weights"}, "storage.mirror.bucketName", "storage.mirror.enabled true"),
    ],
)
def test_a_mirror_an_existing_cluster_would_not_read_is_refused(mirror, key, fragment):
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": mirror}
    reject(cfg, key, fragment, stack="mi355x")


def test_an_existing_bucket_on_an_existing_cluster_is_read():
    cfg = base("mi355x")
    cfg["storage"] = {**cfg["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "kimi-weights",
                                                   "region": "eu-west-1"}}
    cfg["kubernetes"] = {**cfg["kubernetes"], "mirrorCredentials": {"serviceAccountName": "mirror-reader"}}
    assert accept(cfg).config.storage.mirror.bucket_name == "kimi-weights"


@pytest.mark.parametrize("name,fragment", [("", "is empty"), ("   ", "is empty"), ("kimi k3", "not a model name"),
                                            ("-kimi", "not a model name"), ("k" * 129, "1-128"), ('kimi"', "not a model name")])
def test_served_model_name_is_a_name_not_replaced_behind_the_users_back(name, fragment):
    cfg = base()
    cfg["model"] = {**cfg["model"], "servedModelName": name}
    reject(cfg, "model.servedModelName", fragment)


@pytest.mark.parametrize("name", ["kimi-k3.1-pro", "moonshotai/Kimi-K3.1-Pro", "team:kimi_v2"])
def test_served_model_names_clients_send_pass(name):
    cfg = base()
    cfg["model"] = {**cfg["model"], "servedModelName": name}
    assert accept(cfg).served_model_name == name


# --- booleans: one rule for every key, Pulumi's ------------------------------------------------------


def _boolean_keys() -> list[tuple[str, ...]]:
    """(camelCase path) of every boolean key of the model."""
    from pydantic import BaseModel

    from components.core.config import RawConfig

    out: list[tuple[str, ...]] = []

    def walk(model, prefix):
        for name, info in model.model_fields.items():
            key = (*prefix, info.alias or name)
            args = [info.annotation, *getattr(info.annotation, "__args__", ())]
            sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if sub is not None:
                walk(sub, key)
            elif "bool" in str(info.annotation):  # bool, StrictBool, StrictBool | None
                out.append(key)

    walk(RawConfig, ())
    return out


BOOLEAN_KEYS = _boolean_keys()


def test_the_boolean_keys_are_found():
    assert len(BOOLEAN_KEYS) >= 10
    assert ("network", "s3GatewayEndpoint") in BOOLEAN_KEYS and ("storage", "mirror", "enabled") in BOOLEAN_KEYS
    assert ("protect",) in BOOLEAN_KEYS and ("model", "licenseAcknowledged") in BOOLEAN_KEYS


@pytest.mark.parametrize("path", BOOLEAN_KEYS, ids=".".join)
@pytest.mark.parametrize("value", ["yes", "on", "no", "off", "1", "0", "true", 1, 0, "y"])
def test_every_boolean_key_takes_true_or_false_only(path, value):
    """Pulumi's rule (Config.get_bool: true/True/false/False as text; a JSON boolean inside a map):
    yes/on/no/0, and a boolean written as text inside a map, are refused by every key alike."""
    from tests.config_corpus import _set_path

    cfg = _set_path(base("mi355x" if path[0] in ("autoscaling", "observability") else "b300"), path, value)
    reject(cfg, ".".join(path), "is not a boolean (allowed: true, false)")


def test_top_level_booleans_read_as_pulumi_reads_them():
    from components.core.config.reader import read_config_strings

    ns, _ = read_config_strings({"kimi-deploy:protect": "True"})
    assert ns["protect"] is True
    with pytest.raises(ConfigError, match="kimi-deploy:protect: 'yes' is not a boolean"):
        read_config_strings({"kimi-deploy:protect": "yes"})


# --- messages that name the right key ----------------------------------------------------------------


@pytest.mark.parametrize("stack", ["b300", "gb300", "b300-prod"])
def test_a_region_that_does_not_exist_is_the_regions_error_not_the_zones(stack):
    cfg = base(stack)
    cfg["region"] = "us-east-9"
    reject(cfg, "aws:region", "'us-east-9' is not an AWS region", "did you mean us-east-")


def test_a_region_that_does_not_offer_the_instance_is_named_before_its_zone():
    cfg = base()
    cfg["region"] = "eu-west-1"  # b300's AZ us-east-1a stays: the region is what changed
    reject(cfg, "aws:region", "does not offer p6-b300.48xlarge", "offered in:")


def test_a_zone_of_another_offering_region_is_the_zones_error():
    cfg = base()
    cfg["region"] = "us-west-2"
    reject(cfg, "compute.availabilityZone", "'us-east-1a' is not in region us-west-2")


def test_aws_regions_are_botocores():
    import botocore.session

    from components.core.targets import AWS_REGIONS

    session = botocore.session.get_session()
    known = {r for p in session.get_available_partitions() for r in session.get_available_regions("ec2", partition_name=p)}
    assert set(AWS_REGIONS) == known


def test_an_oversized_user_data_names_the_value_that_makes_it_so():
    """aws-ec2's user data is limited to 16 KB: the error names the longest value it carries."""
    from components.aws.compute import USER_DATA_LIMIT_BYTES, check_ec2_user_data
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    cfg = base()
    vllm = {k: v for k, v in cfg["vllm"].items() if k != "imageTag"}
    import random
    rng = random.Random(5)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(40_000))
    # Incompressible: over 16 KB the user data goes gzip-compressed, and the limit applies to that.
    cfg["vllm"] = {**vllm, "image": "registry.example.com/" + letters + ":nightly-" + "0" * 40}
    spec = accept(cfg)
    sizing = compute_sizing(spec)
    with pytest.raises(ConfigError) as err:
        check_ec2_user_data(spec, build_vllm_command(spec, sizing), sizing, hub_token_set=True)
    assert str(err.value).startswith("kimi-deploy:vllm.image: ") and f"{USER_DATA_LIMIT_BYTES:,}" in str(err.value)


# --- YAML as the Pulumi CLI reads it -------------------------------------------------------------------


def test_yaml_merge_keys_are_read_as_the_pulumi_cli_reads_them(tmp_path):
    """go-yaml v3 (the Pulumi CLI) reads `<<: *anchor` merge keys; a key written beside the merge
    wins over the merged one; a key written twice in one map is still refused."""
    from components.core.load import load_stack

    text = (REPO_STACKS / "Pulumi.b300.yaml").read_text()
    text = text.replace("  kimi-deploy:vllm:\n", "  kimi-deploy:vllm:\n    <<: {port: 9000, maxModelLen: 262144}\n", 1)
    text = text.replace("    decodeContextParallelSize: 1 ", "    port: 8000\n    decodeContextParallelSize: 1 ", 1)
    (tmp_path / "Pulumi.m.yaml").write_text(text)
    spec = load_stack("m", stacks_dir=tmp_path, now=FIXED_NOW)
    assert spec.config.vllm.port == 8000 and spec.config.vllm.max_model_len == 262_144
    anchored = text.replace("  kimi-deploy:network:\n", "  kimi-deploy:network: &net\n", 1)
    (tmp_path / "Pulumi.a.yaml").write_text(anchored + "  kimi-deploy:timeToReady:\n    <<: {copyGBps: 2.0}\n")
    assert load_stack("a", stacks_dir=tmp_path, now=FIXED_NOW).config.time_to_ready.copy_gbps == 2.0
    (tmp_path / "Pulumi.d.yaml").write_text(text.replace("    port: 8000", "    port: 8000\n    port: 8001", 1))
    with pytest.raises(ConfigError, match="duplicate key 'port'"):
        load_stack("d", stacks_dir=tmp_path, now=FIXED_NOW)


REPO_STACKS = __import__("pathlib").Path(__file__).resolve().parents[1] / "stacks"


# --- S3 names that reach the node's shell and AWS's API --------------------------------------------------


@pytest.mark.parametrize("prefix", ["m';echo INJECTED-$(id -un);'", "a$(id)x'y", "models/", "/models", "models//k3",
                                    "models/../x", "mod els", "models;rm", "mödels", ""])
def test_a_mirror_prefix_is_s3_safe_characters_only(prefix):
    cfg = base("b300")
    cfg["storage"] = {**cfg["storage"], "mirror": {**cfg["storage"]["mirror"], "prefix": prefix}}
    reject(cfg, "storage.mirror.prefix", "letters, digits, '.', '_' and '-' joined by '/'")


@pytest.mark.parametrize("prefix", ["models", "team-a/models_v2", "k3.1/weights"])
def test_mirror_prefixes_people_use_pass(prefix):
    cfg = base("b300")
    cfg["storage"] = {**cfg["storage"], "mirror": {**cfg["storage"]["mirror"], "prefix": prefix}}
    assert accept(cfg).config.storage.mirror.prefix == prefix


@pytest.mark.parametrize("bucket,why", [("192.168.1.1", "IP address"), ("xn--bucket", "prefix xn--"),
                                        ("bucket-s3alias", "suffix -s3alias"), ("my..bucket", "two adjacent periods"),
                                        ("sthree-x", "prefix sthree-"), ("b--ol-s3", "suffix --ol-s3"),
                                        ("Bucket", "lowercase"), ("ab", "3-63")])
def test_bucket_names_s3_refuses_are_refused_naming_the_rule(bucket, why):
    cfg = base("b300")
    cfg["storage"] = {**cfg["storage"], "mirror": {**cfg["storage"]["mirror"], "create": False, "bucketName": bucket}}
    reject(cfg, "storage.mirror.bucketName", why)


def test_a_trial_ttl_outside_a_trial_is_refused_naming_the_environment():
    cfg = base("b300")
    cfg["environment"], cfg["trialTtlHours"] = "staging", 24  # 72, the default, is no setting
    cfg["model"] = {**cfg["model"], "revision": "4f1e2d3c" * 5}
    reject(cfg, "trialTtlHours", "is read only with environment trial", "this stack's environment is staging")


def test_a_capacity_block_that_ends_before_the_trial_expires_is_said():
    from datetime import UTC, datetime

    cfg = base("gb300")  # a capacity block; the trial lives trialTtlHours after `pulumi up`
    cfg["compute"] = {**cfg["compute"], "capacity": {**cfg["compute"]["capacity"], "endsAt": "2026-12-01T03:00:00Z"}}
    spec = parse_spec(cfg, stack="t", now=datetime(2026, 12, 1, tzinfo=UTC))
    assert any("terminated from 2026-12-01T02:30:00Z" in w and "before the trial expires (trialTtlHours 48 h" in w
               for w in spec.warnings), spec.warnings


def test_a_measured_kv_cache_smaller_than_one_sequence_is_refused():
    """vLLM refuses to start when one max_model_len sequence does not fit (kv_cache_planning.py); a
    measured count below it is a config error, not '0 x 1,048,576-token sequences (measured)'."""
    from components.core.sizing import compute_sizing

    cfg = base("b300")
    cfg["vllm"] = {**cfg["vllm"], "kvCacheTokens": 1000}
    with pytest.raises(ConfigError) as info:
        compute_sizing(accept(cfg))
    assert str(info.value).startswith("kimi-deploy:vllm.kvCacheTokens: 1000 holds fewer tokens than one ")
    cfg["vllm"] = {**cfg["vllm"], "kvCacheTokens": 2_000_000}
    assert compute_sizing(accept(cfg)).full_context_sequences >= 1


@pytest.mark.parametrize("stack,key,value,fragment", [
    ("b300", "network.allowedCidrs", ["1.2.3.4"], "write its prefix length (e.g. 1.2.3.4/32)"),
    ("b300", "network.allowedCidrs", ["10.0.0.0/8", "10.0.0.0/8"], "is listed twice"),
    ("gb300", "network.apiServerPublicCidrs", ["198.51.100.7"], "write its prefix length (e.g. 198.51.100.7/32)"),
])
def test_cidr_blocks_aws_would_refuse_are_refused_before_pulumi_up(stack, key, value, fragment):
    cfg = base(stack)
    section, name = key.split(".")
    cfg[section] = {**cfg.get(section, {}), name: value}
    reject(cfg, key, fragment)


@pytest.mark.parametrize("namespace", ["default", "kube-system", "kube-public", "kube-node-lease"])
def test_a_namespace_the_cluster_owns_is_refused(namespace):
    """The stack creates its namespace and deletes it on destroy (new-user trial: kube-system accepted)."""
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "namespace": namespace}
    reject(cfg, "kubernetes.namespace", "is one the cluster owns", "deletes it on `pulumi destroy`")


@pytest.mark.parametrize("stack", ["mi355x", "gb300"])
@pytest.mark.parametrize("key", ["prometheusNamespace", "grafanaNamespace"])
def test_the_observability_namespace_is_refused_as_the_stacks_namespace(stack, key):
    """New-user trial t408: `namespace: monitoring` beside `prometheusNamespace: monitoring` was
    accepted; the stack declares its namespace, so destroying it would delete the monitoring stack."""
    cfg = base(stack)
    cfg["kubernetes"] = {**cfg.get("kubernetes", {}), "namespace": "monitoring"}
    other = "grafanaNamespace" if key == "prometheusNamespace" else "prometheusNamespace"
    cfg["observability"] = {**cfg.get("observability", {}), key: "monitoring", other: "observability"}
    reject(cfg, "kubernetes.namespace", f"is observability.{key}, the observability stack's namespace",
           "deletes it on `pulumi destroy`")
    cfg["kubernetes"]["namespace"] = "kimi"
    accept(cfg)


@pytest.mark.parametrize("path", ["/etc", "/root/nvme", "/proc", "/usr/local/nvme", "/tmp/x", "/boot"])
def test_an_nvme_host_path_in_a_system_directory_is_refused(path):
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "nvmeHostPath": path}
    reject(cfg, "kubernetes.nvmeHostPath", "lies in the host's system directory")


@pytest.mark.parametrize("path,fragment", [
    ("//var/lib/kubelet", "lies in the node's own state at /var/lib/kubelet (read as /var/lib/kubelet)"),
    ("/var//lib/./kubelet/", "lies in the node's own state at /var/lib/kubelet"),
    ("/var/run", "lies in the host's system directory /run (read as /run)"),
    ("/var/run/nvme", "lies in the host's system directory /run (read as /run/nvme)"),
    ("/var/lib", "holds the node's own state at /var/lib/kubelet"),
    ("/var", "holds the node's own state at /var/lib/kubelet"),
    ("//", "is the root directory: must be an absolute path below /"),
    ("/mnt/nvme ", "holds whitespace or a control character"),
    ("/mnt/nvme\n", "holds whitespace or a control character"),
    ("/mnt/\tnvme", "holds whitespace or a control character"),
])
def test_an_nvme_host_path_is_checked_in_its_normal_spelling(path, fragment):
    """New-user trial: /var/lib/kubelet was refused but //var/lib/kubelet, /var/run (= /run), /var/lib, /var and a
    trailing space or newline passed (DirectoryOrCreate then puts 1.56 TB on the root disk, or in RAM under /run)."""
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "nvmeHostPath": path}
    reject(cfg, "kubernetes.nvmeHostPath", fragment)


def test_every_host_path_check_reads_the_one_normal_spelling():
    from components.core import node_storage as ns

    assert ns.normal_host_path("//var/./run//containerd/") == "/run/containerd"
    assert ns.state_containing("//var/lib/kubelet") == "/var/lib/kubelet"
    assert ns.state_containing("/var/run/containerd/x") == "/run/containerd"
    assert ns.system_dir_containing("/var/run") == "/run"
    assert ns.exposed_node_state("//var/lib/", "/mnt/k8s-disks/0") == "/var/lib/kubelet"


@pytest.mark.parametrize("path", ["/mnt/nvme", "/local/nvme0", "/data", "/var/lib/nvme", "/opt/raid0"])
def test_nvme_host_paths_people_use_pass(path):
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "nvmeHostPath": path}
    assert accept(cfg).config.kubernetes.nvme_host_path == path


@pytest.mark.parametrize("key,value,fragment", [
    ("usdPerHour", 100, "use compute.usdPerHour (on-demand and ODCR instances bill at the on-demand rate)"),
    ("endsAt", "2026-12-10T00:00:00Z", "'2026-12-10T00:00:00Z' is read only with compute.capacity.type capacity-block"),
])
def test_capacity_block_keys_off_a_capacity_block_are_refused(key, value, fragment):
    """New-user trial: a block price on an on-demand stack was used and labelled a capacity block price."""
    cfg = base("b300")
    cfg["compute"] = {**cfg.get("compute", {}), "capacity": {"type": "on-demand", key: value}}
    reject(cfg, f"compute.capacity.{key}", fragment)


@pytest.mark.parametrize("stack,arch,ok", [("b300-prod", "arm64", False), ("b300-prod", "amd64", True),
                                           ("gb300", "amd64", False), ("gb300", "arm64", True), ("mi355x", "arm64", False)])
def test_a_node_selector_for_another_cpu_architecture_is_refused(stack, arch, ok):
    """kubernetes.io/arch (the node's GOARCH) against the target's instances (EC2 x86_64 = amd64,
    Grace = arm64): new-user trial, arm64 on x86 b300-prod planned pods no node would take."""
    cfg = base(stack)
    cfg["kubernetes"] = {**cfg["kubernetes"], "nodeSelector": {**cfg["kubernetes"].get("nodeSelector", {}),
                                                               "kubernetes.io/arch": arch}}
    if ok:
        accept(cfg)
    else:
        reject(cfg, "kubernetes.nodeSelector.kubernetes.io/arch", "is not the CPU architecture of target")


@pytest.mark.parametrize("stack,addon", [("b300-prod", "amd-gpu-operator"), ("mi355x", "nvidia-gpu-operator"),
                                         ("mi355x", "nvidia-dra-driver")])
def test_gpu_software_of_the_other_vendor_is_refused(stack, addon):
    cfg = base(stack)
    cfg["kubernetes"] = {**cfg["kubernetes"], "installedAddons": [addon]}
    reject(cfg, "kubernetes.installedAddons", "GPU software; target")


@pytest.mark.parametrize("image", [
    "ghcr.io/anyone/vllm-openai:v0.34.0",
    "registry.example.com/vllm/vllm-openai:v0.34.0",
    "127.0.0.1:5000/vllm/vllm-openai:v0.34.0",
    "docker.io/someone/vllm-openai:v0.34.0",
])
def test_a_release_tag_outside_vllms_repository_is_not_the_release(image):
    """Registries are trusted by name (new-user trial: a third party's v0.34.0 planned as deployable, and that image
    receives the API key and the weights)."""
    cfg = base("b300")
    cfg["vllm"] = {**{k: v for k, v in cfg.get("vllm", {}).items() if k != "imageTag"}, "image": image}
    reject(cfg, "vllm.image", "is not from vLLM's release repository vllm/vllm-openai (Docker Hub)", "@sha256:")


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.34.0", "docker.io/vllm/vllm-openai:v0.34.0",
                                   "index.docker.io/vllm/vllm-openai:v0.34.0"])
def test_vllms_own_release_on_docker_hub_is_the_release(image):
    cfg = base("b300")
    cfg["vllm"] = {**{k: v for k, v in cfg.get("vllm", {}).items() if k != "imageTag"}, "image": image}
    spec = accept(cfg)
    assert spec.blockers == () and spec.config.vllm.image == image


def test_another_registrys_build_pinned_by_digest_stays_a_non_release():
    cfg = base("b300")
    image = "ghcr.io/anyone/vllm-openai@sha256:" + "a" * 64
    cfg["vllm"] = {**{k: v for k, v in cfg.get("vllm", {}).items() if k != "imageTag"}, "image": image}
    assert any("not a release" in w for w in accept(cfg).warnings)


# --- autoscaling windows read with KEDA's own cron rules (robfig/cron v3)


def _window(start: str, min_replicas: int = 0, end: str = "0 20 * * *"):
    from tests.test_autoscaling import spec_with

    return spec_with("b300-prod", {"kimi-deploy:autoscaling": {
        "enabled": True, "minReplicas": min_replicas, "maxReplicas": 3, "schedule": [{"start": start, "end": end}]}})


@pytest.mark.parametrize("start,fragment", [
    ("*/0 8 * * *", "has minute step 0 in '*/0': KEDA's cron parser refuses it"),
    ("0 5-1 * * *", "has hour range '5-1' running backwards (5 > 1)"),
    ("0 8 1-2-3 * *", "has day-of-month '1-2-3' with two '-'"),
    ("0 8 * foo *", "has month 'foo', which KEDA's cron parser (robfig/cron v3) cannot read"),
    ("0 8 30 2 *", "names no day that exists (day-of-month 30 in month 2): the window never opens"),
    ("0 8 31 4 *", "names no day that exists (day-of-month 31 in month 4)"),
    ("0 8 31 apr,jun *", "names no day that exists"),
])
def test_a_window_keda_refuses_or_that_never_opens_is_refused(start, fragment):
    """New-user trial: `*/0` and `5-1`, which KEDA's parser refuses, were accepted; `30 2` and `31 4` with
    minReplicas 0 left the deployment without a replica forever."""
    with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
        _window(start)
    assert str(err.value).startswith("kimi-deploy:autoscaling.schedule.0.start: ") and "\n" not in str(err.value)


def test_windows_that_open_pass_and_rare_ones_are_warned():
    assert _window("0 8 30 2 1").config.autoscaling.schedule[0].start == "0 8 30 2 1"  # day-of-week ORs: Mondays
    assert any("never opens" in w for w in _window("0 8 31 4 *", min_replicas=1).warnings)
    assert any("29 February only" in w for w in _window("0 8 29 2 *").warnings)
    assert _window("15/20 8-18/2 ? JAN-mar MON-fri").warnings is not None


def test_cron_fields_follow_robfig_cron():
    from components.core.config.scaling import cron_field

    assert cron_field("15/20", "minute", 0, 59) == (frozenset({15, 35, 55}), False)
    assert cron_field("*", "hour", 0, 23)[1] and not cron_field("*/2", "hour", 0, 23)[1]
    assert cron_field("mon-FRI", "day-of-week", 0, 6)[0] == frozenset(range(1, 6))


# --- YAML bounded before it is built (go-yaml refuses excessive aliasing and nesting)


def _alias_bomb() -> str:
    text, previous = 'config:\n  kimi-deploy:a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n', "a"
    for name in "bcdefghi":
        text += f"  kimi-deploy:{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
        previous = name
    return text


@pytest.mark.parametrize("text,fragment", [
    (_alias_bomb(), "expands its aliases to more than 100,000 nodes (from line 7;"),
    ("config: " + "[" * 5000 + "]" * 5000 + "\n", "nests collections more than 100 deep (line 1;"),
    ("config:\n  kimi-deploy:x: &d " + "[" * 60 + "]" * 60 + "\n  kimi-deploy:y: " + "[" * 60 + "*d" + "]" * 60 + "\n",
     "nests collections more than 100 deep through alias *d (line 3)"),
])
def test_a_yaml_bomb_or_deep_nesting_is_one_line_before_it_is_built(text, fragment, tmp_path):
    """New-user trial: a 12-line alias bomb ran 68 s into a MemoryError; 5,000 nested brackets a RecursionError."""
    (tmp_path / "Pulumi.bomb.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
        read_stack_config("bomb", stacks_dir=tmp_path)
    assert str(err.value).startswith("--stack: 'bomb' file ") and "\n" not in str(err.value)


def test_anchors_and_merge_keys_a_stack_file_uses_still_read(tmp_path):
    (tmp_path / "Pulumi.anchors.yaml").write_text(
        "config:\n  kimi-deploy:compute: &c {replicas: 1}\n  kimi-deploy:network: {<<: *c, vpcCidr: 10.0.0.0/16}\n")
    assert read_stack_config("anchors", stacks_dir=tmp_path)["kimi-deploy:network"] == {"replicas": 1, "vpcCidr": "10.0.0.0/16"}


# --- accepted and ignored: refused or warned in one line naming both keys (new-user trial, round five)


@pytest.mark.parametrize("stack,section,values,words", [
    ("b300", None, {"trialTtlHours": 12, "expiresAt": "2026-12-01T20:00:00Z"},
     "trialTtlHours 12 is ignored beside expiresAt"),
    ("b300", "network", {"vpcCidr": "10.50.0.0/16", "vpcId": "vpc-0123456789abcdef0",
                         "privateSubnetIds": ["subnet-0123456789abcdef0"]},
     "network.vpcCidr 10.50.0.0/16 is ignored beside network.vpcId"),
])
def test_a_key_set_beside_the_key_that_makes_it_unread_is_warned(stack, section, values, words):
    cfg = base(stack)
    if section is None:
        cfg.update(values)
    else:
        cfg[section] = {**cfg.get(section, {}), **values}
    assert [w for w in accept(cfg).warnings if words in w], accept(cfg).warnings


@pytest.mark.parametrize("cidr,fragment", [
    ("127.0.0.0/8", "is a loopback block"), ("169.254.0.0/16", "is a link-local block"), ("224.0.0.0/8", "multicast"),
])
def test_allowed_cidrs_no_client_can_come_from_are_refused(cidr, fragment):
    cfg = base("b300")
    cfg["network"] = {**cfg["network"], "allowedCidrs": [cidr]}
    reject(cfg, "network.allowedCidrs", fragment)


@pytest.mark.parametrize("cidr,kind", [
    ("::ffff:0:0/96", "IPv4-mapped"), ("::ffff:0:0/104", "IPv4-mapped"), ("64:ff9b::/96", "NAT64"), ("2002::/16", "6to4"),
])
def test_ipv6_blocks_that_stand_for_ipv4_addresses_are_refused_whatever_their_prefix(cidr, kind):
    # ::ffff:0:0/96 is every IPv4 address; as an IPv6 /96 it passed the breadth rules (trial, round 6).
    cfg = base("b300")
    cfg["network"] = {**cfg["network"], "allowedCidrs": [cidr]}
    reject(cfg, "network.allowedCidrs", f"is in the {kind} range", "write the IPv4 client block itself")


def test_allowed_cidrs_beyond_what_a_security_group_holds_are_refused_and_above_its_quota_warned():
    cfg = base("b300")
    cfg["network"] = {**cfg["network"], "allowedCidrs": [f"10.{i // 256}.{i % 256}.0/24" for i in range(10_000)]}
    reject(cfg, "network.allowedCidrs", "is more than 1,000, the most rules a security group may hold")
    cfg["network"]["allowedCidrs"] = cfg["network"]["allowedCidrs"][:61]
    assert any("default quota of 60 inbound rules" in w for w in accept(cfg).warnings)


def test_an_api_server_public_cidr_listed_twice_is_refused():
    cfg = base("b300-prod")
    cfg["network"] = {**cfg["network"], "apiServerPublicCidrs": ["198.51.100.7/32", "198.51.100.7/32"]}
    reject(cfg, "network.apiServerPublicCidrs", "is listed twice")


@pytest.mark.parametrize("prefix", [".", "a/./b", "./a"])
def test_a_mirror_prefix_with_a_dot_segment_is_refused(prefix):
    cfg = base("b300")
    cfg["storage"] = {**cfg.get("storage", {}), "mirror": {**cfg.get("storage", {}).get("mirror", {}), "prefix": prefix}}
    reject(cfg, "storage.mirror.prefix", "segment")


@pytest.mark.parametrize("key,value", [("network.vpcId", "vpc-0123456789abcdef0\n"), ("owner", "alice\n")])
def test_a_trailing_newline_does_not_pass_a_pattern(key, value):
    from components.core.config.patterns import LABEL_VALUE_RE, VPC_ID_RE

    pattern = VPC_ID_RE if key == "network.vpcId" else LABEL_VALUE_RE
    assert pattern.match(value.strip()) and not pattern.match(value)


@pytest.mark.parametrize("image,fragment", [
    ("vllm/vllm-openai:V0.34.0", "has the tag 'V0.34.0', which vLLM does not publish (tags are case-sensitive): write 'v0.34.0'"),
    ("vllm/vllm-openai:nightly-" + "AB" * 20, "write 'nightly-" + "ab" * 20 + "'"),
])
def test_a_tag_in_the_wrong_case_is_named_not_called_mutable(image, fragment):
    """New-user trial: both were called mutable tags."""
    cfg = base("b300")
    cfg["vllm"] = {**{k: v for k, v in cfg.get("vllm", {}).items() if k != "imageTag"}, "image": image}
    reject(cfg, "vllm.image", fragment)


def test_a_version_read_as_a_number_is_not_advised_back_without_its_zero():
    """New-user trial: `eksVersion: 1.30` was advised to be quoted as '1.3'."""
    cfg = base("b300-prod")
    cfg["kubernetes"] = {**cfg.get("kubernetes", {}), "eksVersion": 1.3}
    reject(cfg, "kubernetes.eksVersion", "trailing zeros dropped", "'1.30' if you wrote 1.30")


def test_an_invisible_character_in_a_key_is_named():
    """New-user trial: `owner` with a zero-width space was an unknown key that looked exactly like a known one."""
    with pytest.raises(ConfigError, match="it holds U\\+200B ZERO WIDTH SPACE at character 4; did you mean owner"):
        namespace_config({"kimi-deploy:own\u200ber": "x", "aws:region": "us-east-1"})


def test_a_long_mirror_prefix_in_every_path_fits_the_user_data_once_compressed():
    """New-user trial: a long storage.mirror.prefix (in every mirror path) overflowed EC2's 16 KB (and was
    blamed on model.servedModelName); over the limit the user data is sent gzip-compressed, where a
    repeated prefix costs its length once."""
    import base64
    import gzip

    from tests.conftest import plan_for

    run = plan_for("b300", overrides={"kimi-deploy:storage": {"mirror": {"prefix": "a/" * 150 + "a"}}})
    data = base64.b64decode(run.named("gpu-lt").inputs["userData"])
    assert data[:2] == b"\x1f\x8b" and len(data) <= 16 * 1024
    assert ("a/" * 150 + "a") in gzip.decompress(data).decode()


def test_a_kubernetes_provider_key_on_a_platform_without_a_cluster_is_refused():
    """New-user trial: `kubernetes:context` on aws-ec2 was accepted and read by nothing."""
    full = {**read_stack_config("b300"), "kubernetes:context": "prod-cluster"}
    with pytest.raises(ConfigError, match="kubernetes:context: 'prod-cluster' is read by the Kubernetes provider, which "
                                          "platform aws-ec2 never creates"):
        namespace_config(full)
    namespace_config({**read_stack_config("b300-prod"), "kubernetes:context": "prod-cluster"})


@pytest.mark.parametrize("values,words", [
    ({"port": "8000"}, "vllm.port: '8000' is not a whole number: it is quoted, so YAML reads it as text; write 8000 without"),
    ({"enablePrefixCaching": "true"}, "is not a boolean (allowed: true, false): it is quoted, so YAML reads it as text; "
                                      "write true without quotes"),
])
def test_a_quoted_number_or_boolean_is_told_to_lose_its_quotes(values, words):
    """New-user trial: "'8000' is not a whole number" (it is one, in quotes)."""
    cfg = base("b300")
    cfg["vllm"] = {**cfg.get("vllm", {}), **values}
    with pytest.raises(ConfigError, match=re.escape(words)):
        accept(cfg)


# --- round five, the fresh trial's leftovers: provider endpoints, quoted floats, wide public blocks,
# --- the tools' prefix, a toleration of every taint


def _stack_file_with(tmp_path, stack: str, lines: str) -> str:
    """A copy of ``stacks/Pulumi.<stack>.yaml`` with ``lines`` added under ``config:``; its name."""
    from tests.conftest import REPO_ROOT

    text = (REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    (tmp_path / "Pulumi.t.yaml").write_text(text.replace("config:\n", "config:\n" + lines, 1))
    return "t"


@pytest.mark.parametrize("lines,words", [
    ("  aws:insecure: true\n", "aws:insecure is true: the AWS provider skips TLS certificate verification"),
    ("  aws:endpoints:\n    - s3: http://localhost:4566\n      ec2: https://ec2.us-east-1.amazonaws.com\n",
     "aws:endpoints points the AWS provider away from AWS (s3 -> http://localhost:4566)"),
])
def test_provider_settings_that_leave_aws_or_its_tls_are_warned_in_the_plan(tmp_path, lines, words):
    from components.core.load import load_stack

    spec = load_stack(_stack_file_with(tmp_path, "b300", lines), stacks_dir=tmp_path, now=FIXED_NOW)
    found = [w for w in spec.warnings if words in w]
    assert found, spec.warnings
    assert "ec2 ->" not in found[0]  # AWS's own endpoint is not named
    quiet = load_stack(_stack_file_with(tmp_path, "b300", "  aws:insecure: false\n"), stacks_dir=tmp_path, now=FIXED_NOW)
    assert not [w for w in quiet.warnings if "aws:" in w]


@pytest.mark.parametrize("section,key,text", [
    ("vllm", "gpuMemoryUtilization", "0.9"),
    ("storage", "readGBps", "5.5"),
    ("timeToReady", "copyGBps", "2"),
])
def test_a_decimal_as_text_is_read_as_pulumi_config_set_path_writes_it(section, key, text):
    """`pulumi config set --path K 0.9` stores "0.9" (only true/false and integers are typed: pulumi's
    config/map.go adjustObjectValue), so decimal text is its number; text that is not a number is refused."""
    from components.core.config.raw import validate_raw
    cfg = base("b300")
    cfg[section] = {**cfg.get(section, {}), key: text}
    as_text = validate_raw(cfg)
    cfg[section][key] = float(text)
    assert as_text == validate_raw(cfg)
    cfg[section][key] = "0.9x"
    reject(cfg, f"{section}.{key}", "is not a number")


def test_a_price_as_text_is_its_number_and_a_boolean_is_not_a_number():
    cfg = base("b300")
    cfg["prices"] = {"natGatewayHour": "0.05"}
    accept(cfg)
    cfg["prices"] = {"natGatewayHour": True}
    reject(cfg, "prices.natGatewayHour", "true is not a number")
    cfg["prices"] = {}
    cfg["storage"] = {**cfg["storage"], "readGBps": True}
    reject(cfg, "storage.readGBps", "true is not a number")


@pytest.mark.parametrize("key,cidr,count", [
    ("network.allowedCidrs", "11.0.0.0/8", "16,777,216"),
    ("network.allowedCidrs", "52.0.0.0/12", "1,048,576"),
    ("network.allowedCidrs", "2600::/16", "5,192,296,858,534,827,628,530,496,329,220,096"),
])
def test_a_public_client_block_broader_than_a_16_is_refused_with_its_address_count(key, cidr, count):
    cfg = base("b300")
    cfg["network"] = {**cfg["network"], "allowedCidrs": [cidr]}
    reject(cfg, key, f"is a public block of {count} addresses", "allowed: public blocks of /")


@pytest.mark.parametrize("cidr", ["52.1.0.0/16", "10.0.0.0/8", "100.64.0.0/10", "203.0.113.0/24"])
def test_a_private_range_or_a_public_16_still_passes(cidr):
    cfg = base("b300")
    cfg["network"] = {**cfg["network"], "allowedCidrs": [cidr]}
    accept(cfg)


@pytest.mark.parametrize("prefix", ["_tools", "_tools/models"])
def test_a_mirror_prefix_under_the_tools_prefix_is_refused(prefix):
    cfg = base("b300")
    cfg["storage"] = {**cfg["storage"], "mirror": {**cfg["storage"].get("mirror", {}), "prefix": prefix}}
    reject(cfg, "storage.mirror.prefix", "is under _tools/, where the nodes fetch the toolkit's programs")
    cfg["storage"]["mirror"]["prefix"] = "models/_tools"
    accept(cfg)


def test_a_toleration_of_every_taint_is_refused_on_mi355x():
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "tolerations": [{"operator": "Exists"}]}
    reject(cfg, "kubernetes.tolerations[0].key", "is empty with operator Exists, which tolerates every taint")
    cfg["kubernetes"]["tolerations"] = [{"key": "", "operator": "Exists", "effect": "NoSchedule"}]
    reject(cfg, "kubernetes.tolerations[0].key", "name the GPU nodes' taint key")



def test_an_empty_prometheus_pod_selector_is_refused_on_kubernetes():
    """A fresh trial: `prometheusPodLabels: {}` made the NetworkPolicy admit every pod of the Prometheus
    namespace to the API port."""
    cfg = base("gb300")
    cfg["observability"] = {**cfg.get("observability", {}), "prometheusPodLabels": {}}
    reject(cfg, "observability.prometheusPodLabels", "admit every pod of the Prometheus namespace")


def test_no_s3_gateway_endpoint_in_a_created_vpc_warns_with_the_nat_cost_of_a_copy():
    """A fresh trial: `s3GatewayEndpoint: false` in the VPC the stack creates sent every 1.56 TB copy
    through the NAT gateway, with no word in the plan."""
    cfg = base("b300")
    cfg["network"] = {**cfg.get("network", {}), "s3GatewayEndpoint": False}
    found = [w for w in accept(cfg).warnings if "s3GatewayEndpoint" in w]
    assert found and "USD 70 per node copy" in found[0], found
    assert not [w for w in accept(base("b300")).warnings if "s3GatewayEndpoint" in w]


@pytest.mark.parametrize("url,ok", [
    ("http://minio.example.com:9000", False), ("http://52.1.2.3:9000", False),
    ("https://minio.example.com", True), ("http://minio.storage.svc:9000", True), ("http://minio:9000", True),
    ("http://minio.storage.svc.cluster.local", True), ("http://10.0.0.5:9000", True),
])
def test_a_mirror_endpoint_over_plain_http_must_stay_inside_the_cluster(url, ok):
    """A fresh trial: mi355x took `http://minio.example.com:9000`, so weights and signed requests crossed
    networks in the clear."""
    from components.core.config.storage import check_endpoint_url
    if ok:
        check_endpoint_url(url)
        return
    with pytest.raises(ConfigError) as err:
        check_endpoint_url(url)
    assert str(err.value).startswith("kimi-deploy:storage.mirror.endpointUrl: ") and "plain http://" in str(err.value)


def test_a_block_with_host_bits_set_names_the_block_of_its_address():
    """A fresh trial: `1.0.0.0/1` was called "not a CIDR block" with no word of why."""
    cfg = base("b300")
    cfg["network"] = {**cfg.get("network", {}), "allowedCidrs": ["203.0.113.7/24"]}
    reject(cfg, "network.allowedCidrs", "has host bits set", "203.0.113.0/24")


def test_a_whole_number_in_float_notation_is_told_to_write_its_digits():
    """A fresh trial: `importWaitSeconds: 1e9` was "1000000000.0 is not a whole number"."""
    cfg = base("b300")
    cfg["vllm"] = {**cfg.get("vllm", {}), "port": 8.0e3}
    reject(cfg, "vllm.port", "whole number written as a float", "write its digits, 8000")
