"""The ``check`` command: golden references against independent implementations, then kernels.

Step 1 always runs: every NumPy reference in :mod:`siglip_serve.kernels.references` is compared
with torch on random inputs (e.g. conv2d+bias+maxpool against
``torch.nn.functional.conv2d`` + ``max_pool2d``). Step 2 runs each NKI kernel against
its reference, on the NKI simulator or a NeuronCore (the line installed here: torch-xla on Neuron
2.31, TorchNeuron on 2.33), at the runtime's LNC, only where a real ``nki`` is installed (and, for
``neuron``, a NeuronCore line); otherwise it reports that it skipped them and why, and the check
fails (``--kernels-on none`` asks for the references only).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from siglip_serve.kernels import references
from siglip_serve.kernels.device import DeviceUnavailableError, resolve_device
from siglip_serve.kernels.errors import KernelInputError
from siglip_serve.kernels.hardware import psum_banks_source, sbuf_budget_source
from siglip_serve.kernels.lnc import runtime_kernel_lnc
from siglip_serve.kernels.nki_launch import (
    CheckResult,
    check_kernel,
    compare,
    default_runs,
    nki_status,
    pin_simulator_target,
)

log = logging.getLogger(__name__)


def _torch_checks(rng: np.random.Generator) -> list[CheckResult]:
    import torch
    import torch.nn.functional as F

    def rand(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def t(x):
        return torch.from_numpy(x).double()

    results = []
    for n in (1, 127, 25600):
        a, b = rand(n), rand(n)
        results.append(compare(f"vector_add n={n}", "torch.add", references.vector_add(a, b),
                               torch.add(t(a), t(b)).numpy(), 1e-6, 1e-6))
    for shape in ((512, 700), (3, 5)):
        a, b = rand(*shape), rand(*shape)
        results.append(compare(f"tensor_add {shape}", "torch.add", references.tensor_add(a, b),
                               torch.add(t(a), t(b)).numpy(), 1e-6, 1e-6))
    for shape in ((200, 300), (1, 129), (128, 128)):
        x = rand(*shape)
        results.append(compare(f"transpose2d {shape}", "torch.Tensor.t", references.transpose2d(x),
                               t(x).t().numpy(), 0, 0))
    for x_shape, w_shape, pool in (((2, 3, 12, 14), (8, 3, 3, 3), 2), ((1, 130, 6, 7), (130, 130, 2, 2), 1),
                                   ((1, 4, 11, 9), (5, 4, 2, 3), 3)):
        x, w, bias = rand(*x_shape), rand(*w_shape), rand(w_shape[0])
        expected = F.conv2d(t(x), t(w), t(bias))
        if pool > 1:
            expected = F.max_pool2d(expected, pool)
        results.append(compare(f"conv2d_bias_maxpool x{x_shape} w{w_shape} pool={pool}",
                               "torch conv2d + max_pool2d",
                               references.conv2d_bias_maxpool(x, w, bias, pool), expected.numpy()))
    for tokens, hidden, inter in ((64, 256, 384), (5, 128, 128)):
        x = rand(tokens, hidden)
        wg, wu, wd = rand(hidden, inter) * 0.1, rand(hidden, inter) * 0.1, rand(inter, hidden) * 0.1
        expected = (F.silu(t(x) @ t(wg)) * (t(x) @ t(wu))) @ t(wd)
        results.append(compare(f"gated_mlp T={tokens} H={hidden} I={inter}", "torch silu/matmul",
                               references.gated_mlp(x, wg, wu, wd), expected.numpy()))
    x = rand(7, 96)
    gamma, beta = 1.0 + 0.1 * rand(96), 0.1 * rand(96)
    results.append(compare("layer_norm T=7 D=96", "torch layer_norm", references.layer_norm(x, gamma, beta, 1e-6),
                           F.layer_norm(t(x), (96,), t(gamma), t(beta), 1e-6).numpy()))
    w1, b1, w2, b2 = 0.1 * rand(96, 200), 0.1 * rand(200), 0.07 * rand(200, 96), 0.1 * rand(96)
    expected = F.linear(F.gelu(F.linear(t(x), t(w1).T, t(b1)), approximate="tanh"), t(w2).T, t(b2))
    results.append(compare("mlp_gelu T=7 D=96 I=200", "torch gelu(tanh)/linear",
                           references.mlp_gelu(x, w1, b1, w2, b2), expected.numpy()))
    scores = 4.0 * rand(5, 729)
    results.append(compare("softmax rows=5 keys=729", "torch softmax", references.softmax(scores, 0.12),
                           torch.softmax(t(scores) * 0.12, dim=-1).numpy(), 1e-6, 1e-9))
    return results


def kernel_setting(kernels_on: str) -> dict[str, str]:
    """What the kernels are held to here, and which source answered each (printed above the rows)."""
    budget, source = sbuf_budget_source()
    banks, why = psum_banks_source()
    setting = {"SBUF a kernel can use per partition": f"{budget} B ({source})",
               "PSUM banks a kernel can use": f"{banks} ({why})"}
    if kernels_on == "simulator":
        setting["NKI simulator target"] = pin_simulator_target()
    return setting


@dataclass
class CheckReport:
    references: list[CheckResult]
    kernels: list[CheckResult] = field(default_factory=list)
    kernels_skipped_reason: str = ""  # set when kernels were asked for and could not run
    # What the kernels ran against, as this machine answered (simulator target, SBUF and PSUM budgets).
    setting: dict[str, str] = field(default_factory=dict)

    @property
    def mismatches(self) -> bool:
        return not all(r.passed for r in self.references + self.kernels)

    @property
    def passed(self) -> bool:
        """Everything asked for ran and matched: skipped kernels are not a pass."""
        return not self.mismatches and not self.kernels_skipped_reason

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "references": [r.as_dict() for r in self.references],
            "kernels": [r.as_dict() for r in self.kernels],
            "kernels_skipped_reason": self.kernels_skipped_reason,
            "setting": self.setting,
        }

    def format(self) -> str:
        lines = [f"{name}: {value}" for name, value in self.setting.items()]
        lines.append(f"{'check':<62} {'against':<28} {'max |err|':>10}  result")
        lines.append("-" * len(lines[-1]))
        for r in self.references + self.kernels:
            lines.append(f"{r.name:<62} {r.target:<28} {r.max_abs_err:>10.3g}  {r.verdict} {r.detail}".rstrip())
        if self.kernels_skipped_reason:
            lines.append(f"NKI kernels SKIPPED: {self.kernels_skipped_reason}")
        if self.passed:
            lines.append("PASSED")
        elif self.mismatches:
            lines.append("FAILED")
        else:
            lines.append("FAILED: the NKI kernels were asked for but did not run "
                         "(install the Neuron SDK's nki, or pass --kernels-on none to check the references only)")
        return "\n".join(lines)


def run_checks(seed: int = 0, kernels_on: str = "simulator") -> CheckReport:
    """``kernels_on``: simulator, neuron, or none (references only)."""
    if kernels_on not in ("simulator", "neuron", "none"):
        raise KernelInputError(f"kernels_on must be simulator, neuron or none, got {kernels_on!r}")
    report = CheckReport(references=_torch_checks(np.random.default_rng(seed)))
    if kernels_on == "none":
        return report
    usable, reason = nki_status()
    if not usable:
        report.kernels_skipped_reason = f"{reason}; only the references were checked"
        log.warning("NKI kernels skipped: %s", reason)
        return report
    from siglip_serve.kernels.siglip import small_runs

    report.setting = kernel_setting(kernels_on)
    device = None
    if kernels_on == "neuron":
        # The NeuronCore of the line installed here (torch-xla on 2.31, TorchNeuron on 2.33), found once.
        try:
            device = resolve_device("neuron")
        except DeviceUnavailableError as exc:
            report.kernels_skipped_reason = f"{exc}; only the references were checked"
            log.warning("NKI kernels skipped: %s", exc)
            return report
        report.setting["NeuronCore"] = device.description
    lnc = runtime_kernel_lnc()
    for run in default_runs(seed, lnc) + small_runs(lnc, seed):
        try:
            report.kernels.append(check_kernel(run, on=kernels_on, device=device))
        except Exception as exc:  # a kernel that fails to build is a failed check, not a crash
            log.exception("kernel %s failed", run.name)
            report.kernels.append(CheckResult(run.name, f"nki kernel ({kernels_on})", float("inf"), False,
                                              f"{type(exc).__name__}: {exc}"))
    return report
