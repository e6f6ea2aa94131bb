"""What a compile raises, importable without torch (the front and the SageMaker
entrypoint name it before deciding to compile)."""


class CompileError(RuntimeError):
    """Compilation or validation against the eager model failed."""
