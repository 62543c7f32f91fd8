"""Which arithmetic a node's training step uses: the run config's ``precision`` for this node's model and device.

``fp32`` is plain float32. ``bf16`` and ``fp16`` run the forward pass under :func:`torch.autocast` (matmuls and
recurrent kernels in 16 bits, reductions and the loss in float32); ``fp16`` adds loss scaling
(:class:`torch.amp.GradScaler`), whose 5 exponent bits would otherwise flush small gradients to zero. Autocast
never changes a parameter's dtype: the model's parameters, the optimizers' states and everything the averaging
sends and receives stay float32 whatever is chosen here (cotrain.node.precision_step applies the choice).

``auto`` picks what was measured faster for the model and the device: 16 bits is not faster in general. On one
H200, bf16 autocast made most of the small recurrent models slower (:data:`CUDA_MEASURED`), so it is chosen only
where the measurement shows a clear gain, and float32 everywhere else, on a CPU always.
"""

from __future__ import annotations

from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]

#: what the run config's ``precision`` may say
SETTINGS = ("auto", "fp32", "bf16", "fp16")

#: tokens per second of a whole training step (forward, backward, optimizer step), in thousands, float32 against
#: bf16 autocast, by (model.kind, model.hidden_size; fast_slow: its width). Measured on one NVIDIA H200, batch
#: 64 x 512 bytes, the 256-wide models with 2 layers, the 1024-wide with 3 (issue 45, "GPUs"). A later GPU bench
#: updates these figures (and adds cards or widths); auto reads nothing else.
CUDA_MEASURED: dict[tuple[str, int], tuple[int, int]] = {
    ("lstm", 256): (761, 816),
    ("gru", 256): (844, 730),
    ("fast_slow", 256): (25, 21),
    ("mingru", 256): (1577, 1376),
    ("lru", 256): (1413, 1205),
    ("hgrn2", 256): (1048, 653),
    ("lstm", 1024): (579, 513),
    ("gru", 1024): (570, 539),
    ("fast_slow", 1024): (23, 20),
    ("mingru", 1024): (943, 1215),
    ("lru", 1024): (785, 908),
    ("hgrn2", 1024): (209, 132),
}

#: auto takes bf16 only where it measured at least this much faster than fp32. Each figure is one measurement of
#: unknown spread, and bf16's cost in loss was not measured with it: a gain that could be noise (the 2x256 LSTM's
#: 7%) does not pay for the risk; minGRU (29%) and LRU (16%) at 1024 wide clear it.
MIN_SPEEDUP = 1.10


def choose_precision(setting: str, model_kind: str, hidden_size: int, device_type: str) -> tuple[Precision, str]:
    """The precision a node's training step uses, and why, in words (the node logs both once at start).

    ``setting``: the run config's ``precision`` (one of :data:`SETTINGS`); ``device_type``: the training device's
    ``torch.device.type`` ("cpu", "cuda", "mps"). Pure: it reads :data:`CUDA_MEASURED`, not the hardware.

    * ``auto`` on a CUDA device: bf16 where :data:`CUDA_MEASURED` has the model at this width and bf16 measured
      at least :data:`MIN_SPEEDUP` times fp32's tokens per second; fp32 elsewhere, unmeasured models and widths
      included (fp32 never costs loss; set bf16 explicitly to try it). On any other device: fp32.
    * ``fp32``, and ``bf16`` / ``fp16`` on a CUDA device: as set.
    * ``bf16`` / ``fp16`` on a device that is not CUDA: **fp32, a fallback, not a refusal**. The run config is
      the swarm's, written once for every volunteer: a run that asks its GPU nodes for bf16 must still let a
      volunteer with only a CPU join, and there 16 bits was never measured (CPU autocast is often slower than
      float32 without AMX or AVX512-BF16). The parameters and the averaging are fp32 on every node, so nodes of
      different precisions average together. The reason says so, and the node logs it. A config that says both
      ``device = "cpu"`` and bf16/fp16 contradicts itself and is refused when it is read (RunConfig).

    Raises ValueError naming ``precision`` for a setting that is not one of :data:`SETTINGS`.
    """
    if setting not in SETTINGS:
        raise ValueError(f"precision: {setting!r} is not one of {', '.join(SETTINGS)}")
    if setting == "fp32":
        return "fp32", "precision = \"fp32\" in the run config"
    if device_type != "cuda":
        if setting == "auto":
            return "fp32", (f"auto: fp32 on {device_type} (16-bit autocast is used only on CUDA devices, where it "
                            "was measured)")
        return "fp32", (f"precision = {setting!r} asks for 16-bit autocast on CUDA devices; this node trains on "
                        f"{device_type}, where it was never measured: fp32 (parameters and averaging are fp32 on "
                        "every node either way)")
    if setting != "auto":
        scaling = " with loss scaling" if setting == "fp16" else ""
        return setting, f"precision = {setting!r} in the run config{scaling}"  # type: ignore[return-value]
    measured = CUDA_MEASURED.get((model_kind, hidden_size))
    if measured is None:
        return "fp32", (f"auto: {model_kind} at width {hidden_size} was not measured on CUDA (see "
                        "cotrain.precision.CUDA_MEASURED): fp32")
    fp32, bf16 = measured
    speedup = bf16 / fp32
    figures = f"{model_kind} {hidden_size} wide on an H200: {fp32}k tokens/s fp32, {bf16}k bf16"
    if speedup >= MIN_SPEEDUP:
        return "bf16", f"auto: bf16, measured {speedup:.2f}x faster ({figures})"
    return "fp32", f"auto: fp32, bf16 measured {speedup:.2f}x, under the {MIN_SPEEDUP:.2f}x it must gain ({figures})"
