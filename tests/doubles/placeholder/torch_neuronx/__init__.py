# What PyPI's torch-neuronx 1.0 placeholder does on import (its whole __init__.py), for testing that
# the neuron backend recognises it. Not the Neuron SDK.
raise ImportError("WRONG PACKAGE. Please install the package from Neuron Repository - pip.repos.neuron.amazonaws.com")
