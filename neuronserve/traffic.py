"""What a server saw of its traffic, the input for tuning a bucket grid (`neuronserve
tune`): per model, the tokens of each text its requests sent (before padding) and the
rows of each device call its workers ran (the batch sizes formed). Both are Prometheus
histograms on the front's /metrics, with the fixed buckets below, and are read back from
that text here.

    neuronserve_text_tokens{model}   the front, from the tokens the workers counted
    neuronserve_batch_rows{model}    the workers' device calls, as they report them
"""

from __future__ import annotations

from dataclasses import dataclass

# Bucket bounds, fixed so that every server's histograms compare and a tuner can take
# each bound as a sequence length to compile: steps of 8 to 64 tokens (where short
# queries differ by a few), then of a quarter to a half of the length, to 8192.
TOKEN_BUCKETS = (
    8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
    640, 768, 1024, 1536, 2048, 3072, 4096, 8192,
)  # fmt: skip
# rows per device call: every batch size a grid may hold up to 256
ROW_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

TEXT_TOKENS = "neuronserve_text_tokens"
BATCH_ROWS = "neuronserve_batch_rows"
REQUESTS = "neuronserve_front_requests"  # the front's, by route, status and model


@dataclass(frozen=True)
class Counts:
    """A histogram read back: how many observations fell at or under each bound and
    above the one before (`by_bound`, the last bound inf), and their sum."""

    by_bound: dict[float, int]
    total: float

    @property
    def count(self) -> int:
        return sum(self.by_bound.values())


@dataclass(frozen=True)
class Traffic:
    """One model's traffic as the server saw it."""

    model: str
    tokens: Counts
    rows: Counts
    requests: int = 0  # answered (2xx), on every route

    @property
    def texts_per_request(self) -> float:
        return self.tokens.count / self.requests if self.requests else 1.0


def read(metrics_text: str, model: str) -> Traffic:
    """`model`'s text tokens and batch rows from a /metrics text; a ValueError naming
    what is missing when the server has served it nothing yet."""
    from prometheus_client.parser import text_string_to_metric_families

    cumulative: dict[str, dict[float, float]] = {TEXT_TOKENS: {}, BATCH_ROWS: {}}
    sums: dict[str, float] = {TEXT_TOKENS: 0.0, BATCH_ROWS: 0.0}
    requests = 0.0
    for family in text_string_to_metric_families(metrics_text):
        mine = [s for s in family.samples if s.labels.get("model") == model]
        if family.name == REQUESTS:
            requests += sum(
                s.value for s in mine
                if s.name.endswith("_total") and s.labels.get("status", "").startswith("2")
            )  # fmt: skip
        elif family.name in cumulative:
            for sample in mine:
                if sample.name.endswith("_bucket"):
                    cumulative[family.name][float(sample.labels["le"])] = sample.value
                elif sample.name.endswith("_sum"):
                    sums[family.name] = sample.value
    tokens, rows = (_counts(n, cumulative[n], sums[n], model) for n in (TEXT_TOKENS, BATCH_ROWS))
    return Traffic(model, tokens, rows, int(requests))


def _counts(name: str, cumulative: dict[float, float], total: float, model: str) -> Counts:
    if not cumulative or max(cumulative.values()) == 0:
        raise ValueError(f"the server reports no {name} for model {model!r}: send it traffic first")
    by_bound, before = {}, 0.0
    for bound in sorted(cumulative):
        by_bound[bound] = int(cumulative[bound] - before)
        before = cumulative[bound]
    return Counts(by_bound, total)
