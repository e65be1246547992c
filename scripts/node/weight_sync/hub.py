"""Hub errors a user can act on (hf:// and modelscope:// sources): one line, never the token."""
from __future__ import annotations

import os

from .model import SyncError, TransientError
from .retry import is_transient

# ---------------------------------------------------------------------------------------------
# Hub errors a user can act on (hf:// and modelscope:// sources)

# Per hub: the stack config key and the env var holding its token, the env var naming its host,
# the default host, and where a token is made. Sources: huggingface_hub's HF_TOKEN / HF_ENDPOINT
# (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables), the
# ModelScope SDK's MODELSCOPE_API_TOKEN / MODELSCOPE_DOMAIN (modelscope/hub/constants.py,
# https://github.com/modelscope/modelscope).
HUB_HELP = {
    "hf": {"config_key": "kimi-deploy:hfToken", "token_env": "HF_TOKEN", "endpoint_env": "HF_ENDPOINT",
           "default_endpoint": "https://huggingface.co", "token_page": "https://huggingface.co/settings/tokens"},
    "modelscope": {"config_key": "kimi-deploy:modelscopeToken", "token_env": "MODELSCOPE_API_TOKEN",
                   "endpoint_env": "MODELSCOPE_DOMAIN", "default_endpoint": "https://www.modelscope.cn",
                   "token_page": "https://www.modelscope.cn/my/myaccesstoken"},
}


def hub_endpoint(hub: str) -> str:
    """The hub's base URL as the client will use it (``HF_ENDPOINT`` / ``MODELSCOPE_DOMAIN`` or the
    public default), without any user:password part."""
    info = HUB_HELP[hub]
    value = (os.environ.get(info["endpoint_env"]) or info["default_endpoint"]).strip().rstrip("/")
    if "://" not in value:
        value = "https://" + value
    scheme, rest = value.split("://", 1)
    netloc, _, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}" + (f"/{path}" if path else "")


def _error_chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (huggingface_hub wraps the HEAD call's error
    in LocalEntryNotFoundError), outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def hub_error_message(exc: BaseException, hub: str, repo: str, revision: str | None) -> str | None:
    """One line for a hub error a user can fix, or None when ``exc`` is not one.

    Names the repo, the revision and the hub's host and says what to do; never includes the
    token (nor the client's message, which may echo request headers). Kinds, from the client's
    own exception classes (huggingface_hub/errors.py: GatedRepoError, RepositoryNotFoundError,
    RevisionNotFoundError, HfHubHTTPError, LocalEntryNotFoundError; the mapping from the hub's
    ``X-Error-Code`` header is huggingface_hub/utils/_http.py ``hf_raise_for_status``; ModelScope:
    NotExistError, NotLoginException and requests' HTTPError/ConnectionError by class name):

    - gated repo, no token (401) or the token's account not granted (403);
    - repo not found, or private and not readable with the token sent (or without one);
    - token rejected (401 "Invalid credentials"): invalid or expired;
    - unknown revision (branch, tag or commit);
    - host unreachable (connection refused, DNS, timeout, offline mode).
    """
    info = HUB_HELP[hub]
    endpoint = hub_endpoint(hub)
    host = endpoint.split("://", 1)[1]
    rev = revision or ("main" if hub == "hf" else "master")
    where = f"{hub}://{repo}@{rev} on {host}"
    has_token = bool(os.environ.get(info["token_env"], "").strip()) or (
        hub == "hf" and bool(os.environ.get("HUGGING_FACE_HUB_TOKEN", "").strip()))
    set_token = f"set {info['config_key']} (env {info['token_env']})"
    page = f"{endpoint}/{repo}" if hub == "hf" else f"{endpoint}/models/{repo}"
    names = [{cls.__name__ for cls in type(e).__mro__} for e in _error_chain(exc)]
    chain = list(zip(_error_chain(exc), names, strict=False))
    for e, n in chain:
        status = _http_status(e)
        if "GatedRepoError" in n:
            if status == 403 or has_token:
                return (f"{where}: gated model, and the token's account has not been granted access: accept the "
                        f"model's terms on {page} with that account (and wait for approval if it is manual), "
                        f"or {set_token} to a read token of an account that has access")
            return (f"{where}: gated model and no token was sent: accept the model's terms on {page}, then "
                    f"{set_token} to a read token of that account ({info['token_page']})")
        if "RevisionNotFoundError" in n:
            return (f"{where}: revision {rev!r} does not exist in {repo}: set kimi-deploy:model.revision to a "
                    f"branch, tag or 40-hex commit listed on {page}")
        if "DisabledRepoError" in n:
            return f"{where}: the repository is disabled on the hub: choose another repo or revision"
        if n & {"RepositoryNotFoundError", "NotExistError"}:
            if "NotExistError" in n and "revision" in str(e).lower():
                return (f"{where}: revision {rev!r} does not exist in {repo}: set kimi-deploy:model.revision to a "
                        f"branch, tag or 40-hex commit listed on {page}")
            if has_token:
                return (f"{where}: repository not found, or private and the token's account cannot read it: check "
                        f"the repo id ({page}) and that the token in {info['config_key']} has read access to it")
            return (f"{where}: repository not found, or private/gated and no token was sent: check the repo id "
                    f"({page}); for a private or gated repo {set_token} to a read token ({info['token_page']})")
        if "NotLoginException" in n or (status == 401 and n & {"HfHubHTTPError", "HTTPError"}):
            if has_token:
                return (f"{where}: the hub rejected the token (401: invalid or expired): create a read token at "
                        f"{info['token_page']} and {set_token} to it")
            return f"{where}: the hub requires a token (401): {set_token} to a read token ({info['token_page']})"
        if status == 403 and n & {"HfHubHTTPError", "HTTPError"}:
            return (f"{where}: the hub refused access (403): the token in {info['config_key']} lacks read "
                    f"permission for this repo (fine-grained tokens need read access to it); make a read token "
                    f"at {info['token_page']}")
    for e, n in chain:
        if "OfflineModeIsEnabled" in n:
            return f"{where}: HF_HUB_OFFLINE is set, so the hub is not contacted: unset it to download"
        if n & {"ConnectError", "ConnectTimeout", "TimeoutException", "ProxyError", "ConnectionError",
                "gaierror", "ConnectionRefusedError", "NewConnectionError"}:
            return (f"{where}: cannot reach the hub at {endpoint} ({type(e).__name__}): check this machine's "
                    f"network path to it (DNS, proxy, NAT gateway or security-group egress) and "
                    f"{info['endpoint_env']} ({'set' if os.environ.get(info['endpoint_env']) else 'unset: the public hub'})")
    for _, n in chain:
        if "JSONDecodeError" in n:
            # A proxy's login page or a wrong HF_ENDPOINT answers HTML where the hub's API answers JSON.
            return (f"{where}: {endpoint} answered something that is not the hub's JSON API (an HTML page: a proxy, a "
                    f"captive portal or a wrong {info['endpoint_env']}?): check {info['endpoint_env']} "
                    f"({'set' if os.environ.get(info['endpoint_env']) else 'unset: the public hub'}) and the network path")
    return None


def hub_errors(hub: str, repo: str, revision: str | None, *, transient_ok: bool = False):
    """Context manager: a hub error a user can fix leaves as ``SyncError`` (permanent) with the
    one line of ``hub_error_message``; an unreachable host, when ``transient_ok`` (a download that
    ``with_retries`` will try again), leaves as ``TransientError`` with that line."""
    import contextlib

    @contextlib.contextmanager
    def _wrap():
        try:
            yield
        except (SyncError, TransientError):
            raise
        except Exception as exc:
            message = hub_error_message(exc, hub, repo, revision)
            if message is None:
                raise
            if transient_ok and is_transient(exc):
                raise TransientError(message) from None
            raise SyncError(message) from None
    return _wrap()

