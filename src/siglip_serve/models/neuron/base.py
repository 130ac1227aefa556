"""What the two Neuron SDK lines (the trace line and TorchNeuron) have in common.

Torch-free on purpose: TorchNeuron's compile command and launcher use it before torch is imported,
because torch autoloads torch-neuronx, which reads its environment at that moment.
"""

from __future__ import annotations

from siglip_serve.core.errors import UserError


class NeuronRefusal(UserError, RuntimeError):
    """A Neuron backend or compile will not go on here; the message is one line with the fix."""
