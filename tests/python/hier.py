"""The hierarchical allreduce across hosts (sumo.torch's _hier.py) against the flat
process-group path, on one machine: SUMO_LOCAL_SIZE=2 makes hosts of two consecutive ranks.

    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 3 tests/python/hier.py   # 2 + 1
(any rank count works; tests/python/run.sh runs 3). On 3 ranks the job also builds hosts of
1+1+1 (a chain with a middle host) and {0, 2}+{1} (ranks not consecutive: the gather design
for sums too), and runs the chain in 16 KiB chunks, so one start-up covers every shape.

For Sum, Average and per-tensor Adasum in every dtype, each rank checks that the hierarchical
result is bit for bit the flat path's (sumo's C collectives over the group's own calls, the
same communicator sumo.torch runs the other collectives on), the same bits on every rank, and
within a tolerance of a float64 reference computed here from the gathered inputs (sum in
float64, tests/python/reference.py's Adasum tree). Then the DDP hooks: one step of a small
model through average_hook and adasum_hook, hierarchical and flat, gives the same gradients.
Last, the highest rank leaves before a hierarchical allreduce (deadline 5 s): the others must
end the runtime's hierarchical allreduce (hier_allreduce, hier_run under it as under the DDP
hooks) with PeerLost (SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT) and the job marked broken, not
hang.
Prints one line per check on rank 0; exits non-zero on any failure.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("SUMO_TIMEOUT", "60")

import ctypes  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import sumo.torch as st  # noqa: E402
from sumo._abi import (SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT, SUMO_OP_ADASUM,  # noqa: E402
                       SUMO_OP_AVERAGE, SUMO_OP_SUM)
from sumo._lib import lib, SumoError  # noqa: E402
from sumo.torch import _calls, _hier, _runtime as rt, _stores, _tensors  # noqa: E402
from across_hosts import (EPS, KINDS, LAYOUT, allreduce, bits, failures, inputs,  # noqa: E402
                          reference, report)

def gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def check_collectives(hier, label):
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for name, kind in KINDS.items():
            src = inputs(dtype)
            h = src.clone()
            hier.allreduce(h, _tensors.tensor_args(h, "hier")[2], kind,
                           LAYOUT if kind == SUMO_OP_ADASUM else None, "hier")
            f = src.clone()
            allreduce(rt.state.comm, f, kind, "the flat allreduce")
            same = torch.equal(bits(h), bits(f))
            everyone = all(torch.equal(bits(o), bits(h)) for o in gather(h))
            ref = reference(gather(src), kind)
            err = float((h.to(torch.float64) - ref).norm() / ref.norm())
            # Rounding of the dtype over a few ranks (Adasum: Horovod's 100 epsilons).
            ok_ref = err < 100 * EPS[dtype]
            report(same and everyone and ok_ref,
                   "%s: %-7s %-8s hierarchical == flat bit for bit: %s, same bits on every "
                   "rank: %s, relative error vs float64 %.2g"
                   % (label, str(dtype).split(".")[1], name, same, everyone, err))
    # A 0-dim tensor (a metric averaged, as examples/horovod_style.py's test() does): the
    # chain slices what it sends; exact values, so the closed form holds bit for bit.
    P = dist.get_world_size()
    for name, kind, want in (("sum", SUMO_OP_SUM, P * (P + 1) / 2),
                             ("average", SUMO_OP_AVERAGE, (P + 1) / 2)):
        h = torch.tensor(float(dist.get_rank() + 1), dtype=torch.float64)
        try:
            out = hier.allreduce(h, _tensors.tensor_args(h, "hier")[2], kind, None, "hier 0-dim")
            ok, got = out is h and h.dim() == 0 and h.item() == want, h.item()
        except SumoError as e:
            ok, got = False, e
        report(ok, "%s: a 0-dim tensor's %s: %s (closed form %s)" % (label, name, got, want))


def other_layout(hosts, timeout_s=60):
    """A second hierarchy over the same ranks with hosts of our choosing (collective)."""
    from sumo.torch import _pg_transport as pgt
    base = rt.state.group
    store = pgt.StoreAdapter(_stores._store_of(base))
    h = _hier.Hierarchy(base, hosts, store, _stores._key_prefix(base),
                        lambda r: _stores.pgt_global(base, r), timeout_s)
    h.store = store  # kept alive with the communicator
    return h


def check_layouts():
    """Chunks smaller than the buffer (the chain's pipeline: 4 KiB, ~19 of them per fp32
    vector, the last one short), then on 3 ranks hosts of one rank each (a chain with a middle
    host) and a host of ranks 0 and 2 (not consecutive: the gather design for sums)."""
    saved = _hier._CHUNK_BYTES
    _hier._CHUNK_BYTES = 16 << 10
    try:
        check_collectives(rt.state.hier, "hosts %s, 16 KiB chunks" % hosts_text(rt.state.hier))
    finally:
        _hier._CHUNK_BYTES = saved
    if st.size() != 3:
        return
    for hosts in ([0, 1, 2], [0, 1, 0]):
        h = other_layout(hosts)
        try:
            check_collectives(h, "hosts %s (host of each rank %s)" % (hosts_text(h), hosts))
        finally:
            h.destroy()


def hosts_text(h):
    return "+".join(str(len(m)) for m in h.members)


def check_dead_rank():
    """The last rank leaves (os._exit) before a hierarchical allreduce; the others must fail
    with an error, not hang (run.sh's timeout catches a hang). Ends the process."""
    h = other_layout([0] * (st.size() - 1) + [1], timeout_s=5)
    lib.sumo_comm_set_timeout(h.comm, ctypes.c_double(5.0))
    st.barrier()
    if dist.get_rank() == st.size() - 1:
        os._exit(0)
    # Through hier_allreduce, the runtime's entry (the public allreduce's; the DDP hooks' is
    # hier_run under it): the error must be PeerLost, what elastic.run recovers from, and the
    # job marked broken.
    rt.state.hier = h
    t = inputs(torch.float32)
    t0 = time.monotonic()
    try:
        _calls.hier_allreduce(t, SUMO_OP_SUM, None, "dead")
        report(False, "a hierarchical allreduce with a rank gone returned without an error")
    except Exception as e:  # noqa: BLE001 - which error it is gets printed
        report(isinstance(e, rt.PeerLost) and e.code in (SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT)
               and rt.state.broken,
               "a rank gone during a hierarchical allreduce: %s after %.1f s (deadline 5 s), "
               "job broken %s: %s" % (type(e).__name__, time.monotonic() - t0, rt.state.broken,
                                      str(e)[:120]))
    sys.stdout.flush()
    os._exit(1 if failures else 0)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))


def ddp_grads(hook, hierarchical):
    """One backward pass of DDP with a sumo hook on this rank's batch: the gradients."""
    saved = rt.state.hier
    if not hierarchical:
        rt.state.hier = None  # the hooks read it per call: the flat path
    try:
        ddp = DDP(model())
        hs = st.HookState()
        ddp.register_comm_hook(hs, hook)
        g = torch.Generator().manual_seed(7 + dist.get_rank())
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)
        F.cross_entropy(ddp(x), y).backward()
        rt.sync()
        out = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
        hs.close()
        return out
    finally:
        rt.state.hier = saved


def check_hooks():
    hier = rt.state.hier
    # sumo.torch.init() across hosts routes sum and average here, Adasum only when asked for
    # (transport="hierarchical"): the Adasum hook is compared with every kind routed.
    report(hier.ops == {SUMO_OP_SUM, SUMO_OP_AVERAGE},
           "by default the hierarchical path takes sum and average, not Adasum")
    saved, hier.ops = hier.ops, frozenset(KINDS.values())
    try:
        for name, hook in (("average_hook", st.average_hook), ("adasum_hook", st.adasum_hook)):
            h = ddp_grads(hook, True)
            f = ddp_grads(hook, False)
            report(torch.equal(bits(h), bits(f)), "DDP %s: hierarchical == flat bit for bit"
                   % name)
    finally:
        hier.ops = saved


def main():
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["SUMO_TEST_PORT"],
                                rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    st.init()
    torch.set_num_threads(1)
    hier = rt.state.hier
    if hier is None:
        print("FAIL - no hierarchical path: SUMO_LOCAL_SIZE=%s, %d ranks, transport %s"
              % (os.environ.get("SUMO_LOCAL_SIZE"), st.size(), rt.state.transport))
        sys.exit(1)
    report(True, "%d ranks as hosts of %s: %d host(s), this rank is local %d of %d"
           % (st.size(), [len(m) for m in hier.members], hier.nhosts, st.local_rank(),
              st.local_size()))
    check_collectives(hier, "hosts %s" % hosts_text(hier))
    check_layouts()
    check_hooks()
    st.barrier()
    check_dead_rank()


if __name__ == "__main__":
    main()
