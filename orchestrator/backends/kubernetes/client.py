"""Calling the Kubernetes API with bounded retries of transient failures.

Retries of 429/5xx/connection errors happen here, per API call and bounded; retrying a failed
*attempt* is the supervisor's job. ``Backoff`` is the one delay policy: exponential with jitter,
never shorter than a 429's ``Retry-After``; ``call`` and the watch reconnects (watch.py) both use
it, each with the sleep it is given (tests inject one; the watcher's is interruptible).

Every request carries a client-side timeout. The client sets none by default (urllib3 then
waits forever): a connection that goes half-open (a NAT or load balancer forgets it, a laptop
sleeps) leaves a watch or log read blocked for hours with no error (kubernetes-client/python
issue #1148; the client's examples/watch/timeout-settings.md). ``timeout_seconds`` on a watch
is only a request to the server to end it.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any, Callable, TypeVar

from ...adaptors.kubernetes import api_exception, api_status, connection_errors
from ...errors import CredentialsRejected, EngineUnavailable

T = TypeVar("T")

RETRYABLE_STATUS = {429, 500, 502, 503, 504}

# (connect, read) seconds for a plain request: a create, read, list, patch or delete.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
# A stream (watch, followed log) may be quiet for its whole server-side timeout; its read
# timeout is that plus this margin, so only a stream that is really dead times out.
STREAM_MARGIN_S = 10.0
# A Retry-After longer than this is capped (a bound on how long one call can sleep).
MAX_RETRY_AFTER_S = 60.0


def request_timeout(read: float = READ_TIMEOUT_S) -> tuple[float, float]:
    """The client's ``_request_timeout``: (connect, read between two received bytes)."""
    return (CONNECT_TIMEOUT_S, read)


def stream_timeout(server_timeout_s: float) -> tuple[float, float]:
    """``_request_timeout`` of a watch that asked the server for ``timeout_seconds``."""
    return (CONNECT_TIMEOUT_S, server_timeout_s + STREAM_MARGIN_S)


def retry_after_s(exc: BaseException) -> float | None:
    """A 429's (or 503's) ``Retry-After``: delta-seconds or an HTTP-date (RFC 9110 10.2.3). The
    API server sends whole seconds: "1" from its max-in-flight and priority-and-fairness filters
    (staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go, tooManyRequests)."""
    headers = getattr(exc, "headers", None) or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    if not raw:
        return None
    raw = str(raw).strip()
    if raw.isdigit():
        return float(raw)
    import email.utils   # only a Retry-After date asks; a dry run does not load it

    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Backoff:
    """Delays between retries: exponential from ``base`` up to ``cap``, each drawn uniformly from
    its upper half (jitter, so watchers cut off together do not reconnect together), and never
    shorter than a server's ``Retry-After``."""

    def __init__(self, base: float = 0.1, cap: float = 2.0, rng: Callable[[], float] = random.random):
        self.base, self.cap, self.rng = base, cap, rng
        self._next = base

    def reset(self) -> None:
        self._next = self.base

    def delay(self, exc: BaseException | None = None) -> float:
        step = self._next
        self._next = min(self._next * 2, self.cap)
        jittered = step / 2 + self.rng() * step / 2
        after = retry_after_s(exc) if exc is not None else None
        return max(jittered, min(after, MAX_RETRY_AFTER_S)) if after is not None else jittered


def is_transient(exc: BaseException) -> bool:
    status = api_status(exc)
    if status is not None:
        return status in RETRYABLE_STATUS
    return isinstance(exc, connection_errors())


def rejected(what: str) -> CredentialsRejected:
    """A 401 that a reloaded credential did not cure (credentials.Credentials reloads on each)."""
    return CredentialsRejected(f"the Kubernetes API rejects wmctl's credentials (401 Unauthorized) for {what}",
                               hint="the credential expired and reloading the kubeconfig did not renew it: "
                               "log in again (kubectl get ns tells when it works), then `wmctl watch <run>`")


def call(fn: Callable[..., T], *args: Any, what: str = "", attempts: int = 5,
         backoff: float = 0.1, max_backoff: float = 2.0, sleep: Callable[[float], None] = time.sleep,
         timeout: tuple[float, float] | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, retrying transient failures (429, 5xx, dropped connections and
    timeouts), each request bounded by ``timeout`` (default ``request_timeout()``).

    Non-transient ApiExceptions (404, 409, 422, 403 ...) propagate at once for the caller to
    interpret, except 401: the credential was already reloaded once (credentials.py), so it is
    CredentialsRejected. When the retries are spent the API is unavailable (EngineUnavailable,
    naming ``what``): an outage or a server that keeps throttling, which callers wait out (the
    supervisor rides out a submission or teardown through it; poll() reports it), never a refusal
    of the request itself."""
    ApiException = api_exception()
    kwargs.setdefault("_request_timeout", timeout or request_timeout())
    delays = Backoff(backoff, max_backoff)
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 401:
                raise rejected(what or fn.__name__) from None
            if exc.status not in RETRYABLE_STATUS:
                raise
            if i == attempts - 1:
                raise EngineUnavailable(f"Kubernetes API unavailable for {what or fn.__name__}: "
                                        f"{exc.status} {exc.reason}",
                                        hint="the API server is down, restarting or throttling; wmctl retried "
                                        f"{attempts} times") from None
            sleep(delays.delay(exc))
        except connection_errors() as exc:
            if i == attempts - 1:
                raise EngineUnavailable(f"cannot reach the Kubernetes API for "
                                        f"{what or fn.__name__}: {exc}",
                                        hint="check the cluster address and your network") from None
            sleep(delays.delay())
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


def close_stream(resp: Any) -> None:
    """Give a streamed response's connection back closed, never for reuse. A stream left before
    its end (a followed log, a watch) still belongs to the server's handler, which reads no new
    request until the stream ends: pooled, the connection would hold the next call made on it
    until its read timeout. kubernetes/watch/watch.py ends its streams the same way."""
    resp.close()
    resp.release_conn()


# How often poll() proves that the API server still answers, and how long one proof may take.
PROBE_INTERVAL_S = 5.0
PROBE_TIMEOUT_S = 15.0     # an API server under load (priority-and-fairness queueing) may be slow, not down
OUTAGE_STATUS = {500, 502, 503, 504}


class Contact:
    """poll()'s proof that the API server answers. The watch threads reconnect by themselves and
    report nothing, so without this an API outage (a control-plane upgrade, a dead load
    balancer) looks to the supervisor like a quiet run. At most every ``interval`` seconds one
    GET /version (readable by every user: the system:public-info-viewer role), one try with a
    short timeout: no answer, a refused connection or a 5xx raise EngineUnavailable, which the
    supervisor waits out without touching the run (supervisor._poll), polling again. A 401 (the
    credential expired and reloading it did not help: credentials.py) is CredentialsRejected, an
    EngineUnavailable too: wmctl has lost contact, the run is not hung. Any other answer (403/429
    included) is an API server that is there."""

    def __init__(self, interval: float = PROBE_INTERVAL_S, timeout: float = PROBE_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.interval, self.timeout, self.clock = interval, timeout, clock
        self._ok_at: float | None = None

    def check(self, api_client: Any) -> None:
        from ...adaptors.kubernetes import sdk

        now = self.clock()
        if self._ok_at is not None and now - self._ok_at < self.interval:
            return
        try:
            resp = sdk().VersionApi(api_client).get_code(_preload_content=False,
                                                         _request_timeout=(CONNECT_TIMEOUT_S, self.timeout))
            try:
                resp.read()             # the whole body: the connection goes back ready for reuse
            finally:
                resp.release_conn()
        except api_exception() as exc:
            if exc.status == 401:
                raise rejected("GET /version") from None
            if exc.status in OUTAGE_STATUS:
                raise EngineUnavailable(f"the Kubernetes API answers {exc.status} {exc.reason}",
                                        hint="the API server is down or restarting; wmctl waits") from None
        except connection_errors() as exc:
            raise EngineUnavailable(f"the Kubernetes API does not answer: {exc}",
                                    hint="check the cluster address and your network") from None
        self._ok_at = now
