"""What a credential looks like: one list of shapes for every consumer.

Used by the config check (``load.parse_spec``: a credential in plain config is rejected), the
plan diff's second fence (``scripts/ops/plan_diff.redact``: nothing credential-shaped reaches a pull
request comment) and the guardrails (``policy/rules.py``: under CrossGuard secrets arrive
unwrapped, so values are judged by their shape). Standard library only (the policy pack's venv
has no pydantic).

Sources of the shapes:
- Hugging Face user access tokens start with ``hf_`` (huggingface.co/docs/hub/security-tokens).
- ModelScope access tokens (SDK / API-Inference tokens, modelscope.cn/my/myaccesstoken) start with
  ``ms-`` (GitGuardian's "ModelScope API key" detector: prefixed, family token).
- GitHub tokens: ``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_`` (GitHub docs, "About authentication
  to GitHub", token formats).
- OpenAI-style API keys start with ``sk-`` (the OpenAI API reference; vLLM's ``--api-key`` takes
  any string, and our generated keys use this prefix).
- AWS access key ids: ``AKIA`` (long-term) / ``ASIA`` (temporary) + 16 upper-case alphanumerics
  (IAM user guide, "Understanding unique ID prefixes").
- PEM private keys: ``-----BEGIN ... PRIVATE KEY-----`` (RFC 7468).
- Kubeconfig client keys: ``client-key-data: <base64>`` (Kubernetes kubeconfig format).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CredentialShape:
    """One kind of credential.

    Attributes:
        name: short id (``huggingface-token``), used in tests and messages.
        pattern: regular expression that finds the credential inside a longer text.
        secret_key: the ``kimi-deploy:`` secret config key meant to hold it (``hfToken``, ...),
            or ``""`` when no key of this project holds that kind of credential.
        redact_pattern: what to remove when redacting, when more than ``pattern`` (a PEM block
            through its END line); ``None``: ``pattern`` itself.
    """

    name: str
    pattern: str
    secret_key: str
    redact_pattern: str | None = None


SHAPES: tuple[CredentialShape, ...] = (
    CredentialShape("huggingface-token", r"hf_[A-Za-z0-9]{20,}", "hfToken"),
    CredentialShape("modelscope-token", r"\bms-[A-Za-z0-9-]{20,}", "modelscopeToken"),
    CredentialShape("github-token", r"\bgh[pousr]_[A-Za-z0-9]{20,}", ""),
    CredentialShape("openai-style-api-key", r"\bsk-[A-Za-z0-9_-]{16,}", "apiKey"),
    CredentialShape("aws-access-key-id", r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", ""),
    CredentialShape(
        "pem-private-key",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        "kubeconfig",
        redact_pattern=r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
    ),
    CredentialShape("kubeconfig-client-key", r"client-key-data:\s*\S{20,}", "kubeconfig"),
)

CREDENTIAL_RE = re.compile("|".join(f"(?:{shape.pattern})" for shape in SHAPES))
_COMPILED = tuple((shape, re.compile(shape.pattern), re.compile(shape.redact_pattern or shape.pattern)) for shape in SHAPES)


def find_credential(text: str) -> CredentialShape | None:
    """The first shape (in ``SHAPES`` order) found anywhere in ``text``, else ``None``."""
    for shape, rx, _ in _COMPILED:
        if rx.search(text):
            return shape
    return None


def looks_like_credential(text: str) -> bool:
    """True when ``text`` contains anything shaped like a credential."""
    return CREDENTIAL_RE.search(text) is not None


def redact_credentials(text: str, replacement: str = "[redacted]") -> str:
    """``text`` with every credential-shaped span replaced by ``replacement``."""
    for _, _, rx in _COMPILED:
        text = rx.sub(replacement, text)
    return text
