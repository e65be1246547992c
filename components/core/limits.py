"""Hard limits of the APIs the deployment talks to, checked at config time with the key that grew
the value (one line, ``ConfigError``), so nothing fails half-way through ``pulumi up``.

Sources:
- Kubernetes label keys and values, object names: "Labels and Selectors", "Object Names and IDs"
  (kubernetes.io/docs/concepts/overview/working-with-objects/); the API server's checks are
  ``IsQualifiedName``, ``IsValidLabelValue``, ``IsDNS1123Label``, ``IsDNS1123Subdomain`` in
  k8s.io/apimachinery/pkg/util/validation/validation.go.
- AWS tags: "Tag naming limits and requirements" (AWS General Reference / Tagging AWS resources):
  at most 50 user tags per resource, keys up to 128 and values up to 256 Unicode characters.
- EKS: at most 40 public endpoint access CIDR blocks per cluster, not adjustable (Amazon EKS service
  quotas, "Public endpoint access CIDR ranges per cluster", L-93A74D60).
- EC2 user data: 16 KB raw, before base64 (``components/aws/userdata.USER_DATA_LIMIT_BYTES``; over
  it the user data is sent gzip-compressed, ``userdata.user_data_bytes``), checked by
  ``components/aws/compute.check_ec2_user_data``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

LABEL_VALUE_MAX_CHARS = 63
QUALIFIED_NAME_MAX_CHARS = 63
DNS1123_LABEL_MAX_CHARS = 63
DNS1123_SUBDOMAIN_MAX_CHARS = 253
AWS_TAGS_PER_RESOURCE = 50
AWS_TAG_KEY_MAX_CHARS = 128
AWS_TAG_VALUE_MAX_CHARS = 256
EKS_PUBLIC_ACCESS_CIDRS_MAX = 40

_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_DNS1123_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


def dns1123_subdomain_problem(text: str) -> str | None:
    """Why ``text`` is not a DNS-1123 subdomain (lowercase, dots, at most 253), or None."""
    if len(text) > DNS1123_SUBDOMAIN_MAX_CHARS:
        return f"is {len(text)} characters; a DNS-1123 subdomain has at most {DNS1123_SUBDOMAIN_MAX_CHARS}"
    if not _DNS1123_SUBDOMAIN_RE.match(text):
        return "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', alphanumeric at both ends)"
    return None


def dns1123_label_problem(text: str) -> str | None:
    """Why ``text`` is not a DNS-1123 label (object and namespace names, at most 63), or None."""
    if len(text) > DNS1123_LABEL_MAX_CHARS:
        return f"is {len(text)} characters; a DNS-1123 label has at most {DNS1123_LABEL_MAX_CHARS}"
    if not _DNS1123_LABEL_RE.match(text):
        return "is not a DNS-1123 label (lowercase letters, digits and '-', alphanumeric at both ends)"
    return None


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (``[prefix/]name``), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not prefix:
        return "has an empty prefix before '/'"
    if prefix and (problem := dns1123_subdomain_problem(prefix)):
        return f"has a prefix that {problem}"
    if len(name) > QUALIFIED_NAME_MAX_CHARS:
        return f"has a name part of {len(name)} characters; at most {QUALIFIED_NAME_MAX_CHARS}"
    if not _QUALIFIED_NAME_RE.match(name):
        return "is not a label key (letters, digits, '-', '_', '.', alphanumeric at both ends; optional DNS prefix and '/')"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value (at most 63, may be empty), or None."""
    if len(value) > LABEL_VALUE_MAX_CHARS:
        return f"is {len(value)} characters; a Kubernetes label value has at most {LABEL_VALUE_MAX_CHARS}"
    if not _LABEL_VALUE_RE.match(value):
        return "is not a label value (letters, digits, '-', '_', '.', alphanumeric at both ends)"
    return None


def tags_problem(tags: Mapping[str, str], reserved: int = 0) -> tuple[str, str, str] | None:
    """The first AWS tag limit ``tags`` break, as ``(tag key, value, why)``, or None.

    Args:
        tags: tag key -> value (every taggable resource gets them).
        reserved: tags a resource adds on top (``Name``), counted against the 50.
    """
    if len(tags) + reserved > AWS_TAGS_PER_RESOURCE:
        return (
            "",
            str(len(tags)),
            f"tags plus {reserved} per-resource tags exceed AWS's {AWS_TAGS_PER_RESOURCE} tags per resource",
        )
    for key, value in tags.items():
        if len(key) > AWS_TAG_KEY_MAX_CHARS:
            return (key, value, f"tag key is {len(key)} characters; AWS allows {AWS_TAG_KEY_MAX_CHARS}")
        if len(value) > AWS_TAG_VALUE_MAX_CHARS:
            return (key, value, f"tag value is {len(value)} characters; AWS allows {AWS_TAG_VALUE_MAX_CHARS}")
    return None
