"""How the process lets go of its communicator: at exit (shutdown, without meeting the peers),
after a failed init (_teardown), and after an unhandled exception, which tells the peers at
once (_watch_exceptions). A module because every way init() can go has to be undone here in
one order: the communicator (MPI finalized or aborted), the group sumo made, the store job's
heart and store, the CUDA kernels the communicator borrowed.
"""
import torch.distributed as dist

from .. import _lib
from .._lib import lib
from . import _cuda
from ._membership import close_job
from ._runtime import state


def _watch_exceptions():
    """An unhandled exception ends the process: remember it, so shutdown tells the peers at
    once (sumo_comm_abort) instead of leaving them to their deadline."""
    import sys
    previous = sys.excepthook

    def hook(kind, value, tb):
        state.failed = True
        previous(kind, value, tb)

    if getattr(sys.excepthook, "_sumo", False):
        return
    hook._sumo = True
    sys.excepthook = hook


def _close_store():
    close_job()  # the membership's object beats in the store, and holds the communicator
    store, state.store = state.store, None
    state.key_root = None
    if store is not None:
        store.close()


def _teardown():
    """Releases what a failed init made: the communicator, and the group sumo created."""
    comm, state.comm = state.comm, None
    if comm is not None and state.elastic is None:  # a store job's is the object's
        if state.transport == "mpi":
            _lib.mpi().sumo_mpi_world_finalize(comm, state.initialized_mpi)
        else:
            lib.sumo_comm_destroy(comm)
    _close_store()
    _cuda._release_kernels()
    if state.made_group and dist.is_initialized():
        dist.destroy_process_group()
    state.made_group = False
    state.transport = None


def shutdown():
    """Destroys the communicator without meeting the peers: a rank still busy after training
    (saving a checkpoint) is not taken for a dead one, and exit never waits on a peer. After
    a failure here (an unhandled exception, collectives still in flight) the peers are told
    at once; after a failed peer an MPI job is aborted (MPI_Finalize would wait for the
    missing process)."""
    if state.comm is None:
        return
    comm = state.comm
    pending = state.worker is not None and state.worker.busy()
    if state.failed or pending:
        lib.sumo_comm_abort(comm, b"the process is ending with an error" if state.failed
                            else b"the process is ending with collectives in flight")
    if state.worker is not None and not state.broken:
        state.worker.stop()
    state.worker = None
    state.comm = None
    if state.transport == "mpi":
        if state.broken:
            _lib.mpi().sumo_mpi_world_abort(1)
        # Closing the group's connections first lets a peer blocked in it (DDP's constructor
        # checking shapes) fail at once rather than at its timeout.
        if state.made_group and dist.is_initialized():
            dist.destroy_process_group()
        _lib.mpi().sumo_mpi_world_finalize(comm, state.initialized_mpi)
    else:
        if state.elastic is None:  # a store job's is the object's (_close_store)
            lib.sumo_comm_destroy(comm)
        if state.made_group and dist.is_initialized():
            dist.destroy_process_group()
    _close_store()
    _cuda._release_kernels()  # the communicator borrowed them
    state.made_group = False
