"""Autoscaling of a SageMaker endpoint variant: Application Auto Scaling with a
target-tracking policy on invocations per instance.

The calls are those of the "Automatic scaling of Amazon SageMaker AI models" guide:
register the variant's DesiredInstanceCount as a scalable target, then put a
TargetTrackingScaling policy on the predefined metric
SageMakerVariantInvocationsPerInstance, which counts invocations per instance per
minute. The guide's load-testing rule sets the target to the highest rate one instance
sustains times 60 times a safety factor (0.5 by default), which is what
`target_from_rate` computes from a `neuronserve bench` result.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
SAFETY = 0.5


class ScalingError(RuntimeError):
    pass


@dataclass(frozen=True)
class ScalingPlan:
    endpoint: str
    variant: str
    min_instances: int
    max_instances: int
    # invocations per instance per minute
    target: float
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60

    @property
    def resource_id(self) -> str:
        return f"endpoint/{self.endpoint}/variant/{self.variant}"

    @property
    def policy_name(self) -> str:
        return f"{self.endpoint}-{self.variant}-invocations"

    def check(self) -> None:
        if not 1 <= self.min_instances <= self.max_instances:
            raise ScalingError(
                f"need 1 <= min ({self.min_instances}) <= max ({self.max_instances}) instances"
            )
        if self.target <= 0:
            raise ScalingError(f"target {self.target} invocations per instance must be > 0")

    def register_call(self) -> dict[str, Any]:
        return {
            "ServiceNamespace": NAMESPACE,
            "ResourceId": self.resource_id,
            "ScalableDimension": DIMENSION,
            "MinCapacity": self.min_instances,
            "MaxCapacity": self.max_instances,
        }

    def policy_call(self) -> dict[str, Any]:
        return {
            "PolicyName": self.policy_name,
            "ServiceNamespace": NAMESPACE,
            "ResourceId": self.resource_id,
            "ScalableDimension": DIMENSION,
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": float(self.target),
                "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
                # a new instance loads and warms every bucket before it serves: add
                # capacity quickly, remove it slowly
                "ScaleInCooldown": self.scale_in_cooldown_s,
                "ScaleOutCooldown": self.scale_out_cooldown_s,
            },
        }


def target_from_rate(req_per_s: float, safety: float = SAFETY) -> float:
    """Invocations per instance per minute for an instance that sustains `req_per_s`."""
    if req_per_s <= 0 or not 0 < safety <= 1:
        raise ScalingError(f"rate {req_per_s} req/s and safety {safety} must be positive")
    return float(math.floor(req_per_s * 60 * safety))


def best_rate(results: Path, seq: int, endpoint: str | None = None) -> tuple[float, str]:
    """The highest req/s a `neuronserve bench` results.json measured at `seq` tokens
    (one text per request) through a front or SageMaker endpoint, and which it was."""
    try:
        points = json.loads(Path(results).read_text())["points"]
    except (OSError, ValueError, KeyError) as e:
        raise ScalingError(f"{results} is not a neuronserve bench results.json: {e}") from None
    rows = [
        p
        for p in points
        if p.get("seq") == seq
        and p.get("texts", 1) == 1
        and p.get("req_per_s")
        and not p.get("errors")
        and p.get("type") in ("front", "sagemaker")
        and not p.get("baseline")
        and (endpoint is None or endpoint in p["endpoint"])
    ]
    if not rows:
        raise ScalingError(
            f"{results} has no front or SageMaker point at {seq} tokens"
            + (f" matching {endpoint!r}" if endpoint else "")
        )
    best = max(rows, key=lambda p: p["req_per_s"])
    return float(best["req_per_s"]), f"{best['endpoint']} c={best['concurrency']}"


def apply(plan: ScalingPlan, client: Any) -> None:
    """Register the variant and put the policy through an application-autoscaling client
    (boto3.client("application-autoscaling"))."""
    plan.check()
    client.register_scalable_target(**plan.register_call())
    client.put_scaling_policy(**plan.policy_call())
