"""The inner optimizers a node trains with (``[optimizer] kind``): AdamW; Muon and ROOT (orthogonalized momentum
for hidden matrices, AdamW for the rest: :mod:`cotrain.optim.orthogonal`); LAMB, LARS and TVLARS (layer-wise trust
ratios: :mod:`cotrain.optim.layerwise`). :func:`build_optimizer` builds one from the run config;
:func:`init_state` and :func:`state_tensors` expose its state to ``sync`` averaging."""

from cotrain.optim.base import StatefulOptimizer
from cotrain.optim.core import build_optimizer, init_state, state_tensors
from cotrain.optim.layerwise import Lamb, Lars, TVLars, tvlars_factor
from cotrain.optim.orthogonal import (MUON_COEFFICIENTS, Muon, Root, fit_ns_coefficients, newton_schulz,
                                      remove_outliers, soft_threshold, split_parameters)

__all__ = ["MUON_COEFFICIENTS", "Lamb", "Lars", "Muon", "Root", "StatefulOptimizer", "TVLars", "build_optimizer",
           "fit_ns_coefficients", "init_state", "newton_schulz", "remove_outliers", "soft_threshold",
           "split_parameters", "state_tensors", "tvlars_factor"]
