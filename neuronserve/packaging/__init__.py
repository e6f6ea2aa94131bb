"""Packagers: TorchServe archives (Triton repositories and SageMaker contexts to come)."""
