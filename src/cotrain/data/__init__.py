"""Corpora, their train/validation split, and the batches nodes train on."""

from cotrain.data.corpus import BUILTIN_BYTES, Corpus, CorpusError, Split, builtin_files
from cotrain.data.streams import StreamBatches

__all__ = ["BUILTIN_BYTES", "Corpus", "CorpusError", "Split", "StreamBatches", "builtin_files"]
