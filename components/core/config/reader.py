"""One way to read a stack's config: as the Pulumi engine hands it to the program.

``pulumi up`` (``components.program``) and the offline plan and scripts (``load.load_stack``)
both end in ``read_config_strings``, so they accept and reject the same stack files:

1. The Pulumi CLI reads ``Pulumi.<stack>.yaml`` and hands the program a flat map of full key ->
   **string** (``PULUMI_CONFIG``): a top-level scalar becomes its text (``24`` and ``"24"`` are
   both ``"24"``, ``true`` is ``"true"``); a map or list (what ``pulumi config set --path``
   writes) becomes its JSON, with the types YAML gave inside it. Source: pulumi/pulumi
   ``sdk/go/common/resource/config/value.go`` and ``map.go`` (``Map.Get``/``Map.Set``:
   ``fmt.Sprintf("%v")`` of scalars, ``json.Marshal`` of objects; ``adjustObjectValue``: with
   ``--path`` the CLI stores ``"true"``/``"false"`` as booleans and integers without a leading
   zero as numbers, everything else as strings). The offline side does only this conversion
   (``cli_config_strings``); the program receives it from the engine.
2. ``read_config_strings`` decodes each ``kimi-deploy:*`` value by the type its key declares in
   ``RawConfig``, exactly as the Pulumi Python SDK getters do (``pulumi/config.py``):
   strings as they are (``Config.get``), integers by ``int(text)`` (``get_int``), booleans from
   ``true``/``True``/``false``/``False`` (``get_bool``), floats by ``float(text)``
   (``get_float``), objects by ``json.loads`` (``get_object``). A top-level string that looks
   like a number stays a string, so ``owner: "1234"`` means the same in the plan and in
   ``pulumi up``.
3. Names are checked before values: a namespace this program does not read
   (``kimi-deploi:``), a key the AWS or Kubernetes provider does not know (``aws:regoin``) and an
   unknown ``kimi-deploy:`` key are one-line ``ConfigError``\\ s with a did-you-mean
   (``difflib``).

No Pulumi import here (pure core).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel

from .. import naming
from ..errors import NAMESPACE, UNKNOWN_KEY_VALUE, ConfigError, did_you_mean
from ..limits import tags_problem
from .raw import API_KEY_MIN_CHARS, SECRET_KEYS, RawConfig

# Config keys of the providers the program uses through their default configuration.
# pulumi-aws 7.51.1 ``pulumi_aws/config/vars.py`` (tests/test_config_reader.py checks the list
# against the installed SDK).
AWS_PROVIDER_CONFIG_KEYS: tuple[str, ...] = (
    "accessKey", "allowedAccountIds", "assumeRoleWithWebIdentity", "assumeRoles", "customCaBundle", "defaultTags",
    "ec2MetadataServiceEndpoint", "ec2MetadataServiceEndpointMode", "endpoints", "forbiddenAccountIds", "httpProxy",
    "httpsProxy", "ignoreTags", "insecure", "maxRetries", "noProxy", "profile", "region", "retryMode",
    "s3UsEast1RegionalEndpoint", "s3UsePathStyle", "secretKey", "sharedConfigFiles", "sharedCredentialsFiles",
    "skipCredentialsValidation", "skipMetadataApiCheck", "skipRegionValidation", "skipRequestingAccountId",
    "stsRegion", "tagPolicyCompliance", "token", "tokenBucketRateLimiterCapacity", "useDualstackEndpoint",
    "useFipsEndpoint", "userAgents",
)
# pulumi-kubernetes 4.34.2 ``pulumi_kubernetes/provider.py`` (ProviderArgs, camelCase as in config).
KUBERNETES_PROVIDER_CONFIG_KEYS: tuple[str, ...] = (
    "alwaysRender", "cluster", "clusterIdentifier", "context", "deleteUnreachable", "enableConfigMapMutable",
    "enablePatchForce", "enableSecretMutable", "enableServerSideApply", "helmReleaseSettings", "kubeClientSettings",
    "kubeconfig", "namespace", "renderYamlToDirectory", "skipUpdateUnreachable", "suppressDeprecationWarnings",
    "suppressHelmHookWarnings", "upsertExistingObjects",
)
# Namespaces a stack file may use: ours, the providers', and the engine's own (``pulumi:``).
PROVIDER_NAMESPACES: dict[str, tuple[str, ...] | None] = {
    "aws": AWS_PROVIDER_CONFIG_KEYS,
    "kubernetes": KUBERNETES_PROVIDER_CONFIG_KEYS,
    "random": (),
    "pulumi": None,  # engine settings (pulumi:tags, pulumi:template, ...): not checked
}
# Provider keys that hold credentials: Pulumi's provider docs set them with ``--secret``
# (aws: secretKey, token; kubernetes: kubeconfig when it holds the file's contents, not a path).
PROVIDER_CREDENTIAL_KEYS: tuple[str, ...] = ("aws:secretKey", "aws:token", "kubernetes:kubeconfig")
# Shown for a value given as ``{secure: ...}`` offline (only its presence matters there).
SECURE_PLACEHOLDER = "[secure]"


def _go_text(value: Any) -> str:
    """A YAML scalar as the text the CLI hands the program (``fmt.Sprintf("%v")``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (datetime, date)):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (datetime, date)):
        return obj.isoformat().replace("+00:00", "Z")
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def cli_config_strings(stack_config: Mapping[str, Any]) -> dict[str, str]:
    """A stack file's ``config:`` map as the strings the Pulumi CLI hands the program.

    Args:
        stack_config: full key -> value as YAML loaded it (``read_stack_config``).

    Returns:
        full key -> string: top-level scalars as text (``24`` -> ``"24"``, ``true`` -> ``"true"``),
        maps and lists as JSON (types inside kept), ``{secure: ...}`` as ``SECURE_PLACEHOLDER``
        (the CLI would decrypt it; offline only its presence matters).
    """
    out: dict[str, str] = {}
    for key, value in stack_config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            out[key] = SECURE_PLACEHOLDER
        elif isinstance(value, (dict, list)):
            out[key] = json.dumps(value, default=_json_default)
        else:
            out[key] = _go_text(value)
    return out


def _field_kind(annotation: Any) -> str:
    """``str``, ``int``, ``bool``, ``float``, ``time`` or ``object`` for a RawConfig annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = {_field_kind(a) for a in typing.get_args(annotation) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "object"
    if origin is typing.Annotated:
        return _field_kind(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return "str"
    if annotation is bool:
        return "bool"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if annotation is str:
        return "str"
    if annotation is datetime:
        return "time"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return "object"


def namespace_fields() -> dict[str, str]:
    """Top-level ``kimi-deploy:`` keys (aliases as written in stack files) -> value kind."""
    out: dict[str, str] = {}
    for name, info in RawConfig.model_fields.items():
        if name == "region":
            continue  # aws:region, not kimi-deploy:region
        out[info.alias or name] = _field_kind(info.annotation)
    return out


def _decode(full_key: str, kind: str, text: str) -> Any:
    """One value by its kind, as the Pulumi SDK getter of that kind reads it."""
    if kind in ("str", "time"):
        return text
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(full_key, text, "is not an integer") from None
    if kind == "bool":
        if text in ("true", "True"):
            return True
        if text in ("false", "False"):
            return False
        raise ConfigError(full_key, text, "is not a boolean (allowed: true, false)")
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(full_key, text, "is not a number") from None
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(
            full_key, text, "is not a map (write it as YAML keys under it, or use `pulumi config set --path`)"
        ) from None


def _decode_secret(full_key: str, kind: str, text: str) -> Any:
    """``_decode`` of a value set as a secret: a type error does not show it."""
    try:
        return _decode(full_key, kind, text)
    except ConfigError:
        raise ConfigError(full_key, "[secret]", f"is not a valid {kind} value") from None


def _check_api_key(full_key: str, text: str | None) -> None:
    """Refuse an ``apiKey`` that is empty or shorter than ``API_KEY_MIN_CHARS`` (its value never shown).

    An empty secret would reach the pods as an empty ``VLLM_API_KEY`` (the guard then refuses to
    serve); offline the plan sees only ``SECURE_PLACEHOLDER`` and skips this.

    Raises:
        ConfigError: empty, or below the minimum (the message names the minimum, not the length).
    """
    if text is None:
        return
    if text == "":
        raise ConfigError(full_key, "[secret]", "is set but empty: set a key of at least "
                          f"{API_KEY_MIN_CHARS} characters, or unset it (pulumi config rm {full_key}) to have one generated")
    if len(text) < API_KEY_MIN_CHARS:
        raise ConfigError(full_key, "[secret]", f"is shorter than {API_KEY_MIN_CHARS} characters (NIST SP 800-63B-4 "
                          "section 3.1.1.2): set a longer key, or unset it to have one generated")


def read_config_strings(
    config: Mapping[str, str], secret_full_keys: typing.Collection[str] = ()
) -> tuple[dict[str, Any], frozenset[str]]:
    """Decode the config the engine hands the program into ``parse_spec``'s input.

    Args:
        config: full key -> string, as in ``PULUMI_CONFIG`` (the program) or from
            ``cli_config_strings`` (the offline plan).
        secret_full_keys: keys whose values are secret: an error about them never shows the value.

    Returns:
        ``(values, secrets_set)``: ``kimi-deploy`` keys without the prefix, decoded by type
        (``aws:region`` as ``region``), and the names of the secret keys that have a value.

    Raises:
        ConfigError: an unknown namespace or key (with a did-you-mean), or a value that is not of
            its key's type (``kimi-deploy:trialTtlHours: 'a day' is not an integer``).
    """
    fields = namespace_fields()
    known_namespaces = [NAMESPACE, *PROVIDER_NAMESPACES]
    values: dict[str, Any] = {}
    secrets: set[str] = set()
    for full_key in sorted(config):
        text = config[full_key]
        shown = "[secret]" if full_key in secret_full_keys else text
        namespace, sep, name = full_key.partition(":")
        if not sep or not namespace or not name:
            raise ConfigError(full_key, shown, "is not a config key (write namespace:key, e.g. kimi-deploy:owner)")
        if namespace != NAMESPACE:
            if namespace not in PROVIDER_NAMESPACES:
                raise ConfigError(
                    full_key, shown,
                    f"is in namespace '{namespace}' that nothing reads (allowed: {', '.join(known_namespaces)})"
                    + did_you_mean(namespace, known_namespaces),
                )
            keys = PROVIDER_NAMESPACES[namespace]
            if keys is not None and name not in keys:
                raise ConfigError(
                    full_key,
                    shown,
                    f"is not a key of the {namespace} provider" + (did_you_mean(name, keys) or f" (keys: {', '.join(keys)})"),
                )
            if full_key in PROVIDER_CREDENTIAL_KEYS and full_key not in secret_full_keys and text not in (None, ""):
                is_path = full_key == "kubernetes:kubeconfig" and "\n" not in text and not text.lstrip().startswith("{")
                if not is_path:
                    raise ConfigError(full_key, "[plaintext]", "is a credential and must be set with `pulumi config set "
                                      "--secret` (never in plain text), or left unset for the environment's own "
                                      "(AWS_PROFILE, KUBECONFIG)")
            if full_key == "aws:region":
                values["region"] = text
            continue
        if name in SECRET_KEYS:
            if name == "apiKey" and text != SECURE_PLACEHOLDER:
                _check_api_key(full_key, text)
            if text not in (None, ""):
                secrets.add(name)
            continue
        kind = fields.get(name)
        if name == "region":
            raise ConfigError(full_key, shown, "is not read: the region is aws:region (pulumi config set aws:region us-east-1)")
        if kind is None:
            # An unknown key's value is never printed: it may be a token under a misspelt secret key
            # (`kimi-deploy:HFToken: hf_...`), which the secret rules did not recognise.
            shown = UNKNOWN_KEY_VALUE
            allowed = sorted([*fields, *SECRET_KEYS])
            head, dot, rest = name.partition(".")
            if dot and head in fields:
                # `pulumi config set kimi-deploy:vllm.image X` without --path stores a literal dotted key.
                raise ConfigError(full_key, shown, f"is not a known key: set a path with `pulumi config set --path "
                                                   f"{full_key} ...` (in a stack file or overlay, nest it: "
                                                   f"{head}: {{{rest}: ...}})")
            raise ConfigError(
                full_key, shown, "is not a known key" + (did_you_mean(name, allowed) or f" (keys: {', '.join(allowed)})")
            )
        values[name] = _decode_secret(full_key, kind, text) if full_key in secret_full_keys else _decode(full_key, kind, text)
    _check_provider_default_tags(config.get("aws:defaultTags"))
    _check_provider_platform(config, values.get("platform"), secret_full_keys)
    return values, frozenset(secrets)


def _check_provider_platform(config: Mapping[str, Any], platform: Any, secret_full_keys: typing.Collection[str]) -> None:
    """A ``kubernetes:`` provider key on a platform that runs no cluster (``aws-ec2``) is read by
    nothing: the program creates no Kubernetes provider there (components/platform.py), so
    ``kubernetes:context`` on aws-ec2 was accepted and ignored.

    Raises:
        ConfigError: the first such key, naming the platform.
    """
    from ..platforms import PLATFORM_PROFILES

    profile = PLATFORM_PROFILES.get(platform) if isinstance(platform, str) else None
    if profile is None or profile.runs_kubernetes:
        return
    for full_key in sorted(k for k in config if k.startswith("kubernetes:")):
        shown = "[secret]" if full_key in secret_full_keys else config[full_key]
        raise ConfigError(full_key, shown, f"is read by the Kubernetes provider, which platform {platform} never creates "
                                           f"(it runs no cluster; kubernetes platforms: "
                                           f"{', '.join(n for n, p in PLATFORM_PROFILES.items() if p.runs_kubernetes)}): "
                                           "remove it")


# Hosts of AWS's own service endpoints (standard, China, and the dual-stack api.aws names): an
# ``aws:endpoints`` entry elsewhere points the provider at a service that is not AWS (AWS General
# Reference, "AWS service endpoints").
AWS_ENDPOINT_HOST_SUFFIXES: tuple[str, ...] = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")


def provider_warnings(config: Mapping[str, str]) -> tuple[str, ...]:
    """Warnings about AWS provider settings that change where and how `pulumi up` talks to AWS: the
    plan shows them (they are valid provider keys, and a LocalStack test stack sets them on purpose).

    - ``aws:insecure`` true: the provider skips TLS certificate verification of every AWS API call;
    - ``aws:endpoints`` naming a host outside ``AWS_ENDPOINT_HOST_SUFFIXES``: those services' calls,
      signed with the deploying identity's credentials, go to that host.

    Args:
        config: full key -> string, as the engine hands it (``cli_config_strings``).

    Returns:
        One line per setting (``()`` when neither is set or both are AWS's defaults).
    """
    from urllib.parse import urlsplit

    out: list[str] = []
    if (config.get("aws:insecure") or "").strip().lower() == "true":
        out.append("aws:insecure is true: the AWS provider skips TLS certificate verification, so anyone on the path "
                   "to the AWS APIs can read and change what `pulumi up` sends; unset it outside a local test")
    text = config.get("aws:endpoints")
    if text:
        try:
            entries = json.loads(text)
        except ValueError:
            entries = text
        items = entries if isinstance(entries, list) else [entries]
        foreign: list[str] = []
        for item in items:
            pairs = item.items() if isinstance(item, dict) else [("?", item)]
            for service, url in pairs:
                host = (urlsplit(str(url)).hostname or str(url)).lower()
                if not host.endswith(AWS_ENDPOINT_HOST_SUFFIXES):
                    foreign.append(f"{service} -> {url}")
        if foreign:
            out.append(f"aws:endpoints points the AWS provider away from AWS ({'; '.join(foreign)}): those API calls "
                       "and the deploying identity's signed requests go there; unset it outside a local test")
    return tuple(out)


# Tags the program puts on every taggable resource besides the provider's default tags: the five
# ``DeploymentSpec.tags``, ``expires-at`` and ``Name``.
OWN_TAGS_PER_RESOURCE = 7


def _check_provider_default_tags(text: str | None) -> None:
    """``aws:defaultTags`` count against AWS's 50 tags per resource together with the program's own,
    and may not set a tag key the toolkit owns (``naming.TOOLKIT_TAG_KEYS``: the sweeper and the
    expiry read them; a default applies wherever the program sets no value, e.g. ``expires-at`` on prod).

    Raises:
        ConfigError: the default tags are not ``{"tags": {...}}``, set a toolkit-owned key, or they
            and the program's own tags break a limit (``limits.tags_problem``).
    """
    if not text:
        return
    try:
        tags = (json.loads(text) or {}).get("tags") or {}
    except (ValueError, AttributeError):
        raise ConfigError(
            "aws:defaultTags", text, "is not a map with a 'tags' map (see the AWS provider's defaultTags)"
        ) from None
    if not isinstance(tags, dict):
        raise ConfigError("aws:defaultTags", text, "has 'tags' that is not a map")
    for key in tags:
        if str(key) in naming.TOOLKIT_TAG_KEYS:
            raise ConfigError(
                f"aws:defaultTags.tags.{key}", tags[key],
                f"cannot be set through aws:defaultTags: the toolkit owns this tag (the sweeper and the expiry read "
                f"it); it is set by {naming.TOOLKIT_TAG_KEYS[str(key)]}",
            )
    broken = tags_problem({str(k): str(v) for k, v in tags.items()}, reserved=OWN_TAGS_PER_RESOURCE)
    if broken:
        key, value, why = broken
        raise ConfigError(f"aws:defaultTags.tags.{key}" if key else "aws:defaultTags.tags", value if key else len(tags), why)
