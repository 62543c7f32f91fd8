"""The ``cotrain`` command. Every failure a user can cause ends in one clear line and an exit code from
:mod:`cotrain.exit_codes`, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import cotrain
from cotrain.cli.launch import LaunchError, signals_interrupt
from cotrain.exit_codes import ExitCode


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, for a node or coordinator run as a service (journald, a log shipper)."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        entry = {"time": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(level: str, fmt: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json" or (fmt == "auto" and not sys.stderr.isatty() and os.environ.get("INVOCATION_ID")):
        handler.setFormatter(JsonLogFormatter())  # INVOCATION_ID: started by systemd
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    for noisy in ("hivemind", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def build_parser() -> argparse.ArgumentParser:
    from cotrain.coordinator import cli as coordinator_cli
    from cotrain.cli import simulate
    from cotrain.node import cli as node_cli
    from cotrain.node import expert_serve

    parser = argparse.ArgumentParser(prog="cotrain", description="Train one neural network together over the internet.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {cotrain.__version__}")
    parser.add_argument("--log-level", default=os.environ.get("COTRAIN_LOG_LEVEL", "info"),
                        choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", default=os.environ.get("COTRAIN_LOG_FORMAT", "auto"),
                        choices=("auto", "text", "json"),
                        help="json: one object per line (auto: json when run by systemd, else text)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    node_cli.add_parser(sub)
    expert_serve.add_parser(sub)
    coordinator_cli.add_parser(sub)
    simulate.add_parser(sub)

    swarm = sub.add_parser("swarm", help="watch a swarm").add_subparsers(dest="swarm_command", metavar="COMMAND",
                                                                         required=True)
    status = swarm.add_parser("status", help="a row per node, swarm totals and alerts")
    status.add_argument("coordinator", metavar="COORDINATOR", help="the coordinator's HOST:PORT")
    status.add_argument("--format", choices=("table", "json"), default="table")
    status.add_argument("--watch", action="store_true", help="refresh every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float, default=2.0)
    node_cli.add_tls_flags(status)
    status.set_defaults(handler=cmd_swarm_status)

    sample = sub.add_parser("sample", help="generate text from a checkpoint")
    sample.add_argument("checkpoint", type=Path)
    sample.add_argument("--prompt", default="\n")
    sample.add_argument("--length", type=int, default=300)
    sample.add_argument("--temperature", type=float, default=0.8)
    sample.add_argument("--seed", type=int, default=None)
    sample.set_defaults(handler=cmd_sample)

    demo = sub.add_parser("demo", help="a coordinator and nodes on this machine, training together")
    demo.add_argument("--nodes", type=int, default=None, help="nodes (trainers) to start (default 3; 2 with --moe)")
    demo.add_argument("--duration", type=float, default=180.0, help="seconds of training (default 180)")
    demo.add_argument("--data", default="builtin", help="text file or folder (default: built-in corpus)")
    demo.add_argument("--workdir", type=Path, default=None, help="where state and checkpoints go (default: a new "
                                                                 "folder under ./cotrain-demo)")
    demo.add_argument("--config", type=Path, default=None, help="run config (default: the demo's built-in one)")
    demo.add_argument("--moe", type=int, nargs="?", const=3, default=0, metavar="HOSTS",
                      help="train a mixture of experts (model.kind moe_lstm) whose experts live on HOSTS expert "
                           "hosts (cotrain expert serve; 3 when not given) while --nodes trainers train the rest, "
                           "in rounds of 10 steps (default: the run config's model, no hosts)")
    demo.add_argument("--force", action="store_true",
                      help="start even where the nodes are estimated not to fit this machine's memory")
    demo.set_defaults(handler=cmd_demo, launcher=True)
    return parser


def cmd_swarm_status(args) -> int:
    from rich.console import Console
    from rich.live import Live

    from cotrain.client import CoordinatorClient
    from cotrain.status import health_json, health_table

    client = CoordinatorClient(args.coordinator, args.insecure, args.ca, rpc_timeout=5.0)
    try:
        if args.format == "json" and not args.watch:
            print(health_json(client.health()))
        elif not args.watch:
            Console().print(health_table(client.health()))
        elif args.format == "json":
            while True:
                print(health_json(client.health()), flush=True)
                time.sleep(args.interval)
        else:
            with Live(health_table(client.health()), refresh_per_second=2) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(health_table(client.health()))
    finally:
        client.close()
    return 0


def cmd_sample(args) -> int:
    from cotrain.checkpoint import load_checkpoint
    from cotrain.config import RunConfig
    from cotrain.models import build_model, generate

    if args.length < 0:
        raise SystemExit("--length: must be >= 0")
    if args.temperature < 0:
        raise SystemExit("--temperature: must be >= 0")
    ckpt = load_checkpoint(args.checkpoint)
    cfg = RunConfig.from_toml(ckpt.config_toml, origin=f"{args.checkpoint} (run config)")
    if cfg.model.is_world_model:
        raise SystemExit(f"sample: {args.checkpoint} holds a world model ({cfg.model.kind}); sample needs a language model")
    model = build_model(cfg)
    model.load_state_dict(ckpt.model_state())
    prompt = args.prompt.encode()
    out = generate(model, prompt, args.length, args.temperature, seed=args.seed)
    sys.stdout.write((prompt + out).decode("utf-8", errors="replace") + "\n")
    return 0


def cmd_demo(args) -> int:
    from cotrain.cli.demo import run_demo

    return run_demo(args)


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of a failure a user can cause (a bad config, an unreachable coordinator, ...) and the one line
    to print for it; None for anything else (a bug: its traceback is worth seeing)."""
    import grpc

    from cotrain.checkpoint import CheckpointError
    from cotrain.client import CoordinatorUnavailable, JoinRefused
    from cotrain.config import ConfigError
    from cotrain.coordinator.fleet import FleetError, FleetSizeError
    from cotrain.coordinator.store import StateDirError
    from cotrain.data import CorpusError
    from cotrain.protocol import AddressError
    from cotrain.sizing import FleetTooLarge
    from cotrain.warmstart import WarmStartError

    if isinstance(error, JoinRefused):
        return ExitCode.PROTOCOL if error.code == grpc.StatusCode.FAILED_PRECONDITION else ExitCode.UNAUTHENTICATED
    if isinstance(error, grpc.RpcError):
        return ExitCode.UNAVAILABLE if error.code() == grpc.StatusCode.UNAVAILABLE else ExitCode.ERROR
    table = (((ConfigError, CorpusError, CheckpointError, WarmStartError), ExitCode.CONFIG),
             (AddressError, ExitCode.USAGE), (StateDirError, ExitCode.STATE),
             ((FleetSizeError, FleetTooLarge), ExitCode.CONFIG), (FleetError, ExitCode.FLEET),
             (CoordinatorUnavailable, ExitCode.UNAVAILABLE), (OSError, ExitCode.ERROR))
    return next((code for kinds, code in table if isinstance(error, kinds)), None)


def launch_exit_code(error: LaunchError) -> int:
    """The exit code of the process that failed (a coordinator's refusal of its flags is the user's config error
    here too), or ERROR when it was killed, timed out or ended cleanly too early."""
    code = error.exit_code
    return code if isinstance(code, int) and 0 < code < 128 else ExitCode.ERROR


def _describe(error: BaseException) -> str:
    import grpc

    from cotrain.client import JoinRefused

    if isinstance(error, JoinRefused):
        return f"the coordinator refused to admit this node: {error.details}"
    if isinstance(error, grpc.RpcError):
        return f"the coordinator answered {error.code().name}: {error.details()}"
    return str(error)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level, args.log_format)
    try:
        # a launcher (demo, simulate) ended by SIGTERM or SIGHUP unwinds as on Ctrl-C: it stops what it started
        with signals_interrupt() if getattr(args, "launcher", False) else contextlib.nullcontext():
            return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"cotrain: {e.code}", file=sys.stderr)
            return ExitCode.USAGE
        raise
    except LaunchError as e:  # a process that simulate or demo started failed: what, in one line, and its logs
        print(f"cotrain: {e.one_line()}", file=sys.stderr)
        return launch_exit_code(e)
    except Exception as e:
        code = exit_code_for(e)
        if code is None:
            raise  # a bug: its traceback says where
        print(f"cotrain: {_describe(e)}", file=sys.stderr)
        return code
