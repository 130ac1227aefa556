"""Both Neuron SDK lines: the trace line (torch_neuronx.trace) and TorchNeuron (torch.compile)."""
