"""Text generation from a byte-level language model."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(model, prompt: bytes, length: int, temperature: float = 0.8, seed: int | None = None) -> bytes:
    """Continue ``prompt`` by ``length`` bytes. temperature 0 means greedy decoding."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    context = list(prompt) or [ord("\n")]
    logits, state = model(torch.tensor([context], dtype=torch.long, device=device))
    out = bytearray()
    for _ in range(length):
        last = logits[0, -1].float()
        if temperature == 0:
            token = int(last.argmax())
        else:
            probs = torch.softmax(last / temperature, dim=-1).cpu()
            token = int(torch.multinomial(probs, 1, generator=generator))
        out.append(token)
        logits, state = model(torch.tensor([[token]], dtype=torch.long, device=device), state)
    model.train(was_training)
    return bytes(out)
