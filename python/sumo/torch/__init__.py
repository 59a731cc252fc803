"""sumo for PyTorch: a Horovod-style surface (import sumo.torch as hvd) plus DDP
communication hooks, SlowMo and DiLoCo.

    import sumo, sumo.torch as st
    st.init()                                   # MPI under mpirun, else one process
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = st.DistributedOptimizer(opt, model.named_parameters(), op=st.Adasum)

    ddp = DistributedDataParallel(model)        # gloo group set up by init()
    ddp.register_comm_hook(st.HookState(), st.adasum_hook)

    @st.elastic.run                             # Horovod's elastic API: training that goes
    def train(state): ...                       # on without a lost process (elastic.py)

sumo keeps its own communicator: its collectives never run on torch.distributed's group.
"""
from .. import Sum, Average, Adasum, SumoError
from . import _runtime as _rt
from ._init import init
from ._runtime import set_timeout, take_timeline, union_seconds
from ._shutdown import shutdown
from .collectives import (allreduce, allreduce_, grouped_allreduce, grouped_allreduce_,
                          allgather, allgather_object, broadcast, broadcast_, broadcast_object,
                          broadcast_parameters, broadcast_optimizer_state, barrier, join,
                          broadcast_async_, reducescatter, reducescatter_async,
                          is_initialized, mpi_built, mpi_enabled, gloo_built, gloo_enabled,
                          nccl_built, cuda_built, rocm_built, ddl_built, ccl_built)
from ._fused import allreduce_async, allreduce_async_, poll, synchronize, fusion_stats
from .compression import Compression
from .hooks import (GossipHookState, HookState, acga_hook, adasum_hook, average_hook,
                    gossip_hook, sum_hook)
from .optimizer import DistributedOptimizer
from .slowmo import (BMUF, LocalSGD, SlowMo, SlowMoBaseAlgorithm,
                     SlowMoDistributedDataParallel)
from .diloco import DiLoCo, StreamingDiLoCo
from . import elastic

__all__ = ["init", "shutdown", "is_initialized", "set_timeout", "rank", "size", "local_rank",
           "local_size", "transport", "allreduce", "allreduce_", "allreduce_async",
           "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "poll",
           "synchronize", "allgather", "allgather_object", "broadcast", "broadcast_",
           "broadcast_object", "broadcast_parameters", "broadcast_optimizer_state", "barrier",
           "broadcast_async_", "reducescatter", "reducescatter_async", "fusion_stats",
           "join", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built",
           "cuda_built", "rocm_built", "ddl_built", "ccl_built", "Compression", "Sum",
           "Average", "Adasum", "SumoError", "HookState", "average_hook", "sum_hook",
           "adasum_hook", "acga_hook", "DistributedOptimizer", "SlowMo", "LocalSGD", "BMUF",
           "SlowMoBaseAlgorithm", "SlowMoDistributedDataParallel", "gossip_hook",
           "GossipHookState",
           "DiLoCo", "StreamingDiLoCo", "elastic",
           "take_timeline", "union_seconds"]


def rank():
    _rt.require_init()
    return _rt.state.rank


def size():
    _rt.require_init()
    return _rt.state.size


def local_rank():
    _rt.require_init()
    return _rt.state.local_rank


def local_size():
    _rt.require_init()
    return _rt.state.local_size


def transport():
    _rt.require_init()
    return _rt.state.transport
