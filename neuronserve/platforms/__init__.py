"""The platforms a deployment runs on that are not engines: SageMaker (its container
build context, entrypoint and scaling policy) and Kubernetes (plain and KServe
manifests). Each reads the deployment as every engine offers it, above the engines."""
