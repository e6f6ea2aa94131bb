"""neuronserve: serve Hugging Face encoders compiled ahead of time, one pinned worker
per core group, behind TorchServe, Triton and SageMaker."""

__version__ = "0.1.0"
