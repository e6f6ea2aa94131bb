"""The SageMaker `serve` entrypoint of a triton build context, run as the image runs
it: /ping is 503 until every worker is ready, SAGEMAKER_MODEL_SERVER_WORKERS is capped at
the host's core groups, and /invocations answers like the Runner in process."""

from __future__ import annotations

import pytest
from helpers import check_ping_and_workers, check_sagemaker_contract, start_sagemaker

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def serve(tmp_path_factory, minilm_artifact):
    serve = start_sagemaker(tmp_path_factory.mktemp("sagemaker"), minilm_artifact, "triton")
    yield serve
    serve.stop()


def test_ping_is_503_until_ready_and_workers_are_capped(serve):
    check_ping_and_workers(serve)


def test_invocations_answer_like_the_runner(serve, minilm_runner):
    check_sagemaker_contract(serve.url, minilm_runner)
