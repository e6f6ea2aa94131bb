"""Packagers: artifacts -> what other servers load (a Triton model repository, a
TorchServe model store) and what our own server's images hold (a SageMaker build
context). neuronserve serves on its own workers only: Triton and TorchServe are started
by their users, on what these write."""
