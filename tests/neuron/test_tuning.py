"""`neuronserve tune` on a skewed length distribution, on the simulated NeuronCore (the
stand-in's device-time mode, bert-base's published inf2 times): the grid it proposes
within the default grid's budget (12 buckets, at most 128 tokens) pads fewer tokens and,
compiled with --apply and run on the same texts, takes less device time than the default
grid (batch 1, 4, 8 x 16, 32, 64, 128), each measured as the core's busy time."""

from __future__ import annotations

import os
import random
import re

import pytest
from helpers import run_cli, standin_env, standin_process

TEXTS = 240


@pytest.fixture
def device_time(monkeypatch, tmp_path):
    monkeypatch.setenv("NEURON_STANDIN_DEVICE_DIR", str(tmp_path / "devices"))
    monkeypatch.setenv("NEURON_STANDIN_DEVICE_TIME", "inf2-bert-base")
    with standin_process(4):
        import _standin_runtime as rt

        yield rt


def _skewed(path) -> list[str]:
    """Most texts of 20-40 tokens (the default grid pads them to 32 or 64), some longer."""
    rng = random.Random(7)
    words = ["river", "bank", "boat", "the", "a", "sky", "report", "quarterly", "revenue", "market"]
    lengths = [rng.choice([18, 22, 36, 40]) for _ in range(TEXTS - 24)] + [
        rng.randint(70, 110) for _ in range(24)
    ]
    texts = [" ".join(rng.choice(words) for _ in range(n)) for n in lengths]
    path.write_text("\n".join(texts) + "\n")
    return texts


def _device_seconds(rt, artifact, texts) -> tuple[float, float]:
    """(busy seconds of the cores, share of the tokens run that were padding) serving
    `texts` in requests of 8, once to keep every row (the stand-in computes a row on the CPU
    the first time), then measured."""
    from neuronserve.execution import RunReport
    from neuronserve.runtime import Runner

    runner = Runner(artifact, warmup=False)
    batches = [texts[i : i + 8] for i in range(0, len(texts), 8)]
    for batch in batches:
        runner.responses([runner.parse({"inputs": batch})])
    busy = sum(c.busy_s for c in rt._cores.values())
    real = run = 0
    for batch in batches:
        report = RunReport()
        runner.responses([runner.parse({"inputs": batch})], report)
        real += sum(r.real_tokens for r in report.runs)
        run += sum(r.rows * r.bucket.seq for r in report.runs)
    return sum(c.busy_s for c in rt._cores.values()) - busy, 1 - real / run


def test_a_tuned_grid_pads_less_and_takes_less_device_time(
    device_time, tiny_embedder_dir, tmp_path
):
    texts = _skewed(tmp_path / "texts.txt")
    default = tmp_path / "default"
    env = {**os.environ, **standin_env(4)}  # the commands on the same simulated host
    run_cli("compile", "--model", tiny_embedder_dir, "--target", "neuronx", "--precision", "fp32",
            "--out", default, env=env)  # fmt: skip
    out = run_cli("tune", default, "--texts", tmp_path / "texts.txt", "--apply", tmp_path / "tuned",
                  "--source", tiny_embedder_dir, env=env).stdout  # fmt: skip
    line = r"^(today|proposed)\s+([\d, ]+?)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)"
    rows = {m.group(1): m for m in re.finditer(line, out, re.M)}
    assert rows["today"].group(2).split(", ") == ["16", "32", "64", "128"], out
    proposed = [int(s) for s in rows["proposed"].group(2).split(", ")]
    assert len(proposed) <= 4 and proposed[-1] == 128, out
    assert float(rows["proposed"].group(3)) < float(rows["today"].group(3)), out
    assert float(rows["proposed"].group(4)) < float(rows["today"].group(4)), out
    from neuronserve.artifact import read_manifest

    tuned = read_manifest(tmp_path / "tuned")
    assert tuned.sequence_lengths == proposed and tuned.batch_sizes == [1, 4, 8]
    was, was_padded = _device_seconds(device_time, default, texts)
    now, now_padded = _device_seconds(device_time, tmp_path / "tuned", texts)
    assert now_padded < was_padded and now < 0.95 * was, (now, was, now_padded, was_padded)
