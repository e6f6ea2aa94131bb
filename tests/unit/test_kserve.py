"""The front's KServe v2 binary-tensor codec against tritonclient's own: the request it
builds is the one tritonclient builds, and it reads an answer as tritonclient reads it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from neuronserve import tensors
from neuronserve.engines.triton import kserve
from neuronserve.tensors import bytes_rows

TEXTS = ["naïve café 🎉", "", "a", "東京 and São Paulo"]
PAIRS = ["x", "y y", "", "z"]


def _split(body: bytes, header_length: int) -> tuple[dict, bytes]:
    return json.loads(body[:header_length]), body[header_length:]


def test_the_request_is_the_one_tritonclient_builds():
    columns = {"TEXT": TEXTS, "TEXT_PAIR": PAIRS}
    params = {"model": "m", "truncate": True, "top_k": 3}
    body, headers = kserve.infer_body(
        {k: [v.encode() for v in vs] for k, vs in columns.items()}, ["EMBEDDING", "TOKENS"], params
    )
    inputs = []
    for name, values in columns.items():
        tensor = httpclient.InferInput(name, [len(values), 1], "BYTES")
        tensor.set_data_from_numpy(bytes_rows(values))
        inputs.append(tensor)
    want, want_length = httpclient.InferenceServerClient.generate_request_body(
        inputs,
        outputs=[
            httpclient.InferRequestedOutput("EMBEDDING", binary_data=True),
            httpclient.InferRequestedOutput("TOKENS", binary_data=True),
        ],
        parameters=params,
    )
    assert headers["Content-Type"] == "application/octet-stream"
    got_header, got_data = _split(body, int(headers[kserve.HEADER_LENGTH]))
    want_header, want_data = _split(want, want_length)
    assert got_header == want_header and got_data == want_data


def _answer(outputs: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """An answer as Triton writes it: the JSON header, then each output's bytes."""
    header, data = {"model_name": "m", "outputs": []}, b""
    for name, array in outputs.items():
        raw = serialize_byte_tensor(array).item() if array.dtype == object else array.tobytes()
        datatype = (
            "BYTES"
            if array.dtype == object
            else {"float32": "FP32", "int64": "INT64", "int32": "INT32"}[str(array.dtype)]
        )
        header["outputs"].append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        data += raw
    head = json.dumps(header).encode()
    return head + data, len(head)


@pytest.mark.parametrize(
    "outputs",
    [
        {
            "EMBEDDING": np.random.default_rng(0).normal(size=(3, 384)).astype(np.float32),
            "TOKENS": np.array([[7], [1], [300]], dtype=np.int32),
        },
        {
            "LOGITS": np.arange(6, dtype=np.int64).reshape(3, 2),
            "RESULTS": np.array([b'{"a": 1}', b"", "é".encode()], dtype=object).reshape(3, 1),
        },
    ],
)
def test_an_answer_is_read_as_tritonclient_reads_it(outputs):
    body, length = _answer(outputs)
    want = httpclient.InferResult.from_response_body(body, header_length=length)
    found = tensors.unpack_all(body, str(length))
    assert sorted(found) == sorted(outputs)
    for name in outputs:
        got, expected = found[name], want.as_numpy(name)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert np.array_equal(got, expected)


def test_an_error_answer_gives_its_message():
    assert kserve.error_message(b'{"error": "unknown model"}') == "unknown model"
    assert kserve.error_message(b"<html>bad gateway") == "<html>bad gateway"
