"""Benchmark building blocks (the `neuronserve bench` command is issue 5's work)."""
