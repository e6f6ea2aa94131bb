"""Stand-in for the neuronxcc package (neuronx-cc, the compiler torch-neuronx calls),
which the SDK installs beside torch-neuronx: only its version, which optimum-neuron reads
to refuse a module compiled by a newer compiler (optimum/neuron/utils/version_utils.py
`check_compiler_compatibility`). NEURON_STANDIN_NEURONXCC sets it; the default is this
stand-in's own choice, not a release's."""

import os

__version__ = os.environ.get("NEURON_STANDIN_NEURONXCC", "2.19.0.0")
