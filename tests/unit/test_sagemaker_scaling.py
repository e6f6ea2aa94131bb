"""SageMaker autoscaling: the calls are checked against botocore's own service model of
Application Auto Scaling (its Stubber refuses a parameter the API does not take or a
value of the wrong type), and the target comes from a bench result the way AWS's
load-testing guide says."""

from __future__ import annotations

import json

import pytest
from helpers import cli

from neuronserve.platforms.sagemaker import scaling as sc

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ParamValidationError  # noqa: E402
from botocore.stub import Stubber  # noqa: E402


def _client():
    return boto3.client(
        "application-autoscaling",
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def test_the_calls_match_the_service_model():
    plan = sc.ScalingPlan("minilm", "AllTraffic", 1, 4, target=3000)
    client = _client()
    with Stubber(client) as stub:
        stub.add_response("register_scalable_target", {}, plan.register_call())
        stub.add_response(
            "put_scaling_policy",
            {"PolicyARN": "arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:x"},
            plan.policy_call(),
        )
        sc.apply(plan, client)
        stub.assert_no_pending_responses()
    call = plan.policy_call()
    assert call["ResourceId"] == "endpoint/minilm/variant/AllTraffic"
    assert call["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    config = call["TargetTrackingScalingPolicyConfiguration"]
    assert config["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
    }
    assert config["TargetValue"] == 3000.0


def test_the_stubber_would_refuse_a_call_the_api_does_not_take():
    """Proof that the check above can fail: a misspelt field is refused by botocore."""
    plan = sc.ScalingPlan("minilm", "AllTraffic", 1, 4, target=3000)
    client = _client()
    bad = {**plan.register_call(), "MinInstances": 1}
    with Stubber(client) as stub:
        stub.add_response("register_scalable_target", {}, bad)
        with pytest.raises(ParamValidationError):
            client.register_scalable_target(**bad)


def test_bad_plans_are_refused_before_any_call():
    with pytest.raises(sc.ScalingError, match="min"):
        sc.ScalingPlan("e", "v", 3, 2, 100).check()
    with pytest.raises(sc.ScalingError, match="must be > 0"):
        sc.ScalingPlan("e", "v", 1, 2, 0).check()


def _bench(tmp_path):
    points = [
        {"endpoint": "front/throughput torchserve direct", "type": "torchserve", "baseline": True,
         "seq": 128, "texts": 1, "concurrency": 16, "req_per_s": 99.0, "errors": 0},
        {"endpoint": "front/throughput /embed", "type": "front", "baseline": False,
         "seq": 128, "texts": 1, "concurrency": 16, "req_per_s": 30.0, "errors": 0},
        {"endpoint": "front/throughput /invocations", "type": "front", "baseline": False,
         "seq": 128, "texts": 1, "concurrency": 1, "req_per_s": 16.0, "errors": 0},
        {"endpoint": "front/throughput /invocations", "type": "front", "baseline": False,
         "seq": 8, "texts": 1, "concurrency": 16, "req_per_s": 220.0, "errors": 0},
    ]  # fmt: skip
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"points": points}))
    return path


def test_target_from_a_bench_result(tmp_path):
    path = _bench(tmp_path)
    rate, where = sc.best_rate(path, 128)
    # the engine asked directly is not what the endpoint serves: the front's best
    assert rate == 30.0 and "/embed c=16" in where
    assert sc.target_from_rate(rate) == 900.0  # 30 req/s x 60 s x 0.5
    assert sc.best_rate(path, 8)[0] == 220.0
    with pytest.raises(sc.ScalingError, match="no front or SageMaker point at 512"):
        sc.best_rate(path, 512)


def test_cli_dry_run_prints_the_calls(tmp_path):
    r = cli(
        "autoscale", "sagemaker", "minilm", "--from-bench", _bench(tmp_path), "--seq", "128",
        "--max", "3", "--dry-run",
    )  # fmt: skip
    assert "best 30.0 req/s at 128 tokens" in r.stdout
    calls = json.loads(r.stdout[r.stdout.index("{") :])
    assert calls["register_scalable_target"]["MaxCapacity"] == 3
    policy = calls["put_scaling_policy"]["TargetTrackingScalingPolicyConfiguration"]
    assert policy["TargetValue"] == 900.0
    r = cli("autoscale", "sagemaker", "minilm", check=False)
    assert r.returncode == 2 and "--from-bench" in r.stderr
