# Sourced by the simulation's scripts (from the repository's root): one inf2 NeuronCore
# and its 2 host CPUs, the Neuron stand-in in device-time mode (the time AWS publishes for
# BERT-base on inf2 per call), its devices under $SIM. Sets ROOT and SIM.
ROOT=$(pwd)
SIM=${WORK:-$ROOT/.bench}/inferentia-sim
STANDIN=$ROOT/tests/neuron_standin
export PATH=$STANDIN/bin:$PATH PYTHONPATH=$STANDIN
export NEURON_STANDIN_CORES=1 NEURON_STANDIN_CORES_PER_DEVICE=1
export NEURON_STANDIN_DEVICE_DIR=$SIM/devices NEURON_STANDIN_DEVICE_TIME=inf2-bert-base
