"""Mixtures of experts whose experts may live on other machines (Learning@home): routing over a grid of experts
(:mod:`cotrain.moe.gating`) and the layer that calls them (:mod:`cotrain.moe.mixture`)."""
