"""The two-level communicator across hosts (sumo_comm_create_hier, what sumo.torch.init() makes
there) against the flat communicator over TCP, on one machine: SUMO_LOCAL_SIZE=2 makes hosts of
two consecutive ranks.

    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 3 tests/python/hier.py   # 2 + 1
    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 4 tests/python/hier.py   # 2 + 2
    SUMO_LOCAL_SIZE=2 SUMO_TEST_PORT=29400 mpirun -np 4 -x SUMO_LOCAL_SIZE -x SUMO_TEST_PORT \
        python3 tests/python/hier.py                                    # torch 1.13 (Debian)
(tests/python/run.sh runs both). On 4 ranks init() makes the two-level communicator of 2 hosts of
2; on 3 the hosts are unequal (2 + 1), so init() makes the flat one over TCP, which is checked.
Either way the job then makes two-level communicators of its own through the same function
init() uses (_stores.make_hier): hosts of one rank each (the chain in 16 KiB chunks), and one
host of every rank, so one start-up covers a chain with a middle host and a single node; and,
through init()'s own path, hosts of the even and the odd ranks (not consecutive): the flat
communicator.

On each two-level communicator, in every dtype: sum and average bit for bit the flat TCP
communicator's (a communicator made here, sumo's ranked algorithm: every element summed left to
right over the ranks); Adasum per tensor (a flat op) bit for bit the flat communicator's; the
hierarchical Adasum op (the tree over the hosts' averages) within a tolerance of a float64
reference computed here from the gathered inputs (tests/python/reference.py's tree over the
hosts' float64 means); every result the same bits on every rank. Then, on the main two-level
communicator (init()'s on 4 ranks, else the hosts of one rank): one step of a small model
through average_hook and adasum_hook gives the flat communicator's gradients bit for bit;
join() works (the last rank joins at once, the others' sum gets its zeros); and the highest
rank leaves before an allreduce (deadline 5 s): the others must end it with PeerLost
(SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT) and the job marked broken, not hang.
Prints one line per check on rank 0; exits non-zero on any failure.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("SUMO_TIMEOUT", "60")

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import sumo.torch as st  # noqa: E402
from sumo._abi import (SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT, SUMO_OP_AVERAGE,  # noqa: E402
                       SUMO_OP_SUM, sumo_adasum_options)
from sumo._lib import lib, SumoError  # noqa: E402
from sumo.torch import _hosts, _init, _runtime as rt, _stores, _tensors  # noqa: E402
from sumo.torch import _pg_transport as pgt  # noqa: E402
from across_hosts import (EPS, KINDS, LAYOUT, allreduce, bits, failures, inputs,  # noqa: E402
                          reference, report)
from reference import adasum_per_tensor  # noqa: E402

_kept = []  # the store adapters of the communicators made here, alive with them


def gather(t):
    """Every rank's t, gathered as its bytes (torch 1.13's gloo has no 16-bit types)."""
    b = t.view(torch.uint8)
    out = [torch.empty_like(b) for _ in range(dist.get_world_size())]
    dist.all_gather(out, b)
    return [o.view(t.dtype) for o in out]


def two_level(per_host):
    """A two-level communicator of this job's ranks in hosts of per_host consecutive ranks,
    made as init() makes its own (collective)."""
    store = pgt.StoreAdapter(_stores._store_of(dist.group.WORLD))
    _kept.append(store)
    return _stores.make_hier(store, dist.get_rank(), dist.get_world_size(), per_host,
                             _stores._key_prefix(dist.group.WORLD), "the test's store")


def flat_tcp():
    """The flat communicator over TCP of this job's ranks (init(transport="tcp")'s)."""
    store = pgt.StoreAdapter(_stores._store_of(dist.group.WORLD))
    _kept.append(store)
    return _stores.make_tcp(store, dist.get_rank(), dist.get_world_size(),
                            _stores._key_prefix(dist.group.WORLD), 0, "the test's store")


def hierarchical_adasum(comm, t, what):
    """Adasum per tensor of LAYOUT with the hierarchical op (group_size 0: the hosts)."""
    ptr, n, dt = _tensors.tensor_args(t, what)
    counts = (ctypes.c_size_t * len(LAYOUT))(*LAYOUT)
    opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), counts, len(LAYOUT), 1, 0)
    op = ctypes.c_uint32()
    rt.raise_for(lib.sumo_op_create_adasum(comm, ctypes.byref(opts), ctypes.byref(op)), what)
    code = lib.sumo_allreduce(ptr, ptr, n, dt, op.value, comm)
    lib.sumo_op_destroy(comm, op.value)
    rt.raise_for(code, what)


def group_reference(all_inputs, per_host):
    """The hierarchical Adasum's float64 result: the tree over the hosts' means."""
    x = [a.to(torch.float64) for a in all_inputs]
    means = [sum(x[h:h + per_host]) / per_host for h in range(0, len(x), per_host)]
    return torch.cat(adasum_per_tensor([list(m.split(LAYOUT)) for m in means]))


def check_collectives(comm, flat, per_host, label):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for name, kind in KINDS.items():
            src = inputs(dtype)
            h, f = src.clone(), src.clone()
            allreduce(comm, h, kind, "two-level")
            allreduce(flat, f, kind, "flat")
            same = torch.equal(bits(h), bits(f))
            everyone = all(torch.equal(bits(o), bits(h)) for o in gather(h))
            ref = reference(gather(src), kind)
            err = float((h.to(torch.float64) - ref).norm() / ref.norm())
            # Rounding of the dtype over a few ranks (Adasum: Horovod's 100 epsilons).
            ok_ref = err < 100 * EPS[dtype]
            report(same and everyone and ok_ref,
                   "%s: %-7s %-8s two-level == flat bit for bit: %s, same bits on every "
                   "rank: %s, relative error vs float64 %.2g"
                   % (label, str(dtype).split(".")[1], name, same, everyone, err))
        src = inputs(dtype)
        h = src.clone()
        hierarchical_adasum(comm, h, "two-level, hierarchical Adasum")
        everyone = all(torch.equal(bits(o), bits(h)) for o in gather(h))
        ref = group_reference(gather(src), per_host)
        err = float((h.to(torch.float64) - ref).norm() / ref.norm())
        report(everyone and err < 100 * EPS[dtype],
               "%s: %-7s adasum, hierarchical op (the hosts' averages): same bits on every "
               "rank: %s, relative error vs float64 %.2g" % (label, str(dtype).split(".")[1],
                                                             everyone, err))
    # A 0-dim tensor (a metric averaged, as examples/horovod_style.py's test() does): exact
    # values, so the closed form holds bit for bit.
    P = dist.get_world_size()
    for name, kind, want in (("sum", SUMO_OP_SUM, P * (P + 1) / 2),
                             ("average", SUMO_OP_AVERAGE, (P + 1) / 2)):
        h = torch.tensor(float(dist.get_rank() + 1), dtype=torch.float64)
        try:
            allreduce(comm, h, kind, "0-dim")
            ok, got = h.dim() == 0 and h.item() == want, h.item()
        except SumoError as e:
            ok, got = False, e
        report(ok, "%s: a 0-dim tensor's %s: %s (closed form %s)" % (label, name, got, want))


@contextlib.contextmanager
def running_on(comm):
    """sumo.torch's collectives (the public surface, the hooks) on comm, a two-level
    communicator, for the duration."""
    saved = rt.state.comm, rt.state.transport
    rt.state.comm, rt.state.transport = comm, "hierarchical"
    try:
        yield
    finally:
        rt.state.comm, rt.state.transport = saved


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))


def ddp_grads(hook, comm):
    """One backward pass of DDP with a sumo hook on comm, on this rank's batch: the
    gradients."""
    ddp = DDP(model())
    hs = st.HookState()
    hs.comm = comm
    ddp.register_comm_hook(hs, hook)
    g = torch.Generator().manual_seed(7 + dist.get_rank())
    x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
    F.cross_entropy(ddp(x), y).backward()
    rt.sync()
    out = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    hs.close()
    return out


def check_hooks(comm, flat, label):
    for name, hook in (("average_hook", st.average_hook), ("adasum_hook", st.adasum_hook)):
        h = ddp_grads(hook, comm)
        f = ddp_grads(hook, flat)
        report(torch.equal(bits(h), bits(f)), "%s: DDP %s: two-level == flat bit for bit"
               % (label, name))


def check_join(comm, label):
    """The last rank joins at once; the others' sum gets its zeros, then they join too (in
    one round: the highest of them is the last to join)."""
    P, last = dist.get_world_size(), dist.get_world_size() - 1
    with running_on(comm):
        try:
            if dist.get_rank() == last:
                got = st.join()
                ok = got == last - 1
                text = "join() returned %d" % got
            else:
                t = st.allreduce(torch.ones(5, dtype=torch.float64), op=st.Sum, name="joined")
                got = st.join()
                ok = torch.equal(t, torch.full((5,), float(P - 1), dtype=torch.float64)) \
                    and got == last - 1
                text = "the sum %s, join() returned %d" % (t[0].item(), got)
        except Exception as e:  # noqa: BLE001 - which error it is gets printed
            ok, text = False, "%s: %s" % (type(e).__name__, str(e)[:160])
    report(ok, "%s: join() across hosts: the last rank joined at once: %s (the sum of the "
           "others %d, the last to join %d)" % (label, text, P - 1, last - 1))


def check_flat_fallback():
    """init()'s own path with hosts of the even and the odd ranks ({0, 2} + {1} on 3 ranks,
    {0, 2} + {1, 3} on 4): not blocks of consecutive ranks, so the flat communicator over
    TCP."""
    P = dist.get_world_size()
    hosts = [r % 2 for r in range(P)]
    report(_hosts.blocks(hosts) == 0 and _hosts.blocks([r // 2 for r in range(4)]) == 2
           and _hosts.blocks([0, 0, 1]) == 0, "hosts %s are not blocks; 2 + 2 are" % hosts)
    saved = (rt.state.comm, rt.state.transport, rt.state.rank, rt.state.size,
             rt.state.local_rank, rt.state.local_size, rt.state.store, rt.state.key_root,
             rt.state.made_group)
    real = _hosts.hosts_of
    _hosts.hosts_of = lambda where, local_size: hosts
    try:
        _init._init_group(None, "pg")
        name = ctypes.c_char_p()
        lib.sumo_comm_transport(rt.state.comm, ctypes.byref(name))
        report(rt.state.transport == "tcp" and name.value == b"tcp",
               "hosts %s: init() made the flat communicator (state %s, communicator %s)"
               % (hosts, rt.state.transport, name.value))
        lib.sumo_comm_destroy(rt.state.comm)
        _kept.append(rt.state.store)
    finally:
        _hosts.hosts_of = real
        (rt.state.comm, rt.state.transport, rt.state.rank, rt.state.size,
         rt.state.local_rank, rt.state.local_size, rt.state.store, rt.state.key_root,
         rt.state.made_group) = saved


def check_dead_rank(comm, label):
    """The last rank leaves (os._exit) before an allreduce on comm; the others must fail with
    PeerLost, not hang (run.sh's timeout catches a hang). Ends the process."""
    rt.raise_for(lib.sumo_comm_set_timeout(comm, ctypes.c_double(5.0)), "set_timeout")
    st.barrier()
    if dist.get_rank() == st.size() - 1:
        os._exit(0)
    t = inputs(torch.float32)
    t0 = time.monotonic()
    with running_on(comm):
        try:
            st.allreduce_(t, op=st.Sum, name="dead")
            report(False, "an allreduce with a rank gone returned without an error")
        except Exception as e:  # noqa: BLE001 - which error it is gets printed
            report(isinstance(e, rt.PeerLost)
                   and e.code in (SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT) and rt.state.broken,
                   "%s: a rank gone during an allreduce: %s after %.1f s (deadline 5 s), job "
                   "broken %s: %s" % (label, type(e).__name__, time.monotonic() - t0,
                                      rt.state.broken, str(e)[:160]))
    sys.stdout.flush()
    os._exit(1 if failures else 0)


def main():
    transport = None
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        # Under mpirun (Debian's torch 1.13, whose torchrun cannot start): the group from MPI's
        # environment, then init()'s default for a group (not sumo's MPI transport).
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s"
                                % os.environ["SUMO_TEST_PORT"],
                                rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
        transport = "pg"
    st.init(transport=transport)
    torch.set_num_threads(1)
    P = st.size()
    L = int(os.environ.get("SUMO_LOCAL_SIZE", "0"))
    name = ctypes.c_char_p()
    lib.sumo_comm_transport(rt.state.comm, ctypes.byref(name))
    equal = L and P % L == 0 and P > L
    report(rt.state.transport == ("hierarchical" if equal else "tcp"),
           "init() on %d ranks in hosts of %d: transport %s (communicator %s), local rank %d "
           "of %d" % (P, L, rt.state.transport, name.value, st.local_rank(), st.local_size()))
    flat = flat_tcp()
    shapes = [(rt.state.comm, L, "init()'s, hosts of %d" % L)] if equal else []
    # Hosts of one rank pass the partial in 16 KiB chunks (the chain's pipeline: about 19 of
    # them per fp32 vector, the last one short); SUMO_HIER_CHUNK_BYTES is read at the making.
    os.environ["SUMO_HIER_CHUNK_BYTES"] = str(16 << 10)
    shapes.append((two_level(1), 1, "hosts of 1, 16 KiB chunks"))
    del os.environ["SUMO_HIER_CHUNK_BYTES"]
    shapes.append((two_level(P), P, "one host of %d" % P))
    for comm, per_host, label in shapes:
        check_collectives(comm, flat, per_host, label)
    comm, per_host, label = shapes[0]
    check_hooks(comm, flat, label)
    check_join(comm, label)
    check_flat_fallback()
    st.barrier()
    check_dead_rank(comm, label)


if __name__ == "__main__":
    main()
