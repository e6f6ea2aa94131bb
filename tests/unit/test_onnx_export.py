"""A CPU compile's ONNX candidates share one export of the module (onnx_export.exported)."""

import stat

import torch

from neuronserve.compile import onnx_export


def test_one_module_and_its_inputs_are_exported_once_and_the_file_goes_with_the_module(
    monkeypatch,
):
    made = []

    def export(module, example, names, path, per_token=False):
        made.append((names, per_token))
        path.write_bytes(b"onnx")
        return {"of": len(made)}

    monkeypatch.setattr(onnx_export, "export_eager_attention", export)
    module = torch.nn.Linear(2, 2)
    ids = (torch.ones(1, 4, dtype=torch.long),)
    first = onnx_export.exported(module, ids, ["input_ids", "attention_mask"])
    again = onnx_export.exported(module, (torch.ones(1, 4, dtype=torch.long),), ["input_ids"])
    assert first == again and made == [(["input_ids"], False)]
    assert stat.S_IMODE(first[0].parent.stat().st_mode) == 0o700  # this user's alone
    # other values, another output shape or another module: an export of their own
    onnx_export.exported(module, (torch.zeros(1, 4, dtype=torch.long),), ["input_ids"])
    onnx_export.exported(module, ids, ["input_ids"], per_token=True)
    other = onnx_export.exported(torch.nn.Linear(2, 2), ids, ["input_ids"])
    assert len(made) == 4 and other[0] != first[0]
    folder = first[0].parent
    del module  # its last reference: the export goes with it (no collection needed)
    assert not folder.exists()
