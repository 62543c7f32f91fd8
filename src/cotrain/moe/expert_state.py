"""An expert's checkpoint: its weights and its optimizer's state, as a host sends it to the coordinator and a host
that is given the expert later (the same after a restart, or another) takes it back.

The bytes are a cotrain checkpoint (safetensors, :func:`cotrain.checkpoint.encode_checkpoint`): ``param.<name>``,
``exp_avg.<name>`` and ``exp_avg_sq.<name>`` for each of the expert's parameters (AdamW's moments), and in the
metadata the expert's uid and its optimizer's step count. They come from a peer: :func:`restore_expert` checks them
against the run's own expert (every tensor named, of its shape, finite; the uid the one asked for) and names what does
not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cotrain.checkpoint import CheckpointError, decode_checkpoint, encode_checkpoint

MOMENTS = ("exp_avg", "exp_avg_sq")


class ExpertStateError(ValueError):
    """Bytes that are not a checkpoint of the expert asked for; the message names the field."""


@dataclass
class Restored:
    module: nn.Module
    optimizer_state: dict  # for torch.optim.AdamW.load_state_dict
    updates: int  # the optimizer's steps so far


def encode_expert(uid: str, module: nn.Module, optimizer: torch.optim.Optimizer) -> bytes:
    """``module``'s weights and its AdamW's moments (zeros before its first step) as checkpoint bytes."""
    tensors, steps = {}, 0
    for name, p in module.named_parameters():
        tensors[f"param.{name}"] = p.detach()
        state = optimizer.state.get(p, {})
        for moment in MOMENTS:
            tensors[f"{moment}.{name}"] = state[moment].detach() if moment in state else torch.zeros_like(p)
        if "step" in state:
            steps = int(float(state["step"]))
    return encode_checkpoint(tensors, {"expert": uid, "round": steps})


def max_expert_bytes(template: nn.Module) -> int:
    """The most bytes a checkpoint of an expert like ``template`` takes (its uid and step count at their longest)."""
    optimizer = torch.optim.AdamW(template.parameters())
    return len(encode_expert("x" * 128, template, optimizer)) + 64


def restore_expert(data: bytes, uid: str, template: nn.Module) -> Restored:
    """``template`` (a fresh expert of the run's shape) holding the weights in ``data``, and the optimizer state to
    load into an AdamW over its parameters; ExpertStateError naming the field when ``data`` does not fit."""
    try:
        checkpoint = decode_checkpoint(data, origin="the expert's checkpoint")
    except CheckpointError as e:
        raise ExpertStateError(f"data: {e}") from None
    if checkpoint.metadata.get("expert") != uid:
        raise ExpertStateError(f"expert: the checkpoint is of {str(checkpoint.metadata.get('expert'))[:64]!r}, "
                               f"not {uid!r}")
    updates = checkpoint.metadata.get("round")
    if not isinstance(updates, int) or updates < 0:
        raise ExpertStateError(f"round: {str(updates)[:32]} is not a count of steps")
    names = [name for name, _ in template.named_parameters()]
    expected = {f"{kind}.{name}" for name in names for kind in ("param", *MOMENTS)}
    if set(checkpoint.tensors) != expected:
        extra = sorted(set(checkpoint.tensors) - expected)[:3]
        missing = sorted(expected - set(checkpoint.tensors))[:3]
        raise ExpertStateError(f"tensors: not the run's expert (missing {missing}, unknown {extra})")
    for key, tensor in checkpoint.tensors.items():
        shape = dict(template.named_parameters())[key.split(".", 1)[1]].shape
        if tensor.shape != shape or tensor.dtype != torch.float32:
            raise ExpertStateError(f"tensors.{key}: {tensor.dtype} {list(tensor.shape)}, the run's expert has "
                                   f"float32 {list(shape)}")
        if not bool(torch.isfinite(tensor).all()):
            raise ExpertStateError(f"tensors.{key}: non-finite values")
    with torch.no_grad():
        for name, p in template.named_parameters():
            p.copy_(checkpoint.tensors[f"param.{name}"])
    state = {}
    if updates:
        for i, name in enumerate(names):
            state[i] = {"step": torch.tensor(float(updates)),
                        **{m: checkpoint.tensors[f"{m}.{name}"].clone() for m in MOMENTS}}
    return Restored(template, {"state": state, "param_groups": [{"params": list(range(len(names)))}]}, updates)


def load_optimizer_state(optimizer: torch.optim.Optimizer, restored: Restored) -> None:
    """Load ``restored``'s moments into ``optimizer`` (an AdamW over ``restored.module``), keeping its own settings."""
    groups = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": restored.optimizer_state["state"], "param_groups": groups})
