"""Does the swarm learn as well as one machine? Validation BPC of a single node and of a 3-node swarm at equal
total samples, side by side, and a world model trained by a swarm whose dream-trained controller is tried in the
real environment.

    python bench/quality.py [--samples 72000] [--nodes 3] [--json FILE]

Both language-model runs use the same model, data and budget as ../shared/BASELINES.md (a char LSTM 2x256 on
tinyshakespeare, TBPTT 128, 32 streams per node, AdamW 3e-3 cosine to 3e-4, 72,000 sequences in total). They run
as real coordinator and node processes on this machine, one torch thread per node, sharing its cores: the swarm
shows the cost of splitting the work, not a speed-up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import default_text, print_table, run_swarm, write_json  # noqa: E402

from cotrain.config import RunConfig  # noqa: E402


def lm_config(data: str, steps_per_node: int, inner_steps: int, outer_lr: float) -> RunConfig:
    return RunConfig.from_dict(dict(
        run={"name": "quality", "seed": 0},
        model={"kind": "lstm", "embed_dim": 64, "hidden_size": 256, "num_layers": 2, "dropout": 0.1},
        data={"source": data, "seq_len": 128, "batch_size": 32, "val_fraction": 0.1},
        optimizer={"lr": 3e-3, "min_lr": 3e-4, "decay_steps": steps_per_node, "grad_clip": 1.0},
        averaging={"inner_steps": inner_steps, "outer_lr": outer_lr, "matchmaking_time": 2.0, "request_timeout": 1.5,
                   "progress_interval": 0.5},
        # units of about a third of the training text: a swarm node gets one each, a single node takes them in
        # turn, and the recurrent state is carried across long streams as in the plain LSTM of BASELINES.md
        coordinator={"checkpoint_interval_s": 3600.0, "unit_bytes": 320_000},
        device="cpu",
    ))


def run_lm(data: str, nodes: int, total_sequences: int, inner_steps: int, outer_lr: float) -> dict:
    steps_per_node = total_sequences // (32 * nodes)
    rounds = max(1, steps_per_node // inner_steps)
    cfg = lm_config(data, rounds * inner_steps, inner_steps, outer_lr)
    if nodes == 1:
        # the reference is plain local training: outer lr 1 without momentum makes a lone node's round a no-op
        # (DiLoCo's 0.7/0.9 outer step on its own pseudo-gradient cost 0.22 BPC: 2.556 against 2.335)
        cfg = cfg.with_overrides(averaging={"outer_lr": 1.0, "outer_momentum": 0.0})
    # a single node uses every core (torch's default threads), as the plain LSTM did; swarm nodes one thread each
    run = run_swarm(cfg, nodes, ["--max-rounds", str(rounds), *(["--threads", "0"] if nodes == 1 else [])])
    return dict(nodes=nodes, val_bpc=run.metrics["val_bpc"], val_loss=run.metrics["val_loss"], wall_s=run.wall_s,
                samples=run.samples, rounds=rounds,
                inner_steps=inner_steps)


def run_world_model(nodes: int, rounds: int, env_id: str) -> dict:
    from common import evaluate_state

    from cotrain.controller import controller_vs_random
    from cotrain.models import build_model

    cfg = RunConfig.from_dict(dict(
        run={"name": "quality-wm", "seed": 0},
        model={"kind": "mdn_rnn", "hidden_size": 64, "num_layers": 1, "num_mixtures": 5},
        env={"id": env_id, "episodes": 64, "horizon": 50, "eval_episodes": 64},
        data={"batch_size": 16},
        optimizer={"lr": 3e-3, "min_lr": 3e-3},
        averaging={"inner_steps": 50, "matchmaking_time": 2.0, "request_timeout": 1.5, "progress_interval": 0.5},
        coordinator={"checkpoint_interval_s": 3600.0},
        device="cpu",
    ))
    run = run_swarm(cfg, nodes, ["--max-rounds", str(rounds)], evaluate=False)
    state = {k[len("model."):]: v for k, v in run.final["tensors"].items() if k.startswith("model.")}
    metrics = evaluate_state(cfg, state)
    model = build_model(cfg)
    model.load_state_dict(state)
    model.eval()
    returns = controller_vs_random(model, env_id, horizon=cfg.env.horizon)
    controller_return, random_return = returns["controller_return"], returns["random_return"]
    return dict(env=env_id, nodes=nodes, val_nll=metrics["nll"], normalized_mse=metrics["normalized_mse"],
                controller_return=controller_return, random_return=random_return, wall_s=run.wall_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="text file (default ../shared/data/tinyshakespeare.txt)")
    parser.add_argument("--samples", type=int, default=72_000, help="sequences of 128 bytes in total, per side")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--inner-steps", type=int, default=50, help="DiLoCo H")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--wm-rounds", type=int, default=20)
    parser.add_argument("--skip-lm", action="store_true")
    parser.add_argument("--skip-world-model", action="store_true")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    data = args.data or default_text()
    out: dict = {}
    if not args.skip_lm:
        single = run_lm(data, 1, args.samples, args.inner_steps, args.outer_lr)
        swarm = run_lm(data, args.nodes, args.samples, args.inner_steps, args.outer_lr)
        out["single"] = {k: single[k] for k in ("val_bpc", "wall_s", "samples")}
        out["swarm"] = {k: swarm[k] for k in ("nodes", "val_bpc", "wall_s", "samples")}
        print_table("language model (char LSTM 2x256, tinyshakespeare)",
                    ["run", "nodes", "samples", "val BPC", "wall s", "BPC vs single"],
                    [["single node", 1, single["samples"], single["val_bpc"], single["wall_s"], 1.0],
                     ["swarm", swarm["nodes"], swarm["samples"], swarm["val_bpc"], swarm["wall_s"],
                      swarm["val_bpc"] / single["val_bpc"]]])
    if not args.skip_world_model:
        wm = run_world_model(args.nodes, args.wm_rounds, args.env)
        out["world_model"] = {"val_nll": wm["val_nll"], "controller_return": wm["controller_return"],
                              "random_return": wm["random_return"], "env": wm["env"],
                              "normalized_mse": wm["normalized_mse"], "wall_s": wm["wall_s"]}
        print_table(f"world model (MDN-RNN, {wm['env']}, {wm['nodes']}-node swarm)",
                    ["val NLL", "MSE / copy-last", "controller return", "random return", "wall s"],
                    [[wm["val_nll"], wm["normalized_mse"], wm["controller_return"], wm["random_return"],
                      wm["wall_s"]]])
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
