"""Formats of config values (regular expressions), shared by the section checks.

Every pattern ends in ``\\Z``, never ``$``: Python's ``$`` also matches before a trailing newline, so
``"us-east-1\\n"`` or ``"vpc-0123abcd\\n"`` passed a check and reached AWS with the newline (new-user trial).
"""

from __future__ import annotations

import re

COMMIT_RE = re.compile(r"^[0-9a-f]{40}\Z")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}\Z")
RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{8,17}\Z")
# AWS region names: us-east-1, ap-southeast-2, us-gov-west-1, cn-north-1, eusc-de-east-1.
REGION_RE = re.compile(r"^[a-z]{2,4}(-[a-z]+)+-\d{1,2}\Z")
# An IAM role or user (EKS access entry principal): arn:<partition>:iam::<account>:role|user/[path/]name.
IAM_PRINCIPAL_ARN_RE = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/([\w+=,.@-]+/)*[\w+=,.@-]{1,128}\Z")
# An AZ (us-east-1a) or a Local Zone (us-east-1-dfw-2a: the parent region, the zone group, a letter).
AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d([a-z]|-[a-z]+-\d[a-z])\Z")
# An EC2 security group id (sg- and 8 or 17 hex digits).
SECURITY_GROUP_RE = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})\Z")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
# S3's general purpose bucket naming rules beyond the characters (S3 User Guide, "General purpose bucket
# naming rules"): no two adjacent periods, not an IP address, reserved prefixes and suffixes.
BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
_IPV4_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}\Z")
# One S3 key prefix: segments of the characters S3 calls safe for object keys, less the shell-hostile
# ones (S3 User Guide, "Naming Amazon S3 objects": alphanumerics, - _ .), joined by '/'.
S3_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*\Z")


def bucket_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid general purpose S3 bucket name (one clause), or None.

    Source: S3 User Guide, "General purpose bucket naming rules" (3-63 characters of lowercase
    letters, digits, '.' and '-', starting and ending with a letter or digit; no '..'; not an IPv4
    address; not the reserved prefixes and suffixes above)."""
    if not BUCKET_RE.match(name):
        return "is not a valid S3 bucket name (3-63 lowercase letters, digits, dots, hyphens; a letter or digit first and last)"
    if ".." in name:
        return "is not a valid S3 bucket name (two adjacent periods)"
    if _IPV4_RE.match(name):
        return "is not a valid S3 bucket name (formatted as an IP address)"
    for prefix in BUCKET_RESERVED_PREFIXES:
        if name.startswith(prefix):
            return f"is not a valid S3 bucket name (the prefix {prefix} is reserved)"
    for suffix in BUCKET_RESERVED_SUFFIXES:
        if name.endswith(suffix):
            return f"is not a valid S3 bucket name (the suffix {suffix} is reserved)"
    return None
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# Kubernetes label values (also valid AWS tag values): the owner is both.
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
# Docker tag grammar; an image reference is name[:tag][@sha256:digest].
IMAGE_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
IMAGE_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?\Z"
)
# EC2 resource ids: a prefix and 8 or 17 lower-case hex digits (the longer form since 2016; EC2 user
# guide, "Resource IDs").
VPC_ID_RE = re.compile(r"^vpc-([0-9a-f]{8}|[0-9a-f]{17})\Z")
SUBNET_ID_RE = re.compile(r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})\Z")
SECURITY_GROUP_ID_RE = re.compile(r"^sg-([0-9a-f]{8}|[0-9a-f]{17})\Z")
# The name clients send as `model` (vLLM --served-model-name): an OpenAI-style model id or a hub
# repo id (org/name), no whitespace or quotes: it is also a PromQL label value and a shell word.
SERVED_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z")


def path_segments_problem(value: str, *, absolute: bool) -> str | None:
    """Why ``value``, joined into a filesystem path or an S3 key, could leave the directory it is
    joined to or name another one (one clause), or None.

    Args:
        value: a '/'-separated path.
        absolute: True for a host path (it must start with '/'), False for a part joined below a
            directory or prefix (it must not).

    Refused: the wrong kind (absolute or relative), an empty segment ('//', a trailing '/'), a '.'
    or '..' segment, a backslash or a control character (POSIX.1-2017 section 4.13 "Pathname
    Resolution": '.' and '..' resolve to the directory and its parent; '//' is a single separator).
    """
    if any(ch == "\\" or ord(ch) < 0x20 or ch == "\x7f" for ch in value):
        return "holds a backslash or a control character"
    if value.startswith("/") != absolute:
        return "must be an absolute path" if absolute else "must be a relative path (no leading '/')"
    segments = value[1:].split("/") if absolute else value.split("/")
    if any(seg == "" for seg in segments):
        return "has an empty segment ('//' or a trailing '/')"
    if any(seg in (".", "..") for seg in segments):
        return "has a '.' or '..' segment (a path escape)"
    return None


def git_ref_problem(name: str) -> str | None:
    """Why ``name`` is not a branch or tag name git accepts (one clause), or None: a relative path
    by ``path_segments_problem``, and git-check-ref-format's rules beyond it (git 2.47 docs, rules
    1-3 and 6-10: no segment starting with '.' or ending with '.lock', no '..', not ending with '.')."""
    if (problem := path_segments_problem(name, absolute=False)) is not None:
        return problem
    if ".." in name:
        return "holds '..' (git refuses it in a ref name)"
    if name.endswith(".") or any(seg.startswith(".") or seg.endswith(".lock") for seg in name.split("/")):
        return "is not a git ref name (a segment starts with '.' or ends with '.lock', or it ends with '.')"
    return None
