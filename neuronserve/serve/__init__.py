"""Engine control: starting TorchServe and Triton with truthful readiness, stopping
them, and the SageMaker entrypoint in front of either."""
