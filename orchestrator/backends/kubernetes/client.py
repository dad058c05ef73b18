"""Calling the Kubernetes API with bounded retries of transient failures.

Retries of 429/5xx/connection errors happen here, per API call and bounded; retrying a failed
*attempt* is the supervisor's job.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, TypeVar

from ...adaptors.kubernetes import api_exception, api_status, connection_errors
from ...errors import BackendError, EngineUnavailable

T = TypeVar("T")

RETRYABLE_STATUS = {429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    status = api_status(exc)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(exc, connection_errors())


def call(fn: Callable[..., T], *args: Any, what: str = "", attempts: int = 5,
         backoff: float = 0.1, max_backoff: float = 2.0, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retrying transient failures (429, 5xx, dropped connections).

    Non-transient ApiExceptions (404, 409, 422, 403 ...) propagate at once for the caller to
    interpret. When the retries are spent, a BackendError/EngineUnavailable names ``what``."""
    ApiException = api_exception()
    delay = backoff
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status not in RETRYABLE_STATUS:
                raise
            if i == attempts - 1:
                raise BackendError(f"Kubernetes API kept failing for {what or fn.__name__}: "
                                   f"{exc.status} {exc.reason}",
                                   hint="check the API server's health; wmctl retried "
                                   f"{attempts} times") from None
        except connection_errors() as exc:
            if i == attempts - 1:
                raise EngineUnavailable(f"cannot reach the Kubernetes API for "
                                        f"{what or fn.__name__}: {exc}",
                                        hint="check the cluster address and your network") from None
        time.sleep(delay)
        delay = min(delay * 2, max_backoff)
    raise AssertionError("unreachable")


def call_json(fn: Callable[..., Any], *args: Any, what: str = "", **kwargs: Any) -> Any:
    """``call`` without the client's model deserialisation: the parsed JSON body.

    Raw dicts are what the pure classifiers take, and they sidestep model mismatches (a
    Foreground delete answers 202 with the Job itself where the client's model says Status)."""
    resp = call(fn, *args, what=what, _preload_content=False, **kwargs)
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return json.loads(data) if data else {}
