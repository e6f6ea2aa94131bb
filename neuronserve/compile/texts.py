"""Real text for validating every bucket against the eager model at compile time."""

VALIDATION_TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Inferentia chips run compiled neural networks with fixed input shapes.",
    "She sold her bicycle and bought a ticket to Lisbon for the spring festival.",
    "Quarterly revenue grew by twelve percent, beating analyst expectations again.",
    "Please reset my password; the confirmation email never arrived.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Le chat dort sur le canapé pendant que la pluie tombe dehors.",
    "The committee postponed its decision until more evidence was available.",
    "Mix the flour, sugar and butter, then bake for twenty minutes at 180 degrees.",
    "Latency matters more than throughput for interactive search applications.",
    "Neural search ranks documents by the cosine similarity of their embeddings.",
    "The museum reopened after a two-year renovation of its east wing.",
]


# Queries and chat turns of one to a few tokens. Mean pooling over so few tokens averages
# nothing out: all-MiniLM-L6-v2's int8 builds that keep 0.9992-0.9996 on the longer
# texts fall to 0.9957-0.9985 on these, NNCF's static int8 from 0.993 to 0.70
# (benchmarks/precision-variants-minilm-openvino.md), so a lower precision is judged on
# them too.
SHORT_TEXTS = [
    "?",
    "hello",
    "Thanks!",
    "Yes.",
    "ok",
    "42",
    "Paris",
    "café",
    "help me",
    "reset password",
    "😀",
    "Wie geht's?",
]

ACCURACY_TEXTS = 96


def accuracy_texts(n: int = ACCURACY_TEXTS) -> list[str]:
    """`n` distinct texts: the set on which a lower precision's accuracy against fp32
    eager is measured. The short texts above, then texts built from the validation
    sentences whose length varies from a few words to several sentences, so short and
    long buckets both count."""
    return SHORT_TEXTS[:n] + _varied(max(n - len(SHORT_TEXTS), 0))


def calibration_texts(n: int = 64) -> list[str]:
    """`n` texts made as the accuracy texts are, none of them one of those: static int8
    calibrates its activation ranges on these, so the accuracy it is judged on is
    measured on texts it was not calibrated on (the same sentences' words, other cuts)."""
    judged = ACCURACY_TEXTS - len(SHORT_TEXTS)
    return _varied(judged + n)[judged:]


def _varied(n: int) -> list[str]:
    texts: list[str] = []
    k = len(VALIDATION_TEXTS)
    i = 0
    while len(texts) < n:
        parts = [VALIDATION_TEXTS[(i * 7 + j * 5) % k] for j in range(1 + i % 6)]
        words = " ".join(parts).split()
        text = " ".join(words[: 4 + (i * 13) % max(len(words) - 3, 1)])
        if text not in texts:
            texts.append(text)
        i += 1
    return texts
