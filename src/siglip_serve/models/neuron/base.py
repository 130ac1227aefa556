"""What the two Neuron SDK lines (the trace line and TorchNeuron) have in common: the refusal they
raise and the neuronx-cc recipe they compile with, with its command-line options.

Torch-free on purpose: TorchNeuron's compile command and launcher use it before torch is imported,
because torch autoloads torch-neuronx, which reads its environment at that moment.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from siglip_serve.core.constants import LNC_ENV, TRN2_DEFAULT_LNC, VALID_LNC
from siglip_serve.core.errors import UserError

AUTO_CAST_MODES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
OPT_LEVELS = (1, 2, 3)


class NeuronRefusal(UserError, RuntimeError):
    """A Neuron backend or compile will not go on here; the message is one line with the fix."""


@dataclass(frozen=True, kw_only=True)
class NeuronOptions:
    """neuronx-cc's recipe; the defaults are seed 000's (LNC, -O3, matmult auto-cast to bf16,
    transformer) for SigLIP-SO400M on trn2. Each line says how it hands them to the compiler."""

    lnc: int = TRN2_DEFAULT_LNC
    optlevel: int = 3
    auto_cast: str = "matmult"
    auto_cast_type: str = "bf16"
    model_type: str = "transformer"
    target: str = "trn2"
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.lnc not in VALID_LNC:
            raise ValueError(f"--lnc must be 1 or 2, got {self.lnc}")
        if self.optlevel not in OPT_LEVELS:
            raise ValueError(f"--optlevel must be 1, 2 or 3, got {self.optlevel}")
        if self.auto_cast not in AUTO_CAST_MODES:
            raise ValueError(f"--auto-cast must be one of {AUTO_CAST_MODES}, got {self.auto_cast!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace, lnc: int, extra_args: Sequence[str] = (), **line: Any) -> Self:
        """The options `add_recipe_arguments` parsed; `line` holds the line's own (trace: verbose)."""
        return cls(lnc=lnc, optlevel=args.optlevel, auto_cast=args.auto_cast, auto_cast_type=args.auto_cast_type,
                   model_type=args.model_type, target=args.target,
                   extra_args=tuple(args.compiler_arg) + tuple(extra_args), **line)


def add_recipe_arguments(group: argparse._ArgumentGroup) -> None:
    """Both compile commands' recipe options; --lnc is left unset so each line can take the runtime's."""
    group.add_argument("--lnc", type=int, choices=VALID_LNC,
                       help=f"logical NeuronCore size (default: ${LNC_ENV}, else {TRN2_DEFAULT_LNC})")
    group.add_argument("--optlevel", type=int, choices=OPT_LEVELS, default=NeuronOptions.optlevel)
    group.add_argument("--auto-cast", choices=AUTO_CAST_MODES, default=NeuronOptions.auto_cast)
    group.add_argument("--auto-cast-type", choices=AUTO_CAST_TYPES, default=NeuronOptions.auto_cast_type)
    group.add_argument("--model-type", default=NeuronOptions.model_type)
    group.add_argument("--target", default=NeuronOptions.target)
    group.add_argument("--compiler-arg", action="append", default=[], metavar="ARG",
                       help="one more compiler argument, repeatable (write --compiler-arg=--flag)")
