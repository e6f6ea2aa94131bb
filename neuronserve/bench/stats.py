"""Latency percentiles and throughput, computed the same way for every endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Summary:
    requests: int
    wall_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @property
    def throughput(self) -> float:
        """Completed requests per second of wall time (not per second of latency)."""
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0


def summarize(latencies_ms: Sequence[float], wall_s: float) -> Summary:
    """Percentiles by linear interpolation between order statistics (numpy's default,
    the same definition as `statistics.quantiles(..., method="inclusive")`)."""
    if not latencies_ms:
        raise ValueError("no latencies to summarize")
    if wall_s <= 0:
        raise ValueError(f"wall time must be positive, got {wall_s}")
    lat = np.asarray(latencies_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(lat, [50, 95, 99])
    return Summary(len(lat), float(wall_s), float(p50), float(p95), float(p99), float(lat.max()))
