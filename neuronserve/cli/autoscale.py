"""neuronserve autoscale sagemaker: target-tracking autoscaling for a SageMaker endpoint
variant, with the target taken from a benchmark or given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .options import fail

app = typer.Typer(
    help="Scale a deployment with its load.", rich_markup_mode="markdown", no_args_is_help=True
)


@app.command("sagemaker")
def sagemaker_cmd(
    endpoint: Annotated[str, typer.Argument(help="the SageMaker endpoint's name")],
    variant: Annotated[str, typer.Option(help="the production variant")] = "AllTraffic",
    min_instances: Annotated[int, typer.Option("--min", help="fewest instances")] = 1,
    max_instances: Annotated[int, typer.Option("--max", help="most instances")] = 4,
    invocations_per_instance: Annotated[
        float | None,
        typer.Option(
            help="target invocations per instance per minute (SageMakerVariantInvocations"
            "PerInstance); or let --from-bench derive it"
        ),
    ] = None,
    from_bench: Annotated[
        Path | None,
        typer.Option(
            help="a `neuronserve bench` results.json measured on the endpoint's instance "
            "type: the best req/s at --seq tokens x 60 x --safety becomes the target"
        ),
    ] = None,
    seq: Annotated[int, typer.Option(help="tokens per text your traffic has")] = 128,
    safety: Annotated[
        float, typer.Option(help="share of the measured peak to aim at (AWS suggests 0.5)")
    ] = 0.5,
    region: Annotated[str | None, typer.Option(help="AWS region [default: boto3's]")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the two API calls instead of making them")
    ] = False,
) -> None:
    """Register the endpoint variant with Application Auto Scaling and put a
    target-tracking policy on invocations per instance."""
    # long: typer declares one parameter per command-line option
    from ..platforms.sagemaker.scaling import (
        ScalingError,
        ScalingPlan,
        apply,
        best_rate,
        target_from_rate,
    )

    try:
        if invocations_per_instance is None:
            if from_bench is None:
                fail("give --invocations-per-instance, or --from-bench results.json")
            rate, where = best_rate(from_bench, seq)
            invocations_per_instance = target_from_rate(rate, safety)
            typer.echo(
                f"{from_bench}: best {rate:.1f} req/s at {seq} tokens ({where}) -> target "
                f"{invocations_per_instance:.0f} invocations per instance per minute"
            )
        plan = ScalingPlan(
            endpoint, variant, min_instances, max_instances, invocations_per_instance
        )
        plan.check()
        if dry_run:
            calls = {
                "register_scalable_target": plan.register_call(),
                "put_scaling_policy": plan.policy_call(),
            }
            typer.echo(json.dumps(calls, indent=2))
            return
        try:
            import boto3
        except ImportError:
            fail("boto3 is not installed: pip install 'neuronserve[aws]'", 1)
        apply(plan, boto3.client("application-autoscaling", region_name=region))
    except ScalingError as e:
        fail(str(e), 1)
    typer.echo(
        f"{plan.resource_id}: {min_instances}..{max_instances} instances, target "
        f"{plan.target:.0f} invocations per instance per minute (policy {plan.policy_name})"
    )
