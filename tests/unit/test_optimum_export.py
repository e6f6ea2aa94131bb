"""Reading an optimum-neuron export's config (what `optimum-cli export neuron` writes),
deciding where it runs, and serving its first answer pooled on the host."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from neuronserve.artifact import ExportSettings
from neuronserve.compile import CompileError
from neuronserve.compile.optimum_export import check_runs_here, read_export
from neuronserve.exports import served


def export_folder(tmp_path, model_type="bert", **neuron):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": model_type,
        "_name_or_path": "BAAI/bge-small-en-v1.5",
        "neuron": {
            "compiler_type": "neuronx-cc",
            "compiler_version": "2.16.372.0+4a9b2326",
            "static_batch_size": 1,
            "static_sequence_length": 128,
            "dynamic_batch_size": False,
            "task": "feature-extraction",
            **neuron,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.neuron").write_bytes(b"compiled")
    return tmp_path


def test_a_folder_without_a_compiled_module_or_section_is_no_export(tmp_path):
    assert read_export(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "model.neuron").write_bytes(b"x")
    assert read_export(tmp_path) is None  # a config without a neuron section
    # the Hugging Face toolkit's compile settings alone (no compiler_type): not an export
    (tmp_path / "config.json").write_text(json.dumps({"neuron": {"static_batch_size": 4}}))
    assert read_export(tmp_path) is None


def test_the_export_says_its_target_shape_and_inputs(tmp_path):
    export = read_export(export_folder(tmp_path))
    assert export is not None
    assert (export.target, export.batch, export.seq) == ("neuronx", 1, 128)
    assert export.grid.batch_sizes == (1,) and export.grid.sequence_lengths == (128,)
    assert export.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert export.source == "BAAI/bge-small-en-v1.5"
    dynamic = read_export(export_folder(tmp_path, "xlm-roberta", dynamic_batch_size=True))
    assert dynamic is not None and dynamic.grid.batch_sizes == (1, 2, 4, 8)
    assert dynamic.input_names == ["input_ids", "attention_mask"]  # as optimum's config
    # optimum-neuron's sentence-transformers config records its model type as "transformer"
    st = read_export(export_folder(tmp_path))
    assert st is not None and not st.sentence_transformers
    config = json.loads((tmp_path / "config.json").read_text())
    config["neuron"]["model_type"] = "transformer"
    (tmp_path / "config.json").write_text(json.dumps(config))
    st = read_export(tmp_path)
    assert st is not None and st.sentence_transformers
    assert st.input_names == ["input_ids", "attention_mask"]


def test_an_export_without_a_shape_or_of_an_unknown_compiler_is_refused(tmp_path):
    with pytest.raises(CompileError, match="static_batch_size"):
        read_export(export_folder(tmp_path, static_batch_size=None))
    with pytest.raises(CompileError, match="neither neuronx-cc nor neuron-cc"):
        read_export(export_folder(tmp_path, compiler_type="tvm"))


def test_an_export_for_another_target_names_both_ways_out(tmp_path):
    export = read_export(export_folder(tmp_path))
    assert export is not None
    check_runs_here(export, "neuronx")  # no compiler installed here: nothing to compare
    with pytest.raises(CompileError) as e:
        check_runs_here(export, "cpu")
    assert "serve it on an Inf2/Trn1 host" in str(e.value)
    assert "--recompile to compile its source model BAAI/bge-small-en-v1.5 for cpu" in str(e.value)


def test_its_first_answer_is_pooled_over_the_mask_on_the_host():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    module = lambda *tensors: (hidden, torch.zeros(2, 4))  # noqa: E731 - an export's answer
    names = ["input_ids", "attention_mask"]
    ids = torch.zeros(2, 5, dtype=torch.long)
    mean = served(module, ExportSettings(by="optimum-neuron", pooling="mean"), names)(ids, mask)
    h, m = hidden.numpy(), mask.numpy()
    want = np.stack([h[i, m[i] == 1].mean(0) for i in range(2)])  # the kept tokens' mean
    assert np.allclose(mean.numpy(), want, atol=1e-6)
    cls = served(module, ExportSettings(by="optimum-neuron", pooling="cls"), names)(ids, mask)
    assert np.allclose(cls.numpy(), h[:, 0])
    logits = served(module, ExportSettings(by="optimum-neuron"), names)(ids, mask)
    assert logits.shape == (2, 5, 4)  # as it is: the first tensor
    assert served(module, None, names) is module  # neuronserve's own modules


def test_an_export_whose_weights_are_not_inlined_is_refused(tmp_path):
    from neuronserve.compile.job import CompileJob
    from neuronserve.compile.optimum_export import import_export
    from neuronserve.spec import load_spec

    export = read_export(export_folder(tmp_path / "e", inline_weights_to_neff=False))
    assert export is not None
    job = CompileJob.of(load_spec(None, {"target": "neuronx", "allow_exported_module": True}))
    with pytest.raises(CompileError, match=r"weights are not in model\.neuron .* --recompile"):
        import_export(job, export, tmp_path / "out")


RUNS_CODE = r"runs code of its own.*--allow-exported-module.*--recompile"


def test_an_export_whose_load_writes_a_file_is_never_loaded_unasked(
    tmp_path, tiny_embedder_dir, monkeypatch
):
    """A Hub repository or folder shaped as an optimum-neuron export, whose model.neuron
    writes a file when loaded: refused, naming the risk, by compile, by the cache that
    `serve front --model` and HF_MODEL_ID compile through, and by the containers'
    entrypoint; nothing loads it, so the file is never written."""
    from helpers import compile_model
    from optimum_exports import export_writing_at_load

    from neuronserve.compile.cache import compiled
    from neuronserve.compile.job import CompileJob
    from neuronserve.platforms.sagemaker.entrypoint import sagemaker_deployment, sagemaker_spec
    from neuronserve.spec import load_spec

    written = tmp_path / "written"
    export = export_writing_at_load(tmp_path / "export", tiny_embedder_dir, written)
    torch.jit.load(str(export / "model.neuron"))  # the probe is real: a load writes it
    assert written.read_bytes() == b"AAAA"
    written.unlink()
    monkeypatch.setenv("NEURONSERVE_CACHE", str(tmp_path / "cache"))
    fields = {"model": export, "artifact": tmp_path / "art", "target": "neuronx"}
    with pytest.raises(CompileError, match=RUNS_CODE):
        compile_model(load_spec(None, fields), progress=False)
    with pytest.raises(CompileError, match=RUNS_CODE):
        compiled(CompileJob.of(load_spec(None, fields)), log=lambda _: None, progress=False)
    monkeypatch.setenv("HF_MODEL_ID", str(export))
    monkeypatch.setenv("NEURONSERVE_TARGET", "neuronx")
    spec = sagemaker_spec(tmp_path / "work")
    with pytest.raises(CompileError, match=RUNS_CODE):
        sagemaker_deployment(spec.with_section("compile", target="neuronx"), tmp_path / "work")
    assert not written.exists()
    assert not (tmp_path / "art").exists()


def test_an_export_allowed_is_imported_and_claims_no_check_neuronserve_did_not_make(
    tmp_path, tiny_embedder_dir, monkeypatch
):
    """With the opt-in (the flag, or NEURONSERVE_ALLOW_EXPORTED_MODULE in a container) the
    export is imported as it is, not loaded at compile; its manifest says neuronserve did
    not check it. An artifact imported without that record is refused before any load."""
    from helpers import compile_model
    from optimum_exports import export_writing_at_load

    from neuronserve.artifact import ArtifactError, read_manifest
    from neuronserve.runtime import Runner
    from neuronserve.spec import from_environment, load_spec

    written = tmp_path / "written"
    export = export_writing_at_load(tmp_path / "export", tiny_embedder_dir, written)
    given = from_environment({"NEURONSERVE_ALLOW_EXPORTED_MODULE": "true"})
    assert given == {"compile": {"allow_exported_module": True}}
    fields = {"model": export, "artifact": tmp_path / "art", "target": "neuronx"}
    art = compile_model(load_spec(None, {**fields, **given["compile"]}), progress=False)
    m = read_manifest(art)
    assert m.exported is not None and m.exported.allowed
    assert m.validation_status == "imported"
    assert "not checked by neuronserve" in (m.validation_note or "")
    assert "optimum-neuron checked" not in json.dumps(m.model_dump())
    assert not written.exists()  # imported, never loaded here
    # an artifact an earlier neuronserve imported unasked: refused before its module loads
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["exported"]["allowed"] = False
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="without --allow-exported-module"):
        Runner(art, warmup=False)
    assert not written.exists()
