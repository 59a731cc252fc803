"""One rank of a job across hosts that are network namespaces (scripts/net-hosts.sh: hosts of
their own name, /tmp and /dev/shm, TCP between them over shaped links), started by the launcher
named first, as tests/net/run.sh does:

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank I --rdzv-endpoint host0:PORT \
        tests/net/across.py torchrun
    python -m sumo.launch --store tcp://host0:PORT --rank R --size 4 tests/net/across.py launch
    mpirun (through net-hosts.sh --mpirun) python3 tests/net/across.py mpirun

Checks, one line each on rank 0 (any rank's failure on its own line), exit status 1 on any:
- init() took the path across hosts (torchrun: the two-level communicator, 2 hosts of 2; the
  launcher's store: the flat TCP communicator; mpirun: sumo's MPI transport), and each rank's
  host is the namespace it runs in;
- sum, average and Adasum per tensor of CPU tensors (float32, float64) on that communicator and,
  under torchrun, on the flat TCP communicator too: bit for bit the flat path on one host (the
  same inputs reduced here, in this process, by the threads transport's communicator of as
  many ranks), and within a tolerance of the float64 reference (tests/python/reference.py);
- a few steps of DDP with sumo's average_hook and adasum_hook (where a torch.distributed group
  exists: torchrun, mpirun) and of the Horovod-style DistributedOptimizer (Average, Adasum):
  every replica the same bits; rank 0 prints each model's digest, which run.sh compares
  across the launchers;
- under torchrun, the hosts init() finds (host name and boot id), and SUMO_LOCAL_SIZE=4 (a
  simulated host across the two) refused;
- with --ifname DEV (the host given a second link by net-hosts.sh --second-link): a flat TCP
  communicator made with SUMO_SOCKET_IFNAME=DEV on that host carries its traffic through DEV,
  one made with SUMO_SOCKET_IFNAME=eth0 leaves DEV idle (the interfaces' byte counters).
"""
import ctypes
import hashlib
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
os.environ.setdefault("SUMO_TIMEOUT", "60")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sumo.torch as st  # noqa: E402
from sumo._abi import SUMO_OP_ADASUM  # noqa: E402
from sumo._lib import lib  # noqa: E402
from sumo.torch import _runtime as rt, _stores  # noqa: E402
from sumo.torch import _pg_transport as pgt  # noqa: E402
from across_hosts import EPS, KINDS, LAYOUT, allreduce, bits, reference  # noqa: E402

failures = []
launcher = sys.argv[1]
ifname = sys.argv[sys.argv.index("--ifname") + 1] if "--ifname" in sys.argv else None


def report(ok, text, show=None):
    """One check; printed on rank 0 (or where show says) and wherever it failed."""
    if not ok:
        failures.append(text)
    if not ok or (st.rank() == 0 if show is None else show):
        print("%s - %s, rank %d: %s" % ("ok  " if ok else "FAIL", launcher, st.rank(), text),
              flush=True)


def inputs(rank, dtype):
    """Rank's input (across_hosts.inputs' values, for any rank, so each rank has them all)."""
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(sum(LAYOUT), generator=g, dtype=torch.float64)
    common = torch.randn(sum(LAYOUT), generator=torch.Generator().manual_seed(99),
                         dtype=torch.float64)
    return (x + 2 * common).to(dtype)


def one_host(size, dtype, kind):
    """The flat path on one host: every rank's input reduced by the threads transport's
    communicator of `size` ranks in this process (a thread per rank); rank 0's result."""
    comms = (ctypes.c_void_p * size)()
    rt.raise_for(lib.sumo_comm_create_threads(size, comms), "sumo_comm_create_threads")
    out = [inputs(r, dtype) for r in range(size)]
    errors = []

    def rank(r):
        try:
            allreduce(comms[r], out[r], kind, "threads rank %d" % r)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(size):
        lib.sumo_comm_destroy(comms[r])
    if errors:
        raise errors[0]
    return out[0]


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


def same_everywhere(tensors):
    """Whether every rank holds these bits (rank 0's broadcast over sumo, compared)."""
    flat = torch.cat([bits(t.detach().reshape(-1)).to(torch.int64) for t in tensors])
    theirs = st.broadcast(flat.clone(), root_rank=0, name="replica")
    agree = torch.tensor([int(torch.equal(flat, theirs))], dtype=torch.int64)
    return int(st.allreduce(agree, op=st.Sum, name="replica-agree").item()) == st.size()


def check_collectives(comms):
    P = st.size()
    for dtype in (torch.float32, torch.float64):
        for kname, kind in KINDS.items():
            want = one_host(P, dtype, kind)
            ref = reference([inputs(r, dtype) for r in range(P)], kind)
            for label, comm in comms:
                t = inputs(st.rank(), dtype)
                allreduce(comm, t, kind, label)
                err = float((t.to(torch.float64) - ref).norm() / ref.norm())
                tol = (100 if kind == SUMO_OP_ADASUM else 4) * EPS[dtype]
                same = torch.equal(bits(t), bits(want))
                report(same and err < tol, "%-8s %-7s %-7s bit for bit the flat path on one "
                       "host: %s, relative error vs float64 %.2g (limit %.2g)"
                       % (label, kname, str(dtype).split(".")[1], same, err, tol))


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + st.rank())
    return torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)


def check_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    for name, hook in (("average_hook", st.average_hook), ("adasum_hook", st.adasum_hook)):
        ddp = DDP(model())
        hs = st.HookState()
        ddp.register_comm_hook(hs, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            x, y = batch(step)
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            rt.sync()
            opt.step()
        params = list(ddp.parameters())
        report(same_everywhere(params), "DDP %s, 3 steps: every replica the same bits; "
               "digest %s" % (name, digest(params)))
        hs.close()


def check_optimizer():
    for name, op in (("Average", st.Average), ("Adasum", st.Adasum)):
        t0 = time.monotonic()
        net = model()
        opt = st.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                      named_parameters=net.named_parameters(), op=op)
        for step in range(3):
            x, y = batch(step)
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
        params = list(net.parameters())
        report(same_everywhere(params), "DistributedOptimizer op=%s, 3 steps: every replica "
               "the same bits (%.1f s); digest %s" % (name, time.monotonic() - t0, digest(params)))


def counters(dev):
    stats = "/sys/class/net/%s/statistics/" % dev
    with open(stats + "rx_bytes") as a, open(stats + "tx_bytes") as b:
        return int(a.read()) + int(b.read())


def check_ifname(store):
    """SUMO_SOCKET_IFNAME on the host of two links: the flat TCP communicator's bytes go
    through the interface it names."""
    two = os.path.exists("/sys/class/net/%s" % ifname)
    n = 1 << 20
    for choice, through in ((ifname, True), ("eth0", False)):
        if two:
            os.environ["SUMO_SOCKET_IFNAME"] = choice
        comm = _stores.make_tcp(store, st.rank(), st.size(), _stores._key_prefix(dist.group.WORLD),
                                0, "the test's store")
        before = counters(ifname) if two else 0
        t = torch.ones(n)
        allreduce(comm, t, KINDS["sum"], "ifname")
        moved = (counters(ifname) - before) if two else 0
        lib.sumo_comm_destroy(comm)
        os.environ.pop("SUMO_SOCKET_IFNAME", None)
        # A 4 MiB sum over 4 ranks: each rank sends and receives 1.5 times its vector, most of
        # it between the hosts.
        ok = bool(t[0] == st.size()) and (not two or (moved > 4 * n if through
                                                      else moved < n // 4))
        report(ok, "SUMO_SOCKET_IFNAME=%s on host%s (links eth0 and %s): %d bytes through %s "
               "during a 4 MiB sum (%s)" % (choice, os.environ["NET_HOST"], ifname, moved, ifname,
                                            "most of it expected" if through
                                            else "almost none expected"),
               show=two and st.local_rank() == 0)


def check_local_size():
    """SUMO_LOCAL_SIZE=4 over the 2 hosts: a simulated host across two machines (host names
    that differ on one kernel), which init() refuses, naming the ranks. Where each rank runs
    is gathered as init() gathers it."""
    from sumo.torch import _hosts, _init
    here = hashlib.sha256(("%s\0%s" % (os.uname().nodename, _init._boot_id())).encode()).digest()
    gathered = [torch.empty(len(here), dtype=torch.uint8) for _ in range(st.size())]
    dist.all_gather(gathered, torch.tensor(list(here), dtype=torch.uint8))
    where = [bytes(t.tolist()) for t in gathered]
    try:
        _hosts.hosts_of(where, 4)
        ok, text = False, "accepted"
    except RuntimeError as e:
        ok, text = "different machines" in str(e), str(e)
    report(ok and _hosts.hosts_of(where, 0) == [0, 0, 1, 1],
           "the hosts by name and boot id: %s; SUMO_LOCAL_SIZE=4 across them: %s"
           % (_hosts.hosts_of(where, 0), text))


def main():
    if launcher == "mpirun":
        st.init()  # sumo's MPI transport, and the gloo group DDP uses
        want = "mpi"
    elif launcher == "torchrun":
        st.init()
        want = "hierarchical"
    else:  # python -m sumo.launch made the communicator from the store before running us
        st.init()
        want = "tcp"
    torch.set_num_threads(1)
    host = int(os.environ["NET_HOST"])
    # Processes started each on its own (sumo.launch) form one flat communicator: each is a
    # host of its own to it.
    report(rt.state.transport == want and st.size() == 4 and st.rank() // 2 == host
           and st.local_size() == (1 if launcher == "launch" else 2),
           "init(): transport %s (expected %s), rank %d of %d, local rank %d of %d, on host%d "
           "(%s)" % (rt.state.transport, want, st.rank(), st.size(), st.local_rank(),
                     st.local_size(), host, os.uname().nodename))
    comms = [(launcher, rt.state.comm)]
    if launcher == "torchrun":
        store = pgt.StoreAdapter(_stores._store_of(dist.group.WORLD))
        comms.append(("flat tcp", _stores.make_tcp(store, st.rank(), st.size(),
                                                   _stores._key_prefix(dist.group.WORLD), 2,
                                                   "the test's store")))
    if launcher == "torchrun":
        check_local_size()
    check_collectives(comms)
    if dist.is_initialized():
        check_ddp()
    check_optimizer()
    if ifname and launcher == "torchrun":
        check_ifname(store)
    st.barrier()
    sys.stdout.flush()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
