"""What travels when peers average: codecs from fp32 down to top-k and PowerSGD, all written here, and SparseLoCo's
chunked top-k with 2-bit values."""

from cotrain.compression.codecs import Codec, Float16, Int4Blockwise, Int8Blockwise, NoCompression, TopK, make_codec
from cotrain.compression.powersgd import PowerSGD
from cotrain.compression.sparse import SparseLowBit, sparse_mean

__all__ = ["Codec", "Float16", "Int4Blockwise", "Int8Blockwise", "NoCompression", "PowerSGD", "SparseLowBit", "TopK", "make_codec",
           "sparse_mean"]
