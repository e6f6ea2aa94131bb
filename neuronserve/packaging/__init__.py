"""Packagers: an artifact -> what an engine or a platform runs (a TorchServe .mar, a
Triton repository, a SageMaker build context)."""
