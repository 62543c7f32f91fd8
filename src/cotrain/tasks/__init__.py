"""What a node does with its model: where its batches come from, its loss, and how the shared model is evaluated.

One task per family of models, chosen by the run config's ``model.kind``: byte-level language models train on the
corpus range the coordinator assigns; world models train on rollouts each node collects itself.
"""

from cotrain.config import RunConfig
from cotrain.tasks.language import LanguageTask
from cotrain.tasks.world import WorldModelTask

__all__ = ["LanguageTask", "WorldModelTask", "build_task"]


def build_task(cfg: RunConfig):
    return WorldModelTask(cfg) if cfg.model.is_world_model else LanguageTask(cfg)
