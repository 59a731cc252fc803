"""What every collective of sumo.torch stands on: Horovod's op arguments, the checks of a
tensor, one collective of a tensor's memory, and the in-place allreduce of any tensor."""
import warnings

import torch

from .. import Sum, Average, Adasum
from . import _calls, _cuda, _runtime as rt, _tensors

_OP_NAMES = {Sum: "Sum", Average: "Average", Adasum: "Adasum"}


def resolve_op(op, average, where):
    """Horovod's op / deprecated average pair -> a sumo op (Average when neither is given)."""
    if op is not None and average is not None:
        raise ValueError("%s: the op parameter supersedes average; give only one of them" % where)
    if average is not None:
        # average=True/False only: sumo's op numbers are not Horovod's, and a positional op
        # in average's place (allreduce(t, hvd.Adasum)) must not pass for True.
        if not isinstance(average, bool):
            raise TypeError("%s: average is True or False (deprecated; pass op=sumo.torch.Sum, "
                            "Average or Adasum), not %r" % (where, average))
        warnings.warn("%s: average is deprecated, as in Horovod; pass op=" % where,
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES or isinstance(op, bool):
        raise ValueError("%s: op must be sumo.torch.Sum, Average or Adasum, not %r" % (where, op))
    return op


def check_tensor(t, name):
    """A tensor, on the CPU or a CUDA device (whether this communicator takes CUDA tensors is
    _tensors.tensor_args's to say)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("sumo: %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError("sumo: tensor %s is on %s; sumo reduces CPU and CUDA tensors"
                         % (name, t.device))


def is_cuda(t):
    return t.device.type == "cuda"


def run(kind, t, send, recv, n, dt, op=0, root=0, request=None, cpu=None):
    """One collective of tensor t's memory: cpu() (the sumo.h call) for a CPU tensor; for a
    CUDA tensor sumo_collective_run (or _start into request) with its kernels on the current
    stream, after the work the transport must see complete (_cuda.inputs_ready)."""
    if not is_cuda(t):
        return cpu()
    stream = _cuda.current_stream(t)
    _cuda.inputs_ready(t)
    return _calls.collective(kind, send, recv, n, dt, stream, op=op, root=root, request=request)


def scale(t, factor):
    if factor != 1.0:
        t.mul_(factor)


def allreduce_inplace(t, op, name, prescale, postscale):
    """t reduced in place on every rank. Floating tensors go to sumo as they are; integer
    ones through float64 (exact below 2^53), summed, and for Average divided with
    truncation, as Horovod scales integer tensors."""
    check_tensor(t, name)
    if t.dtype in _tensors._DTYPES:
        _tensors.checked_tensor(t, name)  # refuses a bad tensor before any collective
        scale(t, prescale)
        _calls.allreduce_tensor(t, op, name)
        scale(t, postscale)
        return t
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError("sumo: allreduce of %s: dtype %s is not reduced (float32, float64, "
                        "float16, bfloat16 and integer tensors are)" % (name, t.dtype))
    if op == Adasum or prescale != 1.0 or postscale != 1.0:
        raise TypeError("sumo: allreduce of %s: an integer tensor takes Sum or Average without "
                        "scale factors" % name)
    if not t.is_contiguous():
        raise ValueError("sumo: tensor %s is not contiguous (strides %s)"
                         % (name, tuple(t.stride())))
    staged = t.to(torch.float64)
    _calls.allreduce_tensor(staged, Sum, name)
    if op == Average:
        staged = torch.div(staged, rt.state.size, rounding_mode="trunc")
    t.copy_(staged)
    return t
