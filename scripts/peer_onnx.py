"""A copy of a model folder for infinity-emb's optimum engine: onnx/model.onnx exported by
the peer venv's own torch (optimum 1.24's exporter fails under torch 2.13), the inputs in
the order of the model's forward (DistilBERT takes no token_type_ids), and the config
naming the bare encoder so the peer serves it as an embedder whatever head it was saved
with. Run with the peer venv's Python:

    /tmp/infvenv/bin/python scripts/peer_onnx.py MODEL_DIR PEER_DIR
"""

import inspect
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

source, peer = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(peer, ignore_errors=True)
shutil.copytree(source, peer)
(peer / "onnx").mkdir()
model, tok = AutoModel.from_pretrained(peer).eval(), AutoTokenizer.from_pretrained(peer)
enc = tok(["a sentence to trace"], return_tensors="pt")
takes = list(inspect.signature(model.forward).parameters)
names = [n for n in takes if n in ("input_ids", "attention_mask", "token_type_ids") and n in enc]
axes = {n: {0: "batch_size", 1: "sequence_length"} for n in [*names, "last_hidden_state"]}
torch.onnx.export(
    model,
    tuple(enc[n] for n in names),
    str(peer / "onnx" / "model.onnx"),
    input_names=names,
    output_names=["last_hidden_state"],
    dynamic_axes=axes,
    opset_version=17,
    dynamo=False,
)
model.config.architectures = [type(model).__name__]
model.config.save_pretrained(peer)
