"""Faults a test injects into the fake API server.

Each rule matches requests by HTTP verb and a regex on the path, and fires for the next N
matching requests: an error Status (5xx, 409 Conflict, 429), or a lost response (the server
performs the request, then drops the connection without answering, as a timeout looks to a
client). Watch drops close every open watch stream mid-way (no terminating chunk).

A 429 carries ``Retry-After`` as the API server's max-in-flight and priority-and-fairness
filters send it: ``Retry-After: 1`` and a plain-text body "Too many requests, please try again
later." (staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go, tooManyRequests, which
priority-and-fairness.go calls too when a request is rejected).

A slow answer (``delay_next``): the server waits before it serves a request, as a loaded API
server or, for pods/log, the kubelet the API server proxies the request to does (the API server
opens the log from the node's kubelet, pkg/registry/core/pod/rest/log.go LogREST.Get, and
answers once the kubelet does).

Half-open streams (``stall_streams``): every watch and followed log open at that moment stops
sending and is never closed, the connection kept, as when a NAT, load balancer or sleeping laptop
drops the path without a FIN or RST (RFC 9293 3.5.1, half-open connections). The Python client
then blocks in a read with no error unless it set a client-side timeout
(kubernetes-client/python issue #1148). New streams are served normally.

A control-plane outage (``outage``), as a managed cluster's upgrade replaces its API server: the
old server, once its shutdown delay has elapsed, answers every new request 429 with
``Retry-After: 5`` and "The apiserver is shutting down, please try again later."
(staging/src/k8s.io/apiserver/pkg/server/filters/with_retry_after.go, WithRetryAfter), then, until
a new one serves, the load balancer in front answers 503. Each phase lasts a stated time, from
when it is armed.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Rule:
    verb: str | None          # GET, POST, PUT, PATCH, DELETE; None = any
    path: re.Pattern[str]
    remaining: int
    action: str               # "error" | "lose_response" | "delay"
    code: int = 503
    reason: str = "ServiceUnavailable"
    watch: bool | None = None  # restrict to watch (True) / non-watch (False) requests
    fired: int = 0
    retry_after: str | None = None   # the Retry-After header of the error (a 429's: "1")
    window: tuple[float, float] | None = None   # fires only between these time.monotonic() instants
    message: str | None = None       # a 429's plain-text body, when not maxinflight.go's
    delay_s: float = 0.0             # "delay": how long the server waits before serving


@dataclass
class Faults:
    rules: list[Rule] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    watch_generation: int = 0   # bumped by drop_watches(); open streams compare and close
    stall_generation: int = 0   # bumped by stall_streams(); open streams compare and go silent

    def fail_next(self, n: int = 1, *, code: int = 503, verb: str | None = None,
                  path: str = ".*", watch: bool | None = None, retry_after: str | None = None) -> Rule:
        reason = {500: "InternalError", 503: "ServiceUnavailable", 502: "BadGateway",
                  504: "Timeout", 429: "TooManyRequests", 409: "Conflict"}.get(code, "Unknown")
        if code == 429 and retry_after is None:
            retry_after = "1"           # maxinflight.go: retryAfter = "1"
        return self._add(Rule(verb, re.compile(path), n, "error", code, reason, watch, retry_after=retry_after))

    def outage(self, seconds: float, *, shutting_down_s: float = 0.0, verb: str | None = None,
               path: str = ".*") -> list[Rule]:
        """From now: ``shutting_down_s`` of the old API server's 429s (Retry-After: 5), then
        ``seconds`` of 503s, then service as before (see the module docstring)."""
        now = time.monotonic()
        rules = []
        if shutting_down_s > 0:
            rules.append(self._add(Rule(verb, re.compile(path), 10**9, "error", 429, "TooManyRequests",
                                        window=(now, now + shutting_down_s), retry_after="5",
                                        message="The apiserver is shutting down, please try again later.")))
        start = now + shutting_down_s
        rules.append(self._add(Rule(verb, re.compile(path), 10**9, "error", 503, "ServiceUnavailable",
                                    window=(start, start + seconds))))
        return rules

    def stall_streams(self) -> None:
        """Every open watch and followed log goes half-open (see the module docstring)."""
        with self.lock:
            self.stall_generation += 1

    def conflict_next(self, n: int = 1, *, verb: str | None = None, path: str = ".*") -> Rule:
        return self.fail_next(n, code=409, verb=verb, path=path)

    def lose_response_next(self, n: int = 1, *, verb: str | None = None,
                           path: str = ".*") -> Rule:
        return self._add(Rule(verb, re.compile(path), n, "lose_response"))

    def delay_next(self, n: int = 1, *, seconds: float, verb: str | None = None, path: str = ".*") -> Rule:
        """The next ``n`` matching requests are served ``seconds`` late (see the module docstring)."""
        return self._add(Rule(verb, re.compile(path), n, "delay", delay_s=seconds))

    def drop_watches(self) -> None:
        with self.lock:
            self.watch_generation += 1

    def _add(self, rule: Rule) -> Rule:
        with self.lock:
            self.rules.append(rule)
        return rule

    def match(self, verb: str, path: str, is_watch: bool) -> Rule | None:
        """The first armed rule for this request (consumes one of its shots)."""
        now = time.monotonic()
        with self.lock:
            for rule in self.rules:
                if rule.remaining <= 0:
                    continue
                if rule.window is not None and not rule.window[0] <= now < rule.window[1]:
                    continue
                if rule.verb and rule.verb != verb:
                    continue
                if rule.watch is not None and rule.watch != is_watch:
                    continue
                if not rule.path.search(path):
                    continue
                rule.remaining -= 1
                rule.fired += 1
                return rule
            return None

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
