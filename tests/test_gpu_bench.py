"""bench/gpu.py's pure parts: the models it sizes and the swarm figures it reads from two heartbeat snapshots (the
bench itself needs minutes and, for its figures, a GPU; it is not run here)."""

import importlib.util
import signal
from pathlib import Path

import pytest

from cotrain.cli.local_swarm import swarm_config
from cotrain.models import build_model


@pytest.fixture(scope="module")
def gpu():
    # bench/common.py turns SIGTERM and SIGHUP into SystemExit when imported: this test process keeps its own
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        spec = importlib.util.spec_from_file_location("gpu_bench", Path(__file__).parents[1] / "bench" / "gpu.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
    return module


def test_linear_recurrences_take_one_layer_more_with_an_mlp(gpu):
    assert gpu.model_section("lstm", 256, 2) == {"kind": "lstm", "hidden_size": 256, "num_layers": 2}
    assert gpu.model_section("hgrn2", 1024, 3) == {"kind": "hgrn2", "hidden_size": 1024, "num_layers": 4,
                                                   "mlp_ratio": 2}
    assert gpu.model_section("fast_slow", 256, 2) == {"kind": "fast_slow", "fast_size": 256, "slow_size": 256}


@pytest.mark.parametrize("kind", ["lstm", "gru", "fast_slow", "mingru", "lru", "hgrn2"])
def test_every_size_is_a_valid_run_config(gpu, kind):
    for width, layers in gpu.SIZES.values():
        cfg = swarm_config(model=gpu.model_section(kind, width, layers), device="cpu")
        assert cfg.model.kind == kind
    build_model(swarm_config(model=gpu.model_section(kind, 256, 2), device="cpu"))


def test_swarm_rates_are_over_each_nodes_own_window(gpu):
    first = [dict(name="a", samples_local=100, compute_s=5.0, wall_s=10.0),
             dict(name="b", samples_local=50, compute_s=2.0, wall_s=8.0)]
    last = [dict(name="a", samples_local=300, compute_s=13.0, wall_s=20.0),
            dict(name="b", samples_local=250, compute_s=14.0, wall_s=28.0),
            dict(name="c", samples_local=999, compute_s=9.0, wall_s=9.0)]  # not in the first snapshot: left out
    rate, utilization, window = gpu.swarm_rates(first, last)
    assert rate == pytest.approx(200 / 10 + 200 / 20)
    assert utilization == pytest.approx((8.0 + 12.0) / 30.0)
    assert window == pytest.approx(15.0)
    with pytest.raises(ValueError):
        gpu.swarm_rates(first, first)
