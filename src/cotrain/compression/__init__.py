"""What travels when peers average: codecs from fp32 down to top-k and PowerSGD, all written here."""

from cotrain.compression.codecs import Codec, Float16, Int4Blockwise, Int8Blockwise, NoCompression, TopK, make_codec
from cotrain.compression.powersgd import PowerSGD

__all__ = ["Codec", "Float16", "Int4Blockwise", "Int8Blockwise", "NoCompression", "PowerSGD", "TopK", "make_codec"]
