"""Meeting through a store: the adapter of a store as init() takes it (a
torch.distributed.Store or sumo's directory store), a torch.distributed group's store and the
key prefix of each communicator made in it, and the communicators whose processes meet there
(sumo_comm_create_shm, sumo_comm_create_tcp, and the two-level sumo_comm_create_hier over
both). A module because both the launchers' communicators (_init.py) and a store job's
memberships (_membership.py) are made this way.
"""
import ctypes
import os

import torch.distributed as dist

from .. import _lib
from .._abi import SUMO_SUCCESS, sumo_hier_options, sumo_shm_options, sumo_tcp_options
from .._lib import lib, check


def make_shm(store, rank, size, prefix, where):
    """sumo_comm_create_shm of `size` processes meeting through store (a _pg_transport
    adapter) under prefix; raises the SumoError with the transport's reason."""
    comm = ctypes.c_void_p()
    err = ctypes.create_string_buffer(256)
    opts = sumo_shm_options(ctypes.sizeof(sumo_shm_options), rank, size, store.pointer(),
                            prefix.encode(), 0, ctypes.cast(err, ctypes.c_char_p), len(err))
    code = lib.sumo_comm_create_shm(ctypes.byref(opts), ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_shm (rank %d of %d) over %s: %s"
                         % (rank, size, where, err.value.decode(errors="replace")))
    return comm


def make_tcp(store, rank, size, prefix, node_local_size, where, route=None, alive=None):
    """sumo_comm_create_tcp of `size` processes meeting through store (a _pg_transport
    adapter) under prefix: each listens, while they meet, on the address through which its
    host reaches route (default MASTER_ADDR: the store's host). alive: (prefix, the
    heartbeat's number of each rank, -1 for none) of an elastic job's members, watched while
    they meet. Raises the SumoError with the transport's reason."""
    comm = ctypes.c_void_p()
    err = ctypes.create_string_buffer(256)
    route = route or os.environ.get("MASTER_ADDR") or None
    opts = sumo_tcp_options(ctypes.sizeof(sumo_tcp_options), rank, size, store.pointer(),
                            prefix.encode(), None, route and route.encode(), node_local_size,
                            ctypes.cast(err, ctypes.c_char_p), len(err))
    if alive is not None:
        beats = (ctypes.c_int * size)(*alive[1])
        opts.alive_prefix, opts.alive_ranks = alive[0].encode(), beats
    code = lib.sumo_comm_create_tcp(ctypes.byref(opts), ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_tcp (rank %d of %d) over %s: %s"
                         % (rank, size, where, err.value.decode(errors="replace")))
    return comm


def make_hier(store, rank, size, per_host, prefix, where):
    """The two-level communicator of `size` ranks in hosts of per_host consecutive ranks,
    meeting through store (a _pg_transport adapter) under prefix: shared memory among the
    host's ranks (prefix host<h>/), TCP among local rank l of every host (prefix across<l>/),
    and the flat TCP communicator of every rank, which takes the collectives that have no
    two-level algorithm (the Gram form of ACGA, compressed exchanges). Every rank makes the
    three in the same order. Raises the SumoError of the first that fails; nothing made
    survives it."""
    host, local = divmod(rank, per_host)
    hosts = size // per_host
    made = []
    try:
        made.append(make_shm(store, local, per_host, "%shost%d/" % (prefix, host),
                                     "%s, host %d's ranks" % (where, host)))
        made.append(make_tcp(store, host, hosts, "%sacross%d/" % (prefix, local), 1,
                                     "%s, local rank %d of every host" % (where, local)))
        made.append(make_tcp(store, rank, size, prefix, per_host, where))
        opts = sumo_hier_options()
        check(lib.sumo_hier_options_default(ctypes.byref(opts)), None,
              "sumo_hier_options_default")
        opts.any = made[2]
        comm = ctypes.c_void_p()
        code = lib.sumo_comm_create_hier(made[0], made[1], ctypes.byref(opts),
                                         ctypes.byref(comm))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, made[0], "sumo_comm_create_hier (host %d of %d, local rank "
                             "%d of %d)" % (host, hosts, local, per_host))
    except BaseException:
        for c in reversed(made):  # still the caller's: the two-level one was not made
            lib.sumo_comm_destroy(c)
        raise
    return comm


def store_adapter(store):
    """The _pg_transport adapter of a store as init() takes it: a path names sumo's directory
    store, anything else is a torch.distributed.Store."""
    from . import _pg_transport as pgt
    from ._runtime import _deadline_s
    if isinstance(store, (str, bytes, os.PathLike)):
        return pgt.DirStore(store)
    if not isinstance(store, dist.Store):
        raise TypeError("sumo.torch.init: store must be a torch.distributed.Store (FileStore, "
                        "TCPStore) or a directory's path, not %r" % (store,))
    return pgt.StoreAdapter(store, _deadline_s())


def _store_of(group):
    """The store of a torch.distributed group: the default group's, under a prefix that names a
    subgroup's ranks."""
    store = dist.distributed_c10d._get_default_store()
    if group is not None and group is not dist.group.WORLD:
        ranks = "-".join(str(pgt_global(group, r)) for r in range(dist.get_world_size(group)))
        store = dist.PrefixStore("group%s/" % ranks, store)
    return store


def pgt_global(group, r):
    from ._pg_transport import global_rank
    return global_rank(group, r)


_communicators_made = [0]


def _key_prefix(group):
    """Unique per communicator in the store: the launch's run id (torchrun's run and restart:
    a torchrun restart meets a fresh store key space), and a count of the communicators this
    process made."""
    _communicators_made[0] += 1
    return "sumo/%s/%d/" % (_lib.bootstrap().run_id or "run", _communicators_made[0])
