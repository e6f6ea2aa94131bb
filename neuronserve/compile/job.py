"""What a compile reads of a deployment spec, and nothing more: its compile and accuracy
sections, where the artifact goes and what it is called, the truncation the artifact
records, and how many NeuronCores one worker spans (a compiler option)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..spec import AccuracySection, CompileSection, DeploySpec


@dataclass(frozen=True)
class CompileJob:
    compile: CompileSection
    accuracy: AccuracySection
    out: Path | None
    name: str | None = None
    truncation: bool | None = None
    neuron_cores: int | None = None

    @classmethod
    def of(cls, spec: DeploySpec) -> CompileJob:
        return cls(
            compile=spec.compile,
            accuracy=spec.accuracy,
            out=Path(spec.artifact) if spec.artifact is not None else None,
            name=spec.name,
            truncation=spec.truncation,
            neuron_cores=spec.worker.neuron_cores,
        )
