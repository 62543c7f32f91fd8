"""Orthogonalized momentum for the hidden weight matrices: Muon, and ROOT (Muon made robust to matrix shape and
to outliers). Everything that is not a hidden matrix (embeddings, the output layer, biases, norms, 1-D params) is
updated by AdamW inside the same :class:`torch.optim.Optimizer`, so a run has one optimizer object whose
``param_groups`` all take the same ``lr``.

Muon (Jordan et al. 2024): keep an EMA momentum ``M`` of the gradient, replace it by the nearest semi-orthogonal
matrix ``U V^T`` of its SVD ``U S V^T`` (approximated by a few Newton-Schulz iterations of an odd quintic polynomial),
and step along that. The step is scaled as torch.optim.Muon's ``adjust_lr_fn="match_rms_adamw"`` does (Moonlight,
Liu et al. 2025): ``lr * 0.2 * sqrt(max(rows, cols))``, which gives the update the RMS of a typical AdamW update, so
one ``lr`` (the run's cosine schedule) serves the orthogonal and the AdamW groups alike.

Stacked recurrent gates. ``nn.LSTM``'s ``weight_ih``/``weight_hh`` are 4 gate matrices stacked along the rows
(input, forget, cell, output; ``nn.GRU`` 3: reset, update, new). With ``split_gates`` each gate block is
orthogonalized (and lr-scaled) on its own: each gate is its own linear map from the input or hidden state, and
orthogonalizing the stack would let the gate with the largest momentum own the shared singular directions and shrink
the others' steps (the joint ``U V^T`` only constrains the stack, so one gate's block of it can be nearly zero). Per
block, every gate gets a full-rank, equal-spectrum step of the same RMS; this is what Muon's practice of
orthogonalizing fused QKV projections per head/per matrix does for transformers.

ROOT (He et al. 2025, "ROOT: Robust Orthogonalized Optimizer for Neural Network Training", arXiv 2511.20626). From
the paper we take its two mechanisms, written here from its description:

(a) dimension-robust orthogonalization: the quintic Newton-Schulz coefficients ``(a, b, c)`` are not one fixed
    triple but fitted per matrix shape, since the spectrum of a normalized matrix (and so how far the iteration
    must push its singular values) depends on its shape. The paper ships coefficients fitted offline for the shapes
    of its LLMs (and falls back to Muon's for others); we fit them for each shape the model has, once, when the
    optimizer is built (:func:`fit_ns_coefficients`): starting from Muon's triple, a compass search minimizes the
    mean squared distance of the iterated polynomial's output from 1 over the singular values of probe matrices of
    that shape (a Gaussian matrix, whose Marchenko-Pastur spectrum depends on the aspect ratio, and two power-law
    spectra as gradients have), with a penalty that keeps the iteration bounded on all of [0, 1]. The coefficients
    are rounded to 4 decimals (as the paper's table is) so that every peer gets the same ones.
(b) the proximal step against outliers: the momentum is split ``M = B + O`` with ``O = T_eps(M)`` the elementwise
    soft-threshold ``sign(M) max(|M| - eps, 0)`` (the proximal operator of ``eps * ||O||_1``), and only the robust
    part ``B = M - O`` (that is, ``M`` clipped to ``[-eps, eps]``) is orthogonalized. As in the authors' reference
    training script, ``eps`` is a quantile of ``|M|`` (``outlier_quantile``, 0.9), recomputed each step per
    matrix (per gate block), so that the threshold follows the momentum's scale.
Simplifications: the coefficient fit is ours (the paper does not give a procedure we could follow line by line);
the outlier part ``O`` is discarded (not fed back), as in the paper's update rule.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from cotrain.optim.base import StatefulOptimizer, adamw_state, adamw_update

#: Muon's quintic Newton-Schulz coefficients (torch.optim.Muon's defaults)
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
_NS_EPS = 1e-7


# ---- Newton-Schulz -----------------------------------------------------------------------------------------------
def newton_schulz(matrix: torch.Tensor, coefficients=MUON_COEFFICIENTS, steps: int = 5) -> torch.Tensor:
    """Approximate ``U V^T`` of ``matrix`` (2-D, or a batch ``(..., rows, cols)`` done per matrix) by ``steps``
    iterations of ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``, after scaling ``X`` to unit Frobenius norm."""
    a, b, c = coefficients
    x = matrix.float()
    transpose = x.shape[-2] > x.shape[-1]
    if transpose:
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + _NS_EPS)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    if transpose:
        x = x.mT
    return x.to(matrix.dtype)


def _iterate_polynomial(s: torch.Tensor, coefficients, steps: int) -> torch.Tensor:
    a, b, c = coefficients
    for _ in range(steps):
        s2 = s * s
        s = s * (a + s2 * (b + c * s2))
    return s


def _probe_spectra(m: int, n: int) -> list[torch.Tensor]:
    """Unit-norm singular-value vectors of probe matrices of shape (m, n), m <= n."""
    gen = torch.Generator().manual_seed(1_000_003 * m + n)
    rows = min(m, 512)  # a larger shape is probed by a smaller one of the same aspect ratio
    cols = max(rows, round(n * rows / m))
    gaussian = torch.linalg.svdvals(torch.randn(rows, cols, generator=gen, dtype=torch.float64))
    index = torch.arange(1, rows + 1, dtype=torch.float64)
    spectra = [gaussian, index ** -0.5, index ** -1.0]
    return [s / s.norm() for s in spectra]


def _ns_error(spectra, grid, coefficients, steps):
    error = sum(((_iterate_polynomial(s, coefficients, steps) - 1.0) ** 2).mean() for s in spectra) / len(spectra)
    overshoot = torch.relu(_iterate_polynomial(grid, coefficients, steps).abs() - 1.3) ** 2
    return error + 10.0 * overshoot.mean()


@lru_cache(maxsize=None)
def fit_ns_coefficients(rows: int, cols: int, steps: int = 5, evaluations: int = 600) -> tuple[float, float, float]:
    """ROOT's shape-adapted quintic coefficients for a ``rows x cols`` matrix and ``steps`` iterations
    (deterministic; cached per shape). See the module's docstring for the objective; it is minimized by a
    compass search from Muon's triple (the iterated polynomial's error surface is too rough for gradient steps)."""
    m, n = sorted((rows, cols))
    spectra = _probe_spectra(m, n)
    grid = torch.linspace(0.0, 1.0, 257, dtype=torch.float64)
    best = list(MUON_COEFFICIENTS)
    best_error = float(_ns_error(spectra, grid, best, steps))
    step, used = 0.1, 0
    while step >= 1e-4 and used < evaluations:
        improved = False
        for i in range(3):
            for sign in (1.0, -1.0):
                trial = list(best)
                trial[i] = round(trial[i] + sign * step, 4)
                error = float(_ns_error(spectra, grid, trial, steps))
                used += 1
                if math.isfinite(error) and error < best_error:
                    best, best_error, improved = trial, error, True
        if not improved:
            step /= 2
    return tuple(round(v, 4) for v in best)


# ---- ROOT's proximal step ------------------------------------------------------------------------------------------
def soft_threshold(x: torch.Tensor, eps) -> torch.Tensor:
    """``T_eps(x) = sign(x) * max(|x| - eps, 0)``, elementwise: the outlier part of ``x``."""
    return torch.sign(x) * torch.relu(x.abs() - eps)


def remove_outliers(x: torch.Tensor, quantile: float) -> torch.Tensor:
    """ROOT's robust part ``B = x - T_eps(x)`` of each matrix in ``x`` (2-D or ``(blocks, rows, cols)``), with
    ``eps`` the ``quantile`` of its entries' magnitudes; ``quantile >= 1`` leaves ``x`` as it is."""
    if quantile >= 1.0:
        return x
    flat = x.reshape(-1, x.shape[-2] * x.shape[-1]) if x.dim() == 3 else x.reshape(1, -1)
    k = max(1, min(flat.shape[1], math.ceil(quantile * flat.shape[1])))
    eps = flat.abs().float().kthvalue(k, dim=1).values.to(x.dtype)
    eps = eps.view(-1, 1, 1) if x.dim() == 3 else eps.view(1, 1)
    return torch.minimum(torch.maximum(x, -eps), eps)  # = x - soft_threshold(x, eps), without the cancellation


# ---- which params are hidden matrices ------------------------------------------------------------------------------
_GATES = {nn.LSTM: 4, nn.LSTMCell: 4, nn.GRU: 3, nn.GRUCell: 3}


def split_parameters(model: nn.Module, split_gates: bool = True):
    """``(matrices, others)``: ``matrices`` is a list of ``(param, gate_blocks)`` for the hidden weight matrices
    (ndim >= 2, not an embedding, not an output layer), ``others`` the list of the rest, both in
    ``model.parameters()`` order. Output layers: every module whose attribute name ends in ``head`` (the byte LM's
    ``head``, world models' ``*_head``). Gate blocks: ``nn.LSTM``/``LSTMCell`` weights 4, ``nn.GRU``/``GRUCell`` 3,
    and the 4*hidden Linear layers of a module whose class name ends in ``LSTMCell`` (layer-normalized cells); 1 for
    every other matrix or when ``split_gates`` is false."""
    excluded: set[int] = set()
    gates: dict[int, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or (name and name.rsplit(".", 1)[-1].endswith("head")):
            excluded.update(id(p) for p in module.parameters())
        count = next((n for cls, n in _GATES.items() if isinstance(module, cls)), 0)
        if count:
            for pname, p in module.named_parameters(recurse=False):
                if pname.startswith("weight") and p.dim() == 2 and p.shape[0] % count == 0:
                    gates[id(p)] = count
        elif type(module).__name__.endswith("LSTMCell"):
            for child in module.children():
                if isinstance(child, nn.Linear) and child.out_features % 4 == 0:
                    gates[id(child.weight)] = 4
    matrices, others = [], []
    for p in model.parameters():
        if p.dim() >= 2 and id(p) not in excluded:
            matrices.append((p, gates.get(id(p), 1) if split_gates else 1))
        else:
            others.append(p)
    return matrices, others


# ---- the optimizers --------------------------------------------------------------------------------------------
class Muon(StatefulOptimizer):
    """Muon for the groups with ``algorithm="orthogonal"`` (2-D or more, reshaped to ``(rows, -1)``; ``blocks``
    gate blocks stacked along the rows are orthogonalized separately), AdamW for ``algorithm="adamw"`` groups.

    Build it with :meth:`for_model`. State: ``momentum_buffer`` for orthogonal params; AdamW's ``exp_avg``,
    ``exp_avg_sq`` and ``step`` (a tensor) for the others."""

    def __init__(self, params, lr: float = 3e-3, betas=(0.9, 0.99), weight_decay: float = 0.0,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5, eps: float = 1e-8, **extra_defaults):
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_steps=ns_steps, eps=eps, algorithm="adamw", blocks=1, **extra_defaults)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["algorithm"] not in ("orthogonal", "adamw"):
                raise ValueError(f"param group algorithm: expected 'orthogonal' or 'adamw', got {group['algorithm']!r}")
            if group["algorithm"] == "orthogonal":
                for p in group["params"]:
                    if p.dim() < 2 or p.shape[0] % group["blocks"]:
                        raise ValueError(f"an orthogonal param of shape {tuple(p.shape)} cannot be split into "
                                         f"{group['blocks']} blocks")

    @classmethod
    def for_model(cls, model: nn.Module, split_gates: bool = True, **options) -> "Muon":
        """Groups: one orthogonal group per gate-block count (in order of first appearance), then one AdamW group
        for embeddings, output layers, biases and 1-D params."""
        matrices, others = split_parameters(model, split_gates)
        groups: dict[int, list] = {}
        for p, blocks in matrices:
            groups.setdefault(blocks, []).append(p)
        param_groups = [{"params": ps, "algorithm": "orthogonal", "blocks": b} for b, ps in groups.items()]
        if others:
            param_groups.append({"params": others, "algorithm": "adamw"})
        return cls(param_groups, **options)

    def init_param_state(self, p, group):
        if group["algorithm"] == "orthogonal":
            return {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return adamw_state(p)

    @staticmethod
    def block_shape(p: torch.Tensor, blocks: int) -> tuple[int, int]:
        return p.shape[0] // blocks, p[0].numel()

    def direction(self, momentum: torch.Tensor, group: dict) -> torch.Tensor:
        """The orthogonalized step for a ``(blocks, rows, cols)`` momentum."""
        return newton_schulz(momentum, MUON_COEFFICIENTS, group["ns_steps"])

    def update(self, p, grad, state, group) -> None:
        lr, wd = group["lr"], group["weight_decay"]
        if group["algorithm"] == "adamw":
            adamw_update(p, grad, state, lr, group["betas"], wd, group["eps"])
            return
        mu = group["momentum"]
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1.0 - mu)
        update = grad.lerp(buf, mu) if group["nesterov"] else buf
        rows, cols = self.block_shape(p, group["blocks"])
        ortho = self.direction(update.reshape(group["blocks"], rows, cols), group)
        if wd:
            p.mul_(1.0 - lr * wd)
        # torch.optim.Muon's adjust_lr_fn="match_rms_adamw", per block
        p.add_(ortho.reshape(p.shape), alpha=-lr * 0.2 * math.sqrt(max(rows, cols)))


class Root(Muon):
    """ROOT: Muon with shape-fitted Newton-Schulz coefficients and outliers of the momentum soft-thresholded away
    before orthogonalization (``outlier_quantile``: the quantile of ``|M|`` used as the threshold; 1 disables)."""

    def __init__(self, params, outlier_quantile: float = 0.9, **options):
        super().__init__(params, outlier_quantile=outlier_quantile, **options)
        for group in self.param_groups:
            if group["algorithm"] == "orthogonal":
                for p in group["params"]:  # fit now: once per shape, before any step
                    fit_ns_coefficients(*self.block_shape(p, group["blocks"]), group["ns_steps"])

    def direction(self, momentum, group):
        robust = remove_outliers(momentum, group["outlier_quantile"])
        coefficients = fit_ns_coefficients(momentum.shape[-2], momentum.shape[-1], group["ns_steps"])
        return newton_schulz(robust, coefficients, group["ns_steps"])
