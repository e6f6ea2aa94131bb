"""compile on the CPU target: manifest contents, one copy of the weights, validation
that fails loudly, and integrity checks at load."""

import json
import shutil

import pytest
import torch
from helpers import compile_model

from neuronserve.artifact import ArtifactError, read_manifest, sha256_file
from neuronserve.compile import CompileError
from neuronserve.compile.cpu import CpuTarget
from neuronserve.runtime import Runner
from neuronserve.spec import load_spec


def test_manifest_records_what_serving_needs(minilm_artifact, minilm_dir):
    m = json.loads((minilm_artifact / "manifest.json").read_text())
    assert m["task"] == "feature-extraction"
    assert m["architecture"] == "BertModel" and m["model_type"] == "bert"
    assert m["target"] == "cpu"
    assert m["batch_sizes"] == [1, 4, 8] and m["sequence_lengths"] == [16, 64, 256]
    assert [(i["name"], i["dtype"]) for i in m["inputs"]] == [
        ("input_ids", "int64"),
        ("attention_mask", "int64"),
        ("token_type_ids", "int64"),
    ]
    assert m["pooling"] == "mean" and m["normalize"] is True  # from sentence-transformers files
    assert m["tokenizer"]["max_length"] == 256 and m["tokenizer"]["truncation"] is False
    assert {"torch", "transformers", "tokenizers", "neuronserve"} <= set(m["versions"])
    # every bucket validated against eager, on real text
    assert {(v["batch"], v["seq"]) for v in m["validation"]} == {
        (b, s) for b in (1, 4, 8) for s in (16, 64, 256)
    }
    assert all(v["max_abs_diff"] <= m["tolerance"] for v in m["validation"])
    # every bucket timed through the kept modules, which the Runner splits batches by
    assert set(m["bucket_ms"]) == {f"b{b}_s{s}" for b in (1, 4, 8) for s in (16, 64, 256)}
    assert all(ms > 0 for ms in m["bucket_ms"].values())
    assert m["bucket_ms"]["b8_s256"] > m["bucket_ms"]["b1_s16"]
    # a checksum for every file, and they match
    files = {p.name for p in minilm_artifact.iterdir()} - {"manifest.json"}
    assert set(m["files"]) == files
    for rel, digest in m["files"].items():
        assert sha256_file(minilm_artifact / rel) == digest


def test_dynamic_target_keeps_one_copy_of_the_weights(minilm_artifact, minilm_dir):
    m = read_manifest(minilm_artifact)
    assert m.modules == {"dynamic": "model.openvino"}  # the fixture asks for OpenVINO's
    weights = (minilm_dir / "model.safetensors").stat().st_size
    total = sum(p.stat().st_size for p in minilm_artifact.iterdir())
    assert total <= 1.2 * weights, (total, weights)


class _Skewed(torch.nn.Module):
    def __init__(self, inner, scale, bias):
        super().__init__()
        self.inner, self.scale, self.bias = inner, scale, bias

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.inner(input_ids, attention_mask, token_type_ids) * self.scale + self.bias


@pytest.mark.parametrize(
    "scale,bias,needle",
    [
        (1.05, 0.0, "differs from the eager model"),
        (1.0, float("nan"), "NaN or inf"),
    ],
)
def test_unfaithful_compile_is_refused(tmp_path, classifier_dir, monkeypatch, scale, bias, needle):
    real = CpuTarget.compile

    def skewed(self, module, example, options):
        return real(self, _Skewed(module, scale, bias), example, options)

    monkeypatch.setattr(CpuTarget, "compile", skewed)
    spec = load_spec(
        None,
        {
            "model": classifier_dir,
            "artifact": tmp_path / "out",
            "task": "text-classification",
            "batch_sizes": [1],
            "sequence_lengths": [16],
            "precision": "fp32",
        },
    )
    with pytest.raises(CompileError, match=needle):
        compile_model(spec, progress=False)
    assert not (tmp_path / "out").exists()  # no half-written artifact left behind


def test_compile_errors_are_clear(tmp_path, minilm_dir):
    with pytest.raises(CompileError, match=r"no config\.json"):
        compile_model(load_spec(None, {"model": tmp_path, "artifact": tmp_path / "o"}), False)
    spec = load_spec(
        None, {"model": minilm_dir, "artifact": tmp_path / "o", "sequence_lengths": [1024]}
    )
    with pytest.raises(CompileError, match="max_position_embeddings"):
        compile_model(spec, progress=False)


@pytest.mark.parametrize("victim", ["tokenizer.json", "module"])
def test_tampered_artifact_is_refused_naming_the_file(tmp_path, minilm_artifact, victim):
    if victim == "module":
        victim = read_manifest(minilm_artifact).modules["dynamic"]
    copy = tmp_path / "minilm"
    shutil.copytree(minilm_artifact, copy)
    with open(copy / victim, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ArtifactError, match=f"{victim} does not match its sha256"):
        Runner(copy, warmup=False)


def test_unlisted_and_missing_files_are_refused(tmp_path, minilm_artifact):
    copy = tmp_path / "minilm"
    shutil.copytree(minilm_artifact, copy)
    (copy / "extra.bin").write_bytes(b"x")
    (copy / "config.json").unlink()
    with pytest.raises(ArtifactError) as e:
        read_manifest(copy)
    assert "config.json is missing" in str(e.value)
    assert "extra.bin is not listed" in str(e.value)


def test_openvino_asks_the_precision_each_build_was_checked_in():
    from neuronserve.compile.openvino import inference_precision

    # fp32 must be asked for: on a bf16 CPU the plugin's default is bf16
    assert inference_precision("fp32", bf16_here=True) == "f32"
    assert inference_precision("bf16", bf16_here=True) == "bf16"
    # int8 runs what lies between its quantised operators in bf16 only where the CPU has it
    assert inference_precision("int8", bf16_here=True) == "bf16"
    assert inference_precision("int8", bf16_here=False) == "f32"
