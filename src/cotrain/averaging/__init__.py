"""The data plane: finding peers over hivemind's DHT and averaging with them."""

from cotrain.averaging.dht import start_dht, visible_maddrs
from cotrain.averaging.diloco import DiLoCo, RoundStats, SwarmAverager, make_averager
from cotrain.averaging.progress import Action, Decision, PeerProgress, ProgressBoard, RoundRules, round_decision

__all__ = [
    "Action", "Decision", "DiLoCo", "PeerProgress", "ProgressBoard", "RoundRules", "RoundStats", "SwarmAverager",
    "make_averager", "round_decision", "start_dht", "visible_maddrs",
]
