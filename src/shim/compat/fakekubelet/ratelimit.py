"""The token bucket the kubelet puts in front of its PodResources service.

pkg/kubelet/apis/podresources/grpc/ratelimit.go wraps every unary call in a golang.org/x/time/rate
Limiter (DefaultQPS = 100, DefaultBurstTokens = 10) and answers a call the limiter does not Allow()
with ErrorLimitExceeded: status RESOURCE_EXHAUSTED, "rejected by rate limit".
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_QPS = 100.0  # ratelimit.go DefaultQPS
DEFAULT_BURST = 10  # ratelimit.go DefaultBurstTokens
LIMIT_EXCEEDED = "rejected by rate limit"  # ratelimit.go ErrorLimitExceeded


class TokenBucket:
    """rate.Limiter's Allow(): `burst` tokens to start with, refilled at `qps` per second."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 0:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 0, not ({qps}, {burst})")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def allow(self) -> bool:
        """Take one token if there is one; False (and take nothing) when the bucket is empty."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
