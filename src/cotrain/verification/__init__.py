"""Verifying what members contribute: commitments, loss scores, replay comparisons and reputation, as pure logic.

- :mod:`~cotrain.verification.commitment`: a peer's signed commitment to the exact bytes of its contribution,
  published before the all-reduce reveals them, and the check of a reveal against it;
- :mod:`~cotrain.verification.score`: the loss score of one contribution (its loss decrease on the contributor's own
  work unit against a random unit), with the loss function injected;
- :mod:`~cotrain.verification.replay`: comparing a claimed contribution with a validator's replay of it;
- :mod:`~cotrain.verification.reputation`: per-node and per-token reputation, decayed over time, giving a weight for
  aggregation and a suspension decision;
- :mod:`~cotrain.verification.evidence`: a node's evidence of its last rounds (the round's parameters, its
  contribution, its commitment), kept for a validator and checked by it.

Nothing here talks to the network, reads a clock or imports the node or the coordinator. The node keeps its evidence
(``verification.enabled``) and the coordinator's validator (coordinator/validation.py) checks it;
docs/design/verification.md has the design and what is not checked yet.
"""
