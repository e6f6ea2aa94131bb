"""Build-context files for SageMaker images: Dockerfiles per target and `serve`."""
