"""init(): the process's sumo communicator, from whoever started the process.

Where the communicator comes from:
  - mpirun (Open MPI, MPICH): sumo's MPI transport over MPI_COMM_WORLD, as before;
  - torchrun, or any torch.distributed process group (init_process_group already called, or a
    group passed in): every rank of the group on one host -> sumo's shared-memory transport,
    rendezvousing through the group's store ("shm"); across hosts, when every host holds the
    same number of consecutive ranks -> the two-level communicator (sumo_comm_create_hier:
    shared memory in each host, sumo's TCP connections between the hosts, met through the
    group's store; "hierarchical"), else one flat communicator over TCP ("tcp";
    transport="group": over the group's own point-to-point calls, _pg_transport.py);
  - srun (a Slurm job step): the process group made from the step's variables (rank 0 on
    the step's first host, a port from the job and step ids), then as torchrun's;
  - init(store=..., rank=..., size=...): processes started each on its own (no launcher that
    ends them all when one fails) meet through a store that lives in none of them: those of
    one host over sumo's shared memory, those of several hosts over sumo's TCP connections
    met through the store (transport="tcp"; "group": a gloo group made from the store), one
    communicator per membership: the communicator sumo.torch.elastic shrinks and grows;
  - no launcher: one rank (threads transport).
A launcher sumo cannot join (PBS, LSF, a WORLD_SIZE without a rendezvous, a Slurm step that
lacks a variable) is refused with a message, never turned into a world of one. The launcher
and its variables are libsumo's reading of the environment (sumo_bootstrap_detect, the one
`sumo train` makes): this module keeps no list of variables of its own.

A module because telling the launchers apart, and making the first communicator each one
gives, is one concern: what it makes, the others use and replace.
"""
import atexit
import ctypes
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib
from .._abi import (SUMO_SUCCESS, SUMO_ERR_INVALID_ARGUMENT, SUMO_LAUNCHER_OPEN_MPI,
                    SUMO_LAUNCHER_PMI, SUMO_LAUNCHER_PMIX, SUMO_LAUNCHER_SRUN,
                    SUMO_LAUNCHER_TORCHRUN, SUMO_LAUNCHER_ENV, SUMO_LAUNCHER_UNSUPPORTED)
from .._lib import lib, check
from . import _cuda, _hosts, _stores
from ._calls import broadcast_tensor
from ._membership import _STORE_TRANSPORTS, _ACROSS, _init_join, _init_store
from ._runtime import state, Worker, _adopt, _deadline_s, _local_size, set_timeout
from ._shutdown import shutdown, _teardown, _watch_exceptions


# What init makes of each launcher libsumo finds (include/sumo_bootstrap.h lists the
# variables it reads).
_LAUNCHERS = {SUMO_LAUNCHER_OPEN_MPI: "mpi", SUMO_LAUNCHER_PMI: "mpi", SUMO_LAUNCHER_PMIX: "mpi",
              SUMO_LAUNCHER_TORCHRUN: "torchrun", SUMO_LAUNCHER_ENV: "torchrun",
              SUMO_LAUNCHER_SRUN: "srun"}


def _launcher(launch=None):
    """Who started this process, as libsumo reads the environment (launch: _lib.bootstrap()'s
    answer, asked for when None): "mpi", "torchrun", "srun", None (nobody), or for a launcher
    sumo does not join the sentence that says which."""
    launch = launch or _lib.bootstrap()
    if launch.launcher == SUMO_LAUNCHER_UNSUPPORTED:
        return launch.message
    return _LAUNCHERS.get(launch.launcher)


def _check_environment():
    msg = ctypes.create_string_buffer(256)
    if lib.sumo_env_check(msg, len(msg)) != SUMO_SUCCESS:
        raise ValueError("sumo.torch.init: " + msg.value.decode())


def init(timeout=None, process_group=True, transport=None, group=None, store=None, rank=None,
         size=None, join=False):
    """Creates the process's communicator: over MPI under mpirun, over the torch.distributed
    group under torchrun (or when one exists, or `group` is given: a subgroup's ranks alone),
    else one rank. transport forces "mpi", "shm" (one host), "hierarchical" (shared memory in
    each host and sumo's own TCP connections between the hosts, met through the group's
    store: the default across hosts), "tcp" (one flat communicator over those connections),
    "group" (the group's own calls, a callback per message) or "threads". With
    process_group, torch.distributed's default group is created too when nobody has (gloo),
    for the user's own DDP.

    store, rank, size: processes started each on its own meet through `store` as rank `rank`
    of `size`, with no launcher and no process group: what sumo.torch.elastic needs
    (docs/torch/elastic.md). Those of one host go over sumo's shared memory
    (transport "shm", the default); transport="tcp" puts them on sumo's TCP connections met
    through the store, one communicator per membership, which is what spans hosts ("group":
    a gloo group made from the store instead, every message through the interpreter). The
    store must outlive any one process: a torch.distributed.FileStore, a TCPStore served by a
    process of its own, or (shm only) the path of a directory (sumo's directory store), fresh
    for each job.
    join=True with a torch.distributed.Store instead of rank and size: this process joins the
    job running on that store at its next commit (sumo.torch.elastic), and init returns once
    it is a member (it waits until a commit point takes it in, or the job ends); transport is
    the job's (a joiner given another is refused by name)."""
    if state.comm is not None:
        return
    over = None
    if store is not None or rank is not None or size is not None or join:
        _check_store_args(store, rank, size, transport, group, join)
        over, transport = transport or "shm", "store"
    _check_environment()
    launch = _lib.bootstrap()
    launcher = _launcher(launch)
    if launch.code == SUMO_ERR_INVALID_ARGUMENT and not dist.is_initialized():
        # A launcher's variable missing or malformed (an srun step without
        # SLURM_STEP_NODELIST), named.
        raise RuntimeError("sumo.torch.init: " + launch.message)
    if transport is None:
        if group is not None or (dist.is_initialized() and launcher != "mpi"):
            transport = "pg"
        elif launcher == "mpi":
            transport = "mpi"
        elif launcher in ("torchrun", "srun"):
            transport = "pg"
        elif launcher is not None:
            raise RuntimeError(
                "sumo.torch.init: this process was %s; or call "
                "torch.distributed.init_process_group yourself first (sumo then joins its "
                "group)" % launcher)
        else:
            transport = "threads"
    if transport not in ("mpi", "threads", "shm", "tcp", "group", "hierarchical", "pg", "nccl",
                         "store"):
        raise ValueError("sumo.torch.init: transport must be 'mpi', 'shm', 'tcp', 'group', "
                         "'hierarchical', 'nccl' or 'threads', not %r" % (transport,))
    try:
        if transport == "mpi":
            _init_mpi(process_group)
        elif transport == "threads":
            comm = ctypes.c_void_p()
            check(lib.sumo_comm_create_threads(1, ctypes.byref(comm)), None,
                  "sumo_comm_create_threads")
            _adopt(comm, "threads", 0, 1)
            if process_group and not dist.is_initialized():
                _init_gloo()  # a world of one, for DDP
                state.made_group = True
        elif transport == "nccl":
            _init_nccl(group)
        elif transport == "store":
            if join:
                _init_join(store, over, timeout)
            else:
                _init_store(store, rank, size, over, timeout)
        else:
            _init_group(group, transport)
        if timeout is not None:
            set_timeout(timeout)
    except BaseException:
        # Nothing half made survives a failed init (MPI is finalized again by sumo itself
        # when it started it and failed).
        _teardown()
        raise
    state.worker = Worker()
    atexit.register(shutdown)
    _watch_exceptions()


def _init_mpi(process_group):
    if not _lib.HAVE_MPI:
        raise RuntimeError("sumo.torch.init: launched by mpirun but libsumo was built "
                           "without MPI: no %s (install libopenmpi-dev and rebuild)"
                           % _lib.MPI_LIBRARY)
    mpi = _lib.mpi()
    comm = ctypes.c_void_p()
    initialized = ctypes.c_int(0)
    check(mpi.sumo_mpi_world_create(ctypes.byref(initialized), ctypes.byref(comm)), None,
          "sumo_mpi_world_create (MPI with MPI_THREAD_MULTIPLE on MPI_COMM_WORLD)")
    state.initialized_mpi = initialized.value
    r, s = ctypes.c_int(), ctypes.c_int()
    _adopt(comm, "mpi", 0, 1)
    check(mpi.sumo_mpi_world_local(ctypes.byref(r), ctypes.byref(s)), comm)
    state.local_rank, state.local_size = r.value, s.value
    if process_group and not dist.is_initialized():
        _init_gloo()
        state.made_group = True


def _member_of(group):
    """The group sumo.torch runs on (the default one when None), this rank in it, its size."""
    base = group if group is not None else dist.group.WORLD
    rank, size = dist.get_rank(base), dist.get_world_size(base)
    if rank < 0:
        raise RuntimeError("sumo.torch.init: this process is not a member of the group passed")
    return base, rank, size


def _init_group(group, transport):
    """sumo over a torch.distributed group: the processes of one host through sumo's shared
    memory (rendezvous through the group's store); across hosts the two-level communicator,
    or a flat one over TCP or through the group itself."""
    from . import _pg_transport as pgt
    if not dist.is_initialized():
        launch = _lib.bootstrap()
        if launch.launcher == SUMO_LAUNCHER_SRUN:
            # The step's rank 0 listens on the first host of the step, at a port both the
            # job and the step name.
            if launch.code != SUMO_SUCCESS:
                raise RuntimeError("sumo.torch.init: " + launch.message)
            dist.init_process_group("gloo",
                                    init_method="tcp://%s:%d" % (launch.host, launch.port),
                                    rank=launch.rank, world_size=launch.size,
                                    timeout=timedelta(seconds=_deadline_s()))
        else:
            # torchrun's rendezvous: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
            dist.init_process_group("gloo", timeout=timedelta(seconds=_deadline_s()))
        state.made_group = True
    base, rank, size = _member_of(group)
    # Where each rank runs: hosts by name and boot id, so containers on one host that do not
    # share memory are not taken for one machine. (A digest in a tensor, not
    # all_gather_object, which needs numpy in torch 2.x.)
    import hashlib
    here = hashlib.sha256(("%s\0%s" % (socket.gethostname(), _boot_id())).encode()).digest()
    mine = torch.frombuffer(bytearray(here), dtype=torch.uint8)
    gathered = [torch.empty(len(here), dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(gathered, mine, group=base)
    where = [bytes(t.tolist()) for t in gathered]
    hosts = _hosts.hosts_of(where, _local_size())
    local = [r for r in range(size) if hosts[r] == hosts[rank]]
    one_host = len(local) == size
    state.group = base
    nodes = len(set(hosts))
    per_node = size // nodes if all(hosts.count(h) == size // nodes for h in set(hosts)) else 0
    # By default: shared memory on one host; across hosts the two-level communicator (shared
    # memory in each host, TCP between them). transport="tcp" and "group" keep one flat
    # communicator across hosts, over sumo's TCP connections or the group's own calls.
    if transport == "pg":
        transport = "shm" if one_host and size > 1 else "hierarchical" if size > 1 else "tcp"
    if transport == "shm" and not one_host:
        raise RuntimeError("sumo.torch.init: transport 'shm' needs every rank on one host; "
                           "this group spans %d" % len(set(where)))
    per_host = _hosts.blocks(hosts)
    if transport == "hierarchical" and not per_host:
        # sumo_comm_create_hier composes hosts of L consecutive ranks (rank = host * L + local
        # rank); any other layout takes the flat communicator over TCP, which every
        # collective runs on alike.
        if rank == 0:
            sys.stderr.write("sumo.torch.init: hosts of %s ranks, unequal or not each a "
                             "block of consecutive ranks: one flat communicator over TCP "
                             "across hosts\n" % "+".join(str(hosts.count(h))
                                                          for h in sorted(set(hosts))))
        transport = "tcp"
    if transport in ("shm", "tcp", "hierarchical"):
        store = pgt.StoreAdapter(_stores._store_of(base), _deadline_s())
        state.store = store
        prefix = _stores._key_prefix(base)
        state.key_root = prefix
        if transport == "shm":
            comm = _stores.make_shm(store, rank, size, prefix, "the group's store")
        elif transport == "tcp":
            comm = _stores.make_tcp(store, rank, size, prefix, per_node, "the group's store")
        else:
            comm = _stores.make_hier(store, rank, size, per_host, prefix, "the group's store")
    else:
        state.pg_transport = pgt.GroupTransport(base)
        comm = state.pg_transport.comm(per_node, "sumo_comm_create_transport over the "
                                       "torch.distributed group")
    _adopt(comm, transport, local.index(rank), len(local))


def _check_store_args(store, rank, size, transport, group, join):
    if transport not in (None,) + _STORE_TRANSPORTS or group is not None:
        raise ValueError("sumo.torch.init: store, rank and size make the communicator of "
                         "processes started on their own, over shared memory (transport "
                         "'shm'), sumo's TCP connections met through the store ('tcp') or a "
                         "gloo group made from the store ('group'); transport=%r and group do "
                         "not go with them" % (transport,))
    if transport in _ACROSS and isinstance(store, (str, bytes, os.PathLike)):
        raise ValueError("sumo.torch.init: transport=%r spans hosts, whose processes beat and "
                         "agree in the store: give a torch.distributed.Store (a FileStore or a "
                         "TCPStore), not a directory" % transport)
    if join:
        if store is None or rank is not None or size is not None:
            raise ValueError("sumo.torch.init: join=True takes a store and no rank or size "
                             "(the job hands them out)")
        return
    if store is None or rank is None or size is None:
        raise ValueError("sumo.torch.init: store, rank and size go together (got store=%r, "
                         "rank=%r, size=%r)" % (store, rank, size))
    for name, v in (("rank", rank), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("sumo.torch.init: %s must be an int, not %r" % (name, v))
    if not 0 <= rank < size:
        raise ValueError("sumo.torch.init: rank %d is not a rank of %d" % (rank, size))


def _init_nccl(group):
    """sumo over NCCL, one GPU per rank (the current CUDA device: torch.cuda.set_device first),
    the id shared through the torch.distributed group's store (init_process_group is made, as
    for the other group transports, when nobody has). Every collective takes CUDA tensors of
    that device (and CPU tensors, through NCCL's staging)."""
    try:
        cu = _lib.cuda()
    except RuntimeError as e:
        raise RuntimeError("sumo.torch.init: transport 'nccl' needs libsumo_cuda: %s" % e) \
            from None
    count, why = _lib.cuda_devices()
    if count == 0:
        raise RuntimeError("sumo.torch.init: transport 'nccl' needs a CUDA device: %s" % why)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=_deadline_s()))
        state.made_group = True
    base, rank, size = _member_of(group)
    device = torch.cuda.current_device()
    uid = _cuda.nccl_rendezvous(_stores._store_of(base), _stores._key_prefix(base) + "nccl_id",
                                rank, lambda: _cuda._make_nccl_id(cu), _deadline_s())
    comm = ctypes.c_void_p()
    code = cu.sumo_comm_create_nccl_rank(size, uid, len(uid), rank, device, None,
                                         ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_nccl_rank (rank %d of %d on cuda:%d; "
                         "sumo printed NCCL's reason on stderr)" % (rank, size, device))
    state.group = base
    _adopt(comm, "nccl", 0, 1)
    _cuda._Cuda.device = device
    _cuda._add_kernels(cu, device, "the NCCL communicator's device cuda:%d" % device)


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _init_gloo():
    # Rank 0 chooses the address and a free port and broadcasts them over sumo, so no
    # MASTER_ADDR/MASTER_PORT has to be set; values from the environment win.
    msg = torch.zeros(258, dtype=torch.float64)
    if state.rank == 0:
        addr = os.environ.get("MASTER_ADDR")
        if not addr:
            addr = "127.0.0.1" if state.local_size == state.size else socket.gethostname()
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        raw = addr.encode()[:256]
        msg[0] = int(port)
        msg[1] = len(raw)
        msg[2:2 + len(raw)] = torch.tensor(list(raw), dtype=torch.float64)
    broadcast_tensor(msg, 0, "the gloo rendezvous address")
    port = int(msg[0])
    addr = bytes(int(v) for v in msg[2:2 + int(msg[1])]).decode()
    timeout = ctypes.c_double()
    lib.sumo_comm_get_timeout(state.comm, ctypes.byref(timeout))
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (addr, port), rank=state.rank,
                            world_size=state.size,
                            timeout=timedelta(seconds=timeout.value))
