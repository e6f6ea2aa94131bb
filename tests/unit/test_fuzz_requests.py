"""Property-based tests (hypothesis) of everything that reads what a client sent: the
request decoder and every task's parser in the Runner (the path TorchServe's handler and
Triton's model.py take), the front's request bodies, and the headers the front reads
(Content-Type, Authorization, X-Request-Timeout). Whatever arrives, the result is a
served answer or a RequestError with a 4xx status: never another exception, never a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import as_sent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronserve.serve.front import schemas
from neuronserve.serve.front.guard import _Call, _deadline
from neuronserve.serve.front.keys import Keys
from neuronserve.tasks import RequestError

# as many examples as the profile says (tests/conftest.py: 50 quick, 150 thorough)
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
# requests shaped like the real ones, with anything in their fields
shaped = st.fixed_dictionaries(
    {"inputs": json_values},
    optional={
        "parameters": st.dictionaries(
            st.sampled_from(["truncate", "truncation_direction", "top_k", "raw_scores", "x"]),
            json_values,
            max_size=3,
        )
        | json_values
    },
)
content_types = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "",
        "application/octet-stream",
        "application/json; charset=utf-8",
    ]
) | st.text(max_size=30)


def served_or_4xx(result: Any) -> None:
    if isinstance(result, RequestError):
        assert 400 <= result.status < 500, (result.status, result.message)
    else:
        assert isinstance(as_sent(result), (list, dict)), type(result)


@pytest.fixture(params=["minilm", "classifier"])
def runner(request, tiny_runner, classifier_runner):
    return tiny_runner if request.param == "minilm" else classifier_runner


@FUZZ
@given(body=st.binary(max_size=300), content_type=content_types)
def test_arbitrary_bytes_are_answered_or_refused_4xx(runner, body, content_type):
    served_or_4xx(runner.responses_for_bodies([(body, content_type)])[0])


@FUZZ
@given(value=json_values | shaped)
def test_arbitrary_json_is_answered_or_refused_4xx(runner, value):
    body = json.dumps(value).encode()
    served_or_4xx(runner.responses_for_bodies([(body, "application/json")])[0])


@FUZZ
@given(value=json_values | shaped)
def test_json_already_decoded_by_torchserve_is_answered_or_refused_4xx(runner, value):
    # TorchServe hands the handler an application/json body as the decoded object
    served_or_4xx(runner.responses_for_bodies([(value, "application/json")])[0])


@FUZZ
@given(values=st.lists(json_values | shaped, min_size=2, max_size=4))
def test_a_bad_request_never_takes_its_batch_neighbours_down(runner, values):
    good = json.dumps({"inputs": "a fine text"}).encode()
    bodies = [(json.dumps(v).encode(), "application/json") for v in values] + [
        (good, "application/json")
    ]
    results = runner.responses_for_bodies(bodies)
    for r in results:
        served_or_4xx(r)
    assert not isinstance(results[-1], RequestError)  # the neighbour is answered


@FUZZ
@given(
    body=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
    model=st.sampled_from(
        [
            schemas.OpenAIEmbeddingsRequest,
            schemas.EmbedRequest,
            schemas.PredictRequest,
            schemas.RerankRequest,
            schemas.TokenizeRequest,
        ]
    ),
)
def test_the_fronts_bodies_parse_or_name_the_problem(body, model):
    try:
        schemas.parse_body(body, model)
    except RequestError as e:
        assert e.status == 400 and e.message


def _call(headers: dict[bytes, bytes]) -> _Call:
    scope = {"type": "http", "path": "/embed", "headers": list(headers.items())}

    async def nothing() -> dict:
        return {}

    return _Call(scope, nothing, nothing, None)  # type: ignore[arg-type]


@FUZZ
@given(timeout=st.binary(max_size=20), request_id=st.binary(max_size=80))
def test_request_timeout_and_id_headers_never_raise(timeout, request_id):
    call = _call({b"x-request-timeout": timeout, b"x-request-id": request_id})
    deadline = _deadline(call, 60.0)
    assert deadline is None or 0 < deadline <= 60.0
    assert 1 <= len(call.request_id) <= 64  # a bad id is replaced, never echoed


@FUZZ
@given(authorization=st.binary(max_size=80))
def test_authorization_header_is_a_yes_or_no(authorization):
    keys = Keys((b"secret-one",), "test")
    accepted = keys.accepts(authorization)
    assert accepted in (True, False)
    assert not accepted or b"secret-one" in authorization
    assert keys.accepts(b"Bearer secret-one") and keys.accepts(b"bearer  secret-one ")
