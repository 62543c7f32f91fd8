"""The run config: one TOML file that says what a swarm trains and how.

The coordinator validates it once and hands the validated text to every node in ``JoinResponse.run``, so all nodes
of a run build the same model, data pipeline, optimizer, averaging and compression. Every field has a built-in
default (``cotrain demo`` needs no file); an unknown or out-of-range field is a :class:`ConfigError` that names it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

# ConfigError is re-exported from here; the [moe] and [verification] sections live beside what they configure
from cotrain.config_file import ConfigError, ConfigFile, Section as _Section  # noqa: F401
from cotrain.moe.config import MoEConfig
from cotrain.verification.config import VerificationConfig


#: byzantine behaviours a node can be started with, for benches and tests (cotrain.averaging.attacks)
ATTACKS = ("scale", "sign_flip", "random", "zero", "stale", "alie", "equivocate", "other_data")


class RunSection(_Section):
    name: str = Field("cotrain-run", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = Field(0, ge=0, le=2**32 - 1)


LANGUAGE_MODELS = ("lstm", "gru", "fast_slow", "lru", "hgrn2", "mingru", "moe_lstm")
WORLD_MODELS = ("mdn_rnn", "actions_wm")


class ModelConfig(_Section):
    """What the swarm trains.

    Language models read bytes (vocabulary: the 256 byte values): ``lstm`` and ``gru`` (embedding, stacked recurrent
    layers, linear output) and ``fast_slow`` (Fast-Slow RNN, Mujika et al. 2017: ``fast_cells`` layer-normalised
    LSTM cells of ``fast_size`` around one slow cell of ``slow_size``, with zoneout), and the linear recurrences,
    trained with a parallel scan over the sequence: ``lru`` (Linear Recurrent Unit, Orvieto et al. 2023),
    ``hgrn2`` (gated linear recurrence with outer-product state expansion, Qin et al. 2024) and ``mingru`` (Feng et
    al. 2024), each ``num_layers`` blocks of width ``hidden_size`` with a position-wise MLP; ``moe_lstm``: an LSTM
    followed by mixture-of-experts layers (see ``[moe]``). World models learn an
    environment from the rollouts each node collects (see ``[env]``): ``mdn_rnn`` (Ha and Schmidhuber 2018) and
    ``actions_wm`` (conditions only on the first observation and the actions, Ma et al. 2024).
    """

    kind: Literal["lstm", "gru", "fast_slow", "lru", "hgrn2", "mingru", "moe_lstm", "mdn_rnn", "actions_wm"] = "lstm"
    embed_dim: int = Field(64, ge=1, le=8192)
    hidden_size: int = Field(256, ge=1, le=16384)
    num_layers: int = Field(2, ge=1, le=16)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    fast_cells: int = Field(2, ge=2, le=16)
    fast_size: int = Field(256, ge=1, le=16384)
    slow_size: int = Field(256, ge=1, le=16384)
    zoneout_cell: float = Field(0.0, ge=0.0, le=1.0)
    zoneout_hidden: float = Field(0.0, ge=0.0, le=1.0)
    num_mixtures: int = Field(5, ge=1, le=64)
    #: lru: the complex state of each layer (0: hidden_size)
    state_size: int = Field(0, ge=0, le=16384)
    #: hgrn2: the state expansion, each head's state is expand_ratio x expand_ratio (hidden_size must divide by it)
    expand_ratio: int = Field(8, ge=1, le=1024)
    #: linear recurrences: the position-wise MLP after each recurrent layer is mlp_ratio x hidden_size wide (0: none)
    mlp_ratio: int = Field(2, ge=0, le=16)

    @model_validator(mode="after")
    def _expansion(self) -> "ModelConfig":
        if self.kind == "hgrn2" and self.hidden_size % self.expand_ratio:
            raise ValueError(f"expand_ratio ({self.expand_ratio}) must divide hidden_size ({self.hidden_size}) "
                             "for hgrn2")
        return self

    @property
    def is_world_model(self) -> bool:
        return self.kind in WORLD_MODELS


class EnvConfig(_Section):
    """For world models: the environment every node simulates locally to collect its own rollouts."""

    id: Literal["Pendulum-v1", "CartPole-v1", "Acrobot-v1"] = "Pendulum-v1"
    #: rollouts a node collects at a time (a new set, with a new seed, every ``passes`` passes over the last one)
    episodes: int = Field(64, ge=1, le=100_000)
    passes: int = Field(4, ge=1, le=10_000)
    #: steps per rollout
    horizon: int = Field(50, ge=2, le=10_000)
    #: held-out rollouts the coordinator collects to evaluate the shared world model
    eval_episodes: int = Field(64, ge=1, le=100_000)


class DataConfig(_Section):
    #: "builtin" (text every Python install carries: its standard library's source), or a text file or folder
    source: str = "builtin"
    #: truncated backpropagation through time: characters per step, hidden state carried across steps
    seq_len: int = Field(128, ge=2, le=65536)
    #: parallel streams per node (the local batch); for world models, rollouts per batch
    batch_size: int = Field(16, ge=1, le=65536)
    val_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    #: cap on the corpus size (bytes) taken from the source, 0 = no cap
    max_bytes: int = Field(0, ge=0)


class ScheduleConfig(_Section):
    """The run's learning-rate schedule (:mod:`cotrain.optim.schedule`): a warmup, then a shape, as a function of
    the samples the whole swarm has trained on (the shared state's count), so that every node of a round uses the
    same lr whatever its speed and whenever it joined. The peak is ``optimizer.lr``, the floor ``optimizer.min_lr``.

    A run of known length states its horizon and takes ``cosine`` (or ``wsd``); an open-ended run takes
    ``inverse_sqrt``, the default, which needs no horizon."""

    #: "inverse_sqrt": the peak until timescale_samples, then peak x sqrt(timescale / samples), never below min_lr
    #: (needs no horizon). "cosine": from the peak to min_lr over horizon_samples. "wsd": the peak, then a linear
    #: cooldown to min_lr over the last cooldown_fraction of horizon_samples. "constant":
    #: the peak for ever (a DiLoCo run's model stops improving once the noise of a constant lr dominates)
    kind: Literal["constant", "cosine", "wsd", "inverse_sqrt"] = "inverse_sqrt"
    #: the run's length in samples, all nodes together (0: open-ended)
    horizon_samples: int = Field(0, ge=0)
    #: linear warmup from 1% of the peak over this many samples of the swarm
    warmup_samples: int = Field(2048, ge=0)
    #: wsd with a horizon: the part of it spent cooling down
    cooldown_fraction: float = Field(0.2, gt=0.0, le=1.0)
    #: inverse_sqrt: where the decay starts (0: warmup_samples). In samples, not steps, and not scaled with the batch
    #: or the swarm on purpose: the schedule's clock is the swarm's samples, so 3 nodes of batch 16 and one node of
    #: batch 48 reach it after the same data, and a larger swarm reaches it sooner in wall time, as a larger batch
    #: would. What it should be depends on the model and the data (how many samples until the peak lr's noise
    #: dominates), which no swarm setting tells. Evidence (docs/results/longrun-timescale.md, 3 nodes, the demo's
    #: model and corpus, 150,000 samples): 4,096 decays too soon (1.5x the user's loop's samples to its BPC at
    #: 50,000, against 1.2x) and ends no better; 65,536 ends 1.3% below 16,384 in that run, within the 1-2% that
    #: 16,384 itself ended apart in three runs; 16,384 is kept until a longer run tells them apart
    timescale_samples: int = Field(16384, ge=0)
    #: the outer step's lr (DiLoCo's outer_lr) follows the schedule too
    outer: bool = False


class OptimizerConfig(_Section):
    """The inner optimizer every node runs locally.

    ``adamw``; ``muon`` and ``root`` (orthogonalized momentum for the 2-D weight matrices, AdamW for embeddings,
    the output layer, biases and norms); ``lamb``, ``lars`` and ``tvlars`` (layer-wise adaptive rates, meant for
    ``sync`` rounds whose collaborative batch grows with the swarm, applied to the averaged gradient)."""

    kind: Literal["adamw", "muon", "root", "lamb", "lars", "tvlars"] = "adamw"
    #: peak learning rate; its scale depends on kind. For the 2x256 byte LSTM (300 steps, 16x64 bytes a step):
    #: adamw 3e-3 to 1e-2; muon and root 1e-2 (their matrices' steps have AdamW's RMS at the same lr; 3e-3 is slow,
    #: 2e-2 overshoots); lamb 1e-2 (3e-3 is slow, 3e-2 unstable); lars and tvlars about 5 (with trust_coefficient 1e-3)
    lr: float = Field(3e-3, gt=0.0, le=10.0)
    #: the schedule's floor (see [schedule]); at most lr
    min_lr: float = Field(3e-4, ge=0.0, le=10.0)
    #: decoupled weight decay (AdamW, Muon/ROOT, LAMB's matrices), or L2 added to the gradient (LARS/TVLARS matrices)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    grad_clip: float = Field(1.0, gt=0.0)
    #: Adam's betas, for adamw, lamb and the AdamW part of muon/root (embeddings, output layer, biases); each in [0, 1)
    betas: tuple[float, float] = (0.9, 0.99)

    # ---- muon, root ----
    #: momentum of muon/root (an EMA coefficient, as torch.optim.Muon's): 0.9-0.98 all work, higher smooths more
    momentum: float = Field(0.95, ge=0.0, lt=1.0)
    #: Nesterov momentum for muon/root (recommended)
    nesterov: bool = True
    #: Newton-Schulz iterations per orthogonalization (muon/root); 5 is Muon's; fewer is cheaper and less orthogonal
    ns_steps: int = Field(5, ge=1, le=20)
    #: orthogonalize each gate block of LSTM (4) / GRU (3) weights on its own instead of the stacked matrix: every
    #: gate then gets a full, equal-RMS step (see cotrain.optim.orthogonal); false treats the stack as one matrix
    split_gates: bool = True
    #: root: entries of the momentum above this quantile of its magnitudes are outliers, soft-thresholded away
    #: before orthogonalization (0.9 as in the paper's code: the top 10% are clipped to the 90th percentile);
    #: lower clips more (more robust to spikes, less signal); 1 disables (ROOT = Muon with shape-fitted coefficients)
    outlier_quantile: float = Field(0.9, gt=0.0, le=1.0)

    # ---- lars, tvlars ----
    #: eta of LARS/TVLARS: a matrix's local lr is eta * ||w|| / ||g + wd w||, so each step changes it by about
    #: lr * eta / (1 - momentum) of its norm. With the paper's 0.001 LARS needs lr of order 1 (not AdamW's 3e-3)
    trust_coefficient: float = Field(0.001, gt=0.0, le=1.0)
    #: heavy-ball momentum of lars/tvlars; the step is about lr/(1 - lars_momentum) times the scaled gradient
    lars_momentum: float = Field(0.9, ge=0.0, lt=1.0)
    #: tvlars: phi(t) = 1 / (tvlars_alpha + exp(tvlars_decay * (t - tvlars_delay))) + tvlars_floor multiplies the
    #: trust ratio at step t. It starts near 1/tvlars_alpha + floor (high, for exploration, instead of a warm-up)
    tvlars_alpha: float = Field(1.0, gt=0.0, le=100.0)
    #: tvlars: lambda, how fast phi falls around the delay (it falls over about 4/lambda steps)
    tvlars_decay: float = Field(0.01, gt=0.0, le=10.0)
    #: tvlars: the step around which phi falls (the paper delays by epochs; here local optimizer steps)
    tvlars_delay: int = Field(200, ge=0)
    #: tvlars: gamma_min, phi's floor: after the fall TVLARS runs as LARS at tvlars_floor * lr
    tvlars_floor: float = Field(0.1, ge=0.0, le=10.0)

    @model_validator(mode="after")
    def _ranges(self) -> "OptimizerConfig":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas: each must be in [0, 1), got {list(self.betas)}")
        return self


class AveragingConfig(_Section):
    """How the swarm turns local progress into one shared model.

    ``diloco`` (Douillard et al. 2023): every node takes about ``inner_steps`` local steps, the swarm averages the
    pseudo-gradient (round-start parameters minus local parameters, weighted by samples) and every node applies
    the same outer Nesterov step.
    """

    #: "diloco": H local steps, then average the pseudo-gradient and take an outer Nesterov step. "sync": every
    #: round averages the gradients of ``inner_steps`` local micro-batches and every node takes the same optimizer
    #: step (a collaborative large batch; with inner_steps = 1 this is data-parallel training).
    strategy: Literal["diloco", "sync"] = "diloco"
    #: the most peers in one averaging group (0: no limit). A group forms at once when this many are present.
    target_group_size: int = Field(0, ge=0, le=4096)
    #: how contributions are combined. "centered_clip" (Karimireddy et al. 2021; clip_tau 0 picks the radius per
    #: part) holds off a member sending x10-scaled or sign-flipped updates at the plain mean's clean loss
    #: (bench/byzantine.py, 1 of 5 attacking: 1.00-1.03x the clean loss; the plain mean 148x under a sign flip).
    #: "mean" (weighted by samples): trusted machines only. "clipped_mean": each contribution clipped to
    #: clip_multiple x the median norm (bounds scaled or blown-up updates, only slows a sign flip). "trimmed_mean":
    #: drop the trim_fraction largest and smallest per coordinate (at 0.2, groups under 5 get the plain mean).
    #: Every weighted aggregator but "mean" caps each peer's claimed sample weight at the group's median.
    aggregation: Literal["mean", "clipped_mean", "trimmed_mean", "centered_clip"] = "centered_clip"
    #: the fewest values (of the flat update) one member of a group reduces: a small update is reduced by fewer
    #: members, a tiny one by one (in turn, round to round), a large one by every member others can dial (the
    #: butterfly). Every reducer costs each groupmate two requests; below ~100 KB a part's requests cost more than
    #: its bytes (bench/rounds.py). An update of one reducer rides with the board's meeting, reduced by the group's
    #: host (allreduce.hosted). 0: every dialable member reduces a part, whatever the size. A reducer sees the
    #: contributions to its part and could return anything for it: with fewer reducers, one dishonest member that
    #: reduces spoils more of a round (aggregation guards against dishonest contributions, not reducers)
    min_part_values: int = Field(65536, ge=0)
    trim_fraction: float = Field(0.2, ge=0.0, lt=0.5)
    clip_tau: float = Field(0.0, ge=0.0)
    #: clipped_mean: each contribution clipped to this multiple of the group's median norm; above the spread of
    #: honest norms (bench: typically 1.2x, at most 1.7x) and small enough that an attacker's pull
    #: (clip_multiple x median / group size) stays below a round's progress. 1: tighter, ~1% clean cost
    clip_multiple: float = Field(2.0, ge=1.0, le=10.0)
    #: H, the mean number of local steps per node between two averaging rounds
    inner_steps: int = Field(50, ge=1, le=1_000_000)
    #: the outer Nesterov step. At steady state Nesterov multiplies a pseudo-gradient that keeps its direction by
    #: outer_lr x (1 + mu + mu^2 / (1 - mu)): 2x at 1.0 / 0.5, 7x at the DiLoCo paper's 0.7 / 0.9, which was made for
    #: H = 500 with a decaying inner lr; at H of tens of steps it amplifies each round's noise until the shared model
    #: degrades (docs/operate.md, "Long runs and the schedule"). 1.0 / 0 is plain averaging of the nodes' models
    outer_lr: float = Field(1.0, gt=0.0, le=10.0)
    outer_momentum: float = Field(0.5, ge=0.0, lt=1.0)
    #: DiLoCo's outer step. "nesterov": the averaged pseudo-gradient drives a Nesterov step (outer_lr,
    #: outer_momentum); what a lossy codec did not send stays in the local model. "error_feedback" (SparseLoCo,
    #: Templar 2025): each node keeps what it did not send in a buffer that decays by error_decay every round and
    #: *replaces* the outer momentum: the node sends the compressed buffer, and the outer step is plain SGD at
    #: outer_lr (1.0 in SparseLoCo, 2.0 measured best here, see error_buffer; outer_momentum is not used). Made for
    #: the sparse codec and top-k, whose unsent part is most of the pseudo-gradient.
    outer: Literal["nesterov", "error_feedback"] = "nesterov"
    #: outer = "error_feedback": the buffer is error_decay x buffer + pseudo-gradient before each round's send
    error_decay: float = Field(0.95, ge=0.0, le=1.0)
    #: outer = "error_feedback": where the unsent buffer lives. "model": in the local model, which restarts each
    #: round from the new global parameters minus error_decay x the buffer, so its next H steps build on the
    #: progress it has not sent yet (the next pseudo-gradient then is decayed buffer + new progress, as SparseLoCo
    #: sends). "separate": SparseLoCo's layout, the local model restarts from the global parameters and the buffer
    #: is kept apart, so every round relearns what is still unsent and adds it again (a momentum). Measured
    #: in-process, 3 replicas, 20 rounds of H=30, the sparse codec at 64 of 4096 and 2 bits, the shared model's
    #: loss against dense DiLoCo (Nesterov 1.0 / 0.5): LSTM 1x128, "model" -0.6% at outer_lr 2 (+5.2% at 1),
    #: "separate" +5.6% at 2 (+6.9% at 1); LSTM 2x512, "model" -4.3% at outer_lr 2. SparseLoCo ran "separate"
    #: over thousands of rounds. With outer = "error_feedback" set outer_lr to about 2: 1.0 is Nesterov's.
    error_buffer: Literal["model", "separate"] = "model"
    #: how a round's group forms. "board_only" (the default): every peer computes the same groups from the progress
    #: board (cotrain.averaging.groups), goes to the round's meeting at its group's host when it took its H steps,
    #: and the all-reduce starts a round trip or two after the last groupmate got there (rounds 3x shorter on
    #: loopback, bench/rounds.py); a meeting that does not fill is held again at the next try. A group needs a
    #: member others can dial, its host (members behind NAT meet through it). "board": the same, falling back to
    #: hivemind's matchmaking when a meeting does not fill, which needs hivemind's averager process (one more
    #: process and about 100 MB of PSS a node: bench/scale.py); it was the default until the host's meeting let
    #: peers behind NAT meet on the board.
    #: "matchmaking": hivemind's, which waits up to matchmaking_time every round (and less once target_group_size
    #: peers are there).
    group_formation: Literal["board", "board_only", "matchmaking"] = "board_only"
    #: average each round in the background while the node takes the next round's local steps, and apply the
    #: result when it arrives (one round of delay; DiLoCo with eager updates: see cotrain.averaging.overlap): hides
    #: the meeting and the all-reduce behind compute; a round that fails gives the node back its work, as without
    #: overlap. Worth it when a round takes a fraction of the H local steps: in-process (bench/delay.py: 3
    #: replicas, H=10, outer 0.7 / 0.9) the loss moved +0.2% when the average landed 3 steps into the next round,
    #: +4% when it landed 9 steps late. Sync gets each round's gradients a round late. On 2 cores, 3 nodes of the
    #: BASELINES LSTM 2x256 at H=10 (bench/quality.py, 72,000 sequences): 0.98 of the time computing against 0.85,
    #: 0.89x the single node's time against 1.02x, BPC 2.093 against 2.083 (the single node: 2.090)
    overlap: bool = False
    #: seconds peers wait for each other when forming a group (the board's meeting, or hivemind's matchmaking,
    #: which always waits this long). Longer gathers more stragglers into a round but idles the fast ones; on a LAN
    #: 2-3 s is plenty, across the internet 5-10 s.
    matchmaking_time: float = Field(3.0, gt=0.0, le=600.0)
    #: seconds to wait for a leader's answer while matchmaking; must stay below matchmaking_time
    request_timeout: float = Field(2.0, gt=0.0, le=600.0)
    #: seconds an all-reduce may run once the group has formed; a round never waits longer for a missing peer.
    #: Size it to the model: bytes per peer / upload bandwidth, times 3.
    allreduce_timeout: float = Field(60.0, gt=0.0, le=3600.0)
    #: seconds a node keeps training past H steps waiting for slower peers to reach the round's end
    round_wait: float = Field(30.0, ge=0.0, le=3600.0)
    #: seconds between two publications of a node's progress on the DHT, and two reads of its peers'; peers are
    #: considered gone after 3x. A node whose group is steady (the board showed the same peers three reads in a row,
    #: and all of them averaged with it last round) publishes and reads every 2x
    progress_interval: float = Field(1.0, gt=0.0, le=60.0)
    #: keys the progress board is split into (cotrain.averaging.progress). 1: one key, every node reads every
    #: record every progress_interval (O(N) a read; fine to a dozen nodes). S > 1: a node reads and publishes only
    #: its shard of its round (about N/S records, whatever N), groups form within a shard, and the shards are dealt
    #: afresh every group_rounds rounds. Pick S near N / (2 x target_group_size); every node of a run must use the
    #: same S (and group_rounds).
    board_shards: int = Field(1, ge=1, le=1024)
    #: rounds a group stays together when groups are smaller than the swarm (target_group_size, board_shards):
    #: the peers that averaged at round r meet again at r + 1 (their roster is the plan: no board read, no views to
    #: agree), up to a round that is a multiple of group_rounds, where groups are planned afresh and a sharded
    #: board deals its shards anew (a peer's shard is drawn from (run, round // group_rounds, peer)). A group that
    #: averaged together comes to its next round together, as a swarm of one group does; with groups dealt afresh
    #: every round (1) each round's group gathers peers from different groups of the round before, which reach
    #: their H steps seconds apart. More rounds together mix updates across the swarm more slowly
    group_rounds: int = Field(1, ge=1, le=1000)
    #: with groups smaller than the swarm (target_group_size, board_shards) the groups of a round apply different
    #: averages, and their states meet again only in a later group, where the majority's state hash wins and the
    #: others download it. With state_averaging a group whose members' states differ also averages the states
    #: themselves (the global parameters and the outer optimizer's state, losslessly; Moshpit SGD, Ryabinin et al.
    #: 2021), so that they converge from round to round instead: about twice the model more on the wire, in those
    #: rounds only (a group that holds one state sends nothing more)
    state_averaging: bool = False

    @model_validator(mode="after")
    def _timeouts(self) -> "AveragingConfig":
        if self.request_timeout >= self.matchmaking_time:
            raise ValueError(
                f"request_timeout ({self.request_timeout}) must be below matchmaking_time ({self.matchmaking_time})"
            )
        return self



class CompressionConfig(_Section):
    """What is sent when averaging: ``none`` (fp32), ``fp16``, ``int8`` (blockwise absmax), ``int4`` (the same at 4 bits,
    half the bytes), ``topk`` (the largest
    ``topk_fraction`` of values as indices plus int8 values), ``powersgd`` (rank-``powersgd_rank`` factors). Lossy
    codecs keep what they dropped and add it to the next round (error feedback) unless ``error_feedback`` is off."""

    kind: Literal["none", "fp16", "int8", "int4", "topk", "powersgd", "sparse"] = "none"
    topk_fraction: float = Field(0.01, gt=0.0, le=1.0)
    powersgd_rank: int = Field(4, ge=1, le=1024)
    block: int = Field(256, ge=8, le=1 << 20)
    error_feedback: bool = True
    #: sparse: of every sparse_chunk values of a tensor, the sparse_topk largest are sent, each as a Rice-coded
    #: index and a sparse_bits code into the tensor's table of bin means (cotrain.compression.sparse). 64 of 4096
    #: at 2 bits is SparseLoCo's choice: ~0.15 bits per parameter per round. Peers all-gather these payloads
    #: (each serves its own to every groupmate), so use it with averaging.outer = "error_feedback", and
    #: averaging.aggregation "mean" or "clipped_mean"
    sparse_chunk: int = Field(4096, ge=1, le=1 << 24)
    sparse_topk: int = Field(64, ge=1, le=1 << 24)
    sparse_bits: int = Field(2, ge=1, le=8)

    @model_validator(mode="after")
    def _sparse(self) -> "CompressionConfig":
        if self.sparse_topk > self.sparse_chunk:
            raise ValueError(f"sparse_topk ({self.sparse_topk}) must be at most sparse_chunk ({self.sparse_chunk})")
        return self


class CoordinatorConfig(_Section):
    heartbeat_interval_s: float = Field(2.0, gt=0.0, le=600.0)
    #: a node that misses this many heartbeats in a row is marked lost and its data goes back to the pool
    lost_after_missed: int = Field(5, ge=1, le=1000)
    #: seconds between two attempts to fetch the swarm's state for a checkpoint
    checkpoint_interval_s: float = Field(20.0, gt=0.0)
    #: validation bytes evaluated per checkpoint (0 = the whole validation split)
    eval_bytes: int = Field(131072, ge=0)
    #: evaluate a checkpoint when the swarm is at least this many rounds past the last evaluated one (K). With a
    #: Ray fleet (--ray-address / --managed-nodes) evaluations run as Ray tasks, else on the coordinator.
    eval_every_rounds: int = Field(1, ge=1)
    #: world models: also train a controller in the model's dream and report its real return next to a random
    #: policy's (CMA-ES: tens of seconds of CPU per evaluation)
    eval_controller: bool = False
    keep_checkpoints: int = Field(3, ge=1)
    #: per client address: Join and Heartbeat calls per second, and bursts (0: no limit). One NAT address may
    #: hide many volunteers: size the heartbeat limit for them.
    join_rate_per_s: float = Field(2.0, ge=0.0)
    join_burst: int = Field(20, ge=1)
    heartbeat_rate_per_s: float = Field(200.0, ge=0.0)
    heartbeat_burst: int = Field(2000, ge=1)
    #: work units: about this many bytes of the training split each (language models; a unit is never smaller
    #: than 4 of a node's batches). Smaller units spread the data finer and lose less to a dead node; larger ones
    #: carry the recurrent state further (it is reset between units).
    unit_bytes: int = Field(131072, ge=1)
    #: world models: units per epoch, each a quota of ``env.episodes`` rollouts from a seed of its own
    units_per_epoch: int = Field(64, ge=1, le=1_000_000)
    #: seconds a node may hold a unit before it is reissued; size it to several times a unit's training time on
    #: the slowest node you accept (a node that stops heartbeating loses its units sooner, see lost_after_missed)
    unit_deadline_s: float = Field(900.0, gt=0.0)
    #: seconds a data-plane credential lasts. Nodes renew it on heartbeats once half of it has passed, so the swarm
    #: keeps averaging through a coordinator outage shorter than half of it; a node whose token is revoked is out
    #: within it even if the revocation list never reaches its peers (it reaches them within seconds when the DHT
    #: works). Minutes: long enough for a coordinator restart, short enough to bound a leaked credential.
    credential_ttl_s: float = Field(300.0, ge=10.0, le=86400.0)
    #: seconds after a node left or went silent before the coordinator forgets it: its row in the health view and
    #: /metrics, and what it keeps for the node's session and credential (the store keeps its record). Bounds the
    #: coordinator's memory in long runs with churn. A forgotten node that comes back is told to join again; no
    #: shorter than credential_ttl_s, so a forgotten node's last credential has expired.
    forget_after_s: float = Field(3600.0, ge=60.0)

    @model_validator(mode="after")
    def _forget_after_credentials(self) -> "CoordinatorConfig":
        if self.forget_after_s < self.credential_ttl_s:
            raise ValueError(f"forget_after_s ({self.forget_after_s:g}) must be at least credential_ttl_s "
                             f"({self.credential_ttl_s:g}): a node is forgotten only once its credential has expired")
        return self
    #: check every data-plane interaction (state downloads, all-reduce pieces, groups, progress records) against
    #: the members' credentials. Off only for benches that measure what the checks cost.
    data_plane_auth: bool = True


class WarmStartConfig(_Section):
    """Start a new run from an old run's checkpoint, with shrink and perturb (Ash and Adams 2020): every
    parameter becomes ``shrink * theta + perturb * epsilon``, epsilon from the model's initializer. shrink 1 and
    perturb 0 continue from the exact weights."""

    checkpoint: str = ""
    shrink: float = Field(0.6, ge=0.0, le=1.0)
    perturb: float = Field(0.01, ge=0.0, le=10.0)


class RunConfig(ConfigFile, _Section):
    run: RunSection = RunSection()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    env: EnvConfig = EnvConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    averaging: AveragingConfig = AveragingConfig()
    compression: CompressionConfig = CompressionConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    verification: VerificationConfig = VerificationConfig()
    moe: MoEConfig = MoEConfig()
    #: torch device for training: "cpu", "cuda", "cuda:1", or "auto" (cuda when present)
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")
    #: the training step's arithmetic. "fp32"; "bf16" or "fp16": the forward pass under torch.autocast on CUDA
    #: devices (fp16 with loss scaling); the parameters, the optimizer and everything averaged stay fp32, so nodes of
    #: different precisions average together. "auto": bf16 where it measured clearly faster for the model and width
    #: (on one H200: minGRU and LRU 1024 wide, 1.29x and 1.16x; it made most smaller models slower), else fp32;
    #: fp32 on a CPU. bf16/fp16 on a node without CUDA fall back to fp32 (logged); with device = "cpu", an error.
    #: The table and the reasons: cotrain.precision
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"

    @property
    def hosts_experts(self) -> bool:
        """Whether the run's experts live on expert hosts (``cotrain expert serve``), not in its trainers."""
        return self.model.kind == "moe_lstm" and self.moe.experts == "hosted"

    @model_validator(mode="after")
    def _schedule(self) -> "RunConfig":
        from cotrain.optim.schedule import Schedule

        problems = Schedule.from_config(self).problems()
        if self.schedule.outer and self.averaging.strategy != "diloco":
            problems.append(f"schedule.outer: only DiLoCo takes an outer step, not strategy "
                            f"{self.averaging.strategy!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _precision_on_cpu(self) -> "RunConfig":
        if self.device == "cpu" and self.precision in ("bf16", "fp16"):
            raise ValueError(f"precision: {self.precision!r} is for CUDA devices (16-bit autocast is not used on a "
                             f"CPU), and device is \"cpu\": use \"auto\" or \"fp32\"")
        return self

    @model_validator(mode="after")
    def _sparse_aggregation(self) -> "RunConfig":
        if self.compression.kind == "sparse" and self.averaging.aggregation not in ("mean", "clipped_mean"):
            raise ValueError(f"averaging.aggregation: the sparse codec averages with \"mean\" or \"clipped_mean\" "
                             f"(each position over the peers that sent it), not {self.averaging.aggregation!r}")
        return self
