"""The platforms a deployment runs on: SageMaker (its container build context,
entrypoint and scaling policy) and Kubernetes (plain and KServe manifests), each running
neuronserve's server."""
