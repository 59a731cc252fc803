"""Horovod's gradient compression: a compressor turns a tensor into what travels
(compress -> (tensor, ctx)) and back (decompress(tensor, ctx)).

Compression.fp16 and Compression.bf16 send floating tensors as 16-bit values. sumo's 16-bit
reductions accumulate in fp32 and round once (include/sumo.h), so what is lost is the
rounding of each rank's input and of the result, not a 16-bit running sum as in Horovod's
fp16 allreduce over MPI or NCCL.
"""
import torch


class Compressor:
    """The interface: compress(tensor) -> (tensor to send, ctx); decompress(tensor, ctx).
    `dtype` is what a floating tensor travels as (None: its own), which the Adasum delta
    optimizer needs to size its buffers."""
    dtype = None

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    @classmethod
    def compress(cls, tensor):
        # Integer tensors (counts) travel as they are, as in Horovod.
        if tensor.dtype.is_floating_point and tensor.dtype != cls.dtype:
            return tensor.to(cls.dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 keeps fp32's exponent range: no overflow where fp16 would need
    gradient_predivide_factor or loss scaling, at 8 bits of mantissa instead of 11."""
    dtype = torch.bfloat16


class Compression:
    """Compression.none, Compression.fp16 (as Horovod's), Compression.bf16 (sumo's)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, where):
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError("%s: compression must be a compressor such as "
                        "sumo.torch.Compression.none, .fp16 or .bf16, not %r"
                        % (where, compression))
    return compression
