"""The run config's ``[verification]`` section (:class:`cotrain.config.RunConfig`)."""

from __future__ import annotations

from pydantic import Field

from cotrain.config_file import Section


class VerificationConfig(Section):
    """The coordinator checks sampled contributions (docs/design/verification.md): a node keeps the evidence of its
    last rounds (the round's global parameters, its contribution, its signed commitment) and uploads a round's when
    asked; the coordinator scores it by the loss it lowers on the node's own work units and on a random unit, keeps
    each node's reputation, and revokes a node that keeps failing."""

    #: off by default: a check costs the node an upload of its round's evidence (8 bytes a parameter, about what the
    #: all-reduce sends in a round; at sample_rate 0.5 half a round's worth a round; 20 with the round's trace for a
    #: replay). Turn it on for a swarm of strangers: bench/verify.py (docs/results/verify.md) measures what it catches
    #: and costs
    enabled: bool = False
    #: the chance that a node's latest round is checked when it offers it (about once a round: rounds are longer
    #: than a heartbeat). Each check costs the node an upload of 8 bytes a parameter and the coordinator four forward
    #: passes over ``score_windows`` windows
    sample_rate: float = Field(0.5, gt=0.0, le=1.0)
    #: a node's first checks are made on every round it offers, whatever sample_rate says: a node that attacks from
    #: its first round is caught within a few rounds (at 0.5, a node went unchecked for 4 of its first rounds in 1 of
    #: 16 runs), and an honest one then uploads at sample_rate
    probation_checks: int = Field(3, ge=0, le=1000)
    #: windows of seq_len bytes, spread evenly over the units, each loss is measured on
    score_windows: int = Field(32, ge=1, le=4096)
    #: the outer step along the contribution that is scored: params - score_step x contribution. 1 is the node's
    #: own local model; a shorter step keeps an honest update's gain positive where the full step overshoots
    score_step: float = Field(0.5, gt=0.0, le=10.0)
    #: the least fraction of the own units' loss a contribution must remove. An honest update's gain shrinks with
    #: the lr and as the model learns (bench/verify.py: 7% in a run's first rounds, 0.06% in its last with the lr
    #: decayed), so the bar is "measurably above nothing": zeros, noise, a sign flip or an overshoot remove nothing
    min_gain: float = Field(1e-6, ge=0.0, le=0.5)
    #: replaying rounds (cotrain.verification.replay: the node's local steps run again from its trace must lead to
    #: its contribution) catches shifts too small for the loss to show ("a little is enough"). A node's first check
    #: replays, and so does every check of a node on probation after a failed one; replay_rate is the chance that
    #: any other check that passed the loss score replays too. A replay costs the coordinator one round of a node's
    #: training: at sample_rate s the validator spends about s x replay_rate of the swarm's compute on them, and an
    #: attacker that starts after its first check is replayed s x replay_rate of its rounds. 0: no replays (nodes
    #: record no traces). Runs whose rounds a trace cannot replay (world models, overlap, optimizers other than
    #: AdamW, codecs that leave most of an update unsent) are never replayed (the coordinator logs why once)
    replay_rate: float = Field(0.1, ge=0.0, le=1.0)
