"""The one retry layer: which errors are transient, and the loop that retries them.

Every other layer is told not to retry (botocore ``total_max_attempts=1``, s3transfer
``num_download_attempts=1`` and the classic transfer manager (the CRT one retries on its own),
s5cmd ``--retry-count 0``: see ``sources.py``), so a failing request is tried exactly
``RETRY_ATTEMPTS`` times (before: botocore 5 x our loop 5, s5cmd 1 + 10 retries x our 5). The attempt budget lives here only."""
from __future__ import annotations

import errno
import random
import time

from .model import INTEGRITY_ATTEMPTS, IntegrityError, SyncError, TransientError, UsageError

# The attempt budget of every transfer (the only one: no client below retries on its own).
RETRY_ATTEMPTS = 5
RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
# ---------------------------------------------------------------------------------------------
# Errors: transient or permanent


def _status_of(exc: BaseException) -> int | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):  # botocore ClientError
        return resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return getattr(resp, "status_code", None)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: 408/429/5xx, S3 throttling codes, timeouts, dropped
    connections. False for 4xx (not found, auth), unknown revisions, disk full and bugs."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, SyncError):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "GatedRepoError",
                "NoCredentialsError", "PartialCredentialsError", "NotExistError", "ParamValidationError"}:
        return False
    code = getattr(exc, "response", None)
    code = code.get("Error", {}).get("Code") if isinstance(code, dict) else None
    if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                "ServiceUnavailable", "RequestTimeTooSkewed"):
        return True
    status = _status_of(exc)
    if status is not None:
        return status in (408, 429) or status >= 500
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
        return False
    if names & {"LocalEntryNotFoundError", "EndpointConnectionError", "ConnectionClosedError",
                "ReadTimeoutError", "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
                "ConnectionError", "TimeoutError", "TimeoutException", "NetworkError", "RemoteProtocolError",
                "ProtocolError", "ChunkedEncodingError", "S3ResponseError", "AWSConnectionError"}:
        return True
    return isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError))


def describe(exc: BaseException) -> str:
    """One line for a user: the error class and message, secrets never included."""
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return (f"{type(exc).__name__}: no usable AWS credentials for the S3 mirror: on a node the instance "
                "profile (or the Kubernetes service account's IAM role) provides them; elsewhere set AWS_PROFILE or "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a local S3)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, (SyncError, TransientError, UsageError)) else f"{type(exc).__name__}: {text}"

def with_retries(action, what: str, log) -> None:
    """Run `action()`; retry transient errors RETRY_ATTEMPTS times with jittered exponential
    backoff, and an IntegrityError once. Re-raises the last error."""
    transient = integrity = 0
    while True:
        try:
            return action()
        except IntegrityError as exc:
            integrity += 1
            text = describe(exc) if what in describe(exc) else f"{what}: {describe(exc)}"
            if integrity >= INTEGRITY_ATTEMPTS:
                raise IntegrityError(f"{text} (fetched {integrity} times; the source copy is bad)") from None
            log(f"{text}; fetching it once more")
        except Exception as exc:
            text = describe(exc) if what in describe(exc) else f"{what}: {describe(exc)}"
            if not is_transient(exc):
                raise (exc if isinstance(exc, SyncError) and text == describe(exc) else SyncError(text)) from None
            transient += 1
            if transient >= RETRY_ATTEMPTS:
                raise SyncError(f"{text} (giving up after {transient} attempts)") from None
            delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (transient - 1)) * random.uniform(0.5, 1.0)
            log(f"{text}; retry {transient}/{RETRY_ATTEMPTS - 1} in {delay:.1f} s")
            time.sleep(delay)

