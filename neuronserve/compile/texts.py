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
