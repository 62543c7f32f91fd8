"""The shared state's hash (cotrain.averaging.state): the bytes of every tensor in order, computed in the background."""

import hashlib
import threading

import torch

from cotrain.averaging.state import StateHash, state_hash


def copied_hash(tensors) -> str:
    digest = hashlib.sha1()
    for t in tensors:
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()[:16]


def test_the_hash_is_of_every_byte_in_order_whatever_the_shapes():
    tensors = [torch.randn(3, 4), torch.tensor(2.5), torch.zeros(0), torch.arange(7, dtype=torch.int64),
               torch.randn(4, 3).t()]  # a non-contiguous one: hashed as its values, row by row
    expected = copied_hash([t.contiguous() for t in tensors])
    assert state_hash(tensors) == expected
    assert state_hash(tensors[::-1]) != expected
    changed = [t.clone() for t in tensors]
    changed[0][2, 3] += 1e-6
    assert state_hash(changed) != expected


def test_a_background_hash_follows_each_update():
    tensors = [torch.randn(256, 256), torch.randn(1000)]
    hashed = StateHash(tensors)
    try:
        assert hashed.value() == state_hash(tensors)
        hashed.settle()
        tensors[1][5] = 7.0
        hashed.update(tensors)
        assert hashed.value() == state_hash(tensors)
        seen = []  # another thread reading the hash gets the same (the averaging thread reads it at a meeting)
        reader = threading.Thread(target=lambda: seen.append(hashed.value()))
        reader.start()
        reader.join(timeout=10)
        assert seen == [state_hash(tensors)]
    finally:
        hashed.shutdown()
