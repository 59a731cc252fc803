#!/usr/bin/env python3
"""DDP step time with gloo's allreduce against sumo's hooks and optimizers, in one run.

    mpirun -np 2 --oversubscribe /usr/bin/python3 bench/torch_ddp.py [--steps 30] [--warmup 5]

For each model (the MLP of `sumo train`, 784-128-10, a small conv net of about 3.3 M
parameters, and with --models many 200 layers of 64 x 64) and each method, every rank trains on random MNIST-shaped batches; rank 0 prints
per method the median step time, samples/s and the median time inside communication per
step (the union of the buckets' intervals from the hook's call to its Future's completion,
or the optimizer's collectives; overlapping buckets count once). Methods:
  none           (--interleaved only) DDP with a hook that reduces nothing: the step without
                 communication, which the other rows' "added ms" are measured against
  gloo           DDP's built-in reducer (gloo allreduce), step time only (no hook to time)
  gloo hook      DDP with torch's own allreduce_hook on gloo, timed like sumo's hooks
  sumo avg       sumo.torch.average_hook
  sumo adasum    sumo.torch.adasum_hook (per parameter)
  sumo acga      sumo.torch.acga_hook
  sumo delta     sumo.torch.DistributedOptimizer(op=Adasum): local step, Adasum of deltas,
                 each parameter's local step and its bucket's Adasum started in the backward
                 pass (the default: overlap=True, bucket_cap_mb=1)
  opt avg/s      (--methods) sumo.torch.DistributedOptimizer(op=Average), overlap=False: the
                 gradients combined at step() in one buffer per dtype, after backward
  opt avg/p      (--methods) the same overlapped with backward, one tensor per collective
                 (bucket_cap_mb=0: no fusion)
  opt avg/o      (--methods) overlapped in fused buckets of 1 MB (the default)
  sumo delta/p   (--delta-variants) the same with one parameter per bucket (bucket_cap_mb=0)
  sumo delta/s   (--delta-variants) overlap=False: local step and Adasum at step(), after
                 the backward pass
  hvd adasum / hvd avg   horovod.torch.DistributedOptimizer, when horovod imports (it is not
                 a Debian package: bench/torch_ddp_setup.sh builds it in a venv; run this
                 script with that venv's python)
  sumo delta+h   sumo delta again, right after the hvd rows (and delta/p+h, delta/s+h)
Horovod is initialised only after every sumo row and the communication-only table: from
hvd.init() on, its background thread cycles (MPI negotiation every HOROVOD_CYCLE_TIME) on the
same cores, which would slow the rows measured beside it. The hvd rows pay for it, as they
would in training; "sumo delta+h" is sumo's delta optimizer under the same conditions.
With horovod present, sumo's delta optimizer and Horovod's Adasum are also checked to give
the same parameters after a few steps.

A second table, measured in the same run, is communication only: per model, the gradient
buckets DDP hands to a hook (their count, sizes and per-tensor layout recorded from a real
hooked DDP step, after DDP has rebuilt its buckets) are reduced with nothing else running,
steps interleaved across methods (each step runs every method once, in an order rotated
from step to step, so slow phases of a noisy machine hit them alike):
  gloo           torch.distributed.all_reduce on the default gloo group from the main
                 thread, issued as torch's allreduce_hook does (div_ by the rank count, then
                 one asynchronous allreduce per bucket in bucket order, all waited on)
  sumo avg / sumo adasum / sumo acga   the hooks themselves called on stand-in buckets
                 over the same buffers (sumo's asynchronous allreduce through the binding,
                 or ACGA's apply, on sumo's worker thread), every Future waited on
  sumo avg/m, sumo adasum/p, sumo acga/p   (processes of one node only) the same hooks
                 where the default HookState does not reduce: the average into mapped
                 bucket buffers (mapped_buffers=True), Adasum and ACGA in place, staged by
                 sumo (mapped_buffers=False)
Per step: refill the buffers with the rank's gradients, barrier, time until every bucket is
reduced. Median over steps; "vs gloo" divides a method's median by gloo's, from the same run.

Across hosts (ranks on several hosts, or SUMO_LOCAL_SIZE=2 under torchrun: 2 hosts of 2 on one
machine) the hooks run on sumo.torch's two-level communicator (init()'s default there); a hook
method with "/g" ("sumo avg/g") runs on a flat communicator over the group's own calls (a
callback into Python per message) and "/t" ("sumo avg/t") on a flat one over sumo's TCP
transport (init(transport="tcp")'s), made for the run, e.g.
    SUMO_LOCAL_SIZE=2 torchrun --standalone --nproc_per_node 4 bench/torch_ddp.py --interleaved \
        --models mlp,conv --methods 'none,gloo,sumo avg,sumo avg/t,sumo avg/g,sumo adasum,sumo adasum/t,sumo adasum/g'

--interleaved (or --delta-interleaved) [--methods ...] measures only the training steps of the
methods listed, with the time inside communication per step beside them
(the Adasum delta optimizers sumo delta, delta/p, delta/s and hvd adasum by default; gloo and
the hooks too, with /m or /p for mapped_buffers=True or False), each on its own copy of a
model, every step running each method once (order rotated, a barrier before each), so a noisy
machine's phases hit them alike; "vs hvd adasum" divides by Horovod's median from the same run
(by the first method's when Horovod's is not measured). Horovod is initialised only when an
hvd method is listed: run "--methods 'sumo delta,sumo delta/s'" and "--methods 'hvd adasum'"
as separate jobs for each as its users run it (no other library's thread beside it), the
default list for both under the same conditions.
"""
import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import sumo  # noqa: E402
import sumo.torch as st  # noqa: E402
from sumo.torch import _runtime as rt  # noqa: E402

try:
    import horovod.torch as hvd
except Exception as e:  # ImportError, or a horovod built against another torch
    hvd = None
    HVD_WHY = "%s: %s" % (type(e).__name__, e)


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def convnet():
    # 1x28x28 -> 32x28x28 -> 64x14x14 -> 256 -> 10: about 3.3 M parameters, 96% in fc1.
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 14 * 14, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


def many():
    # Many small tensors (issue 33's tensor fusion): 200 layers of 64 x 64 between an input
    # and an output layer, 402 gradient tensors of 256 B to 16 KB, 3.4 MB in all.
    layers = [torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU()]
    for _ in range(200):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))


MODELS = {"mlp": mlp, "conv": convnet, "many": many}

# The gloo hook's intervals (sumo records its own in sumo.torch's timeline).
_gloo_timeline = []
_gloo_lock = threading.Lock()


def gloo_timed_hook(pg, bucket):
    t0 = time.perf_counter()
    fut = default_hooks.allreduce_hook(pg, bucket)

    def done(f):
        with _gloo_lock:
            _gloo_timeline.append((t0, time.perf_counter()))
        return f.value()[0]
    return fut.then(done)


def no_comm_hook(_, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


HOOKS = {"sumo avg": st.average_hook, "sumo adasum": st.adasum_hook, "sumo acga": st.acga_hook}


def setup(method, model):
    """(module, optimizer, state to close) for a method ("+h": measured after hvd.init())."""
    if method.endswith("+h"):
        method = method[:-2]
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if method == "gloo":
        return DDP(model), sgd, None
    if method == "gloo hook":
        ddp = DDP(model)
        ddp.register_comm_hook(None, gloo_timed_hook)
        return ddp, sgd, None
    if method == "none":
        ddp = DDP(model)
        ddp.register_comm_hook(None, no_comm_hook)
        return ddp, sgd, None
    hook, _, where = method.partition("/")  # "/m": mapped_buffers=True, "/p": False
    if hook in HOOKS and where in ("", "m", "p", "g", "t"):  # "/g", "/t": flat communicators
        ddp = DDP(model)
        state = st.HookState(mapped_buffers={"": None, "m": True, "p": False, "g": None,
                                             "t": None}[where])
        if where in ("g", "t") and rt.state.transport in ("tcp", "hierarchical"):
            state.comm = flat_comm(where)
        ddp.register_comm_hook(state, HOOKS[hook])
        return ddp, sgd, state
    if method in ("opt avg/s", "opt avg/p", "opt avg/o"):
        # DistributedOptimizer(op=Average): /s at step() in one buffer (overlap=False, the
        # path before tensor fusion), /p overlapped one tensor per collective
        # (bucket_cap_mb=0: no fusion), /o overlapped in fused 1 MB buckets (the default).
        kind = method[-1]
        return model, st.DistributedOptimizer(sgd, model.named_parameters(), op=sumo.Average,
                                              overlap=kind != "s",
                                              bucket_cap_mb=0 if kind == "p" else 1.0), None
    if method == "sumo delta":
        return model, st.DistributedOptimizer(sgd, model.named_parameters(), op=sumo.Adasum), None
    if method == "sumo delta/p":
        return model, st.DistributedOptimizer(sgd, model.named_parameters(), op=sumo.Adasum,
                                              bucket_cap_mb=0), None
    if method == "sumo delta/s":
        return model, st.DistributedOptimizer(sgd, model.named_parameters(), op=sumo.Adasum,
                                              overlap=False), None
    if method == "hvd adasum":
        return model, hvd.DistributedOptimizer(sgd, model.named_parameters(), op=hvd.Adasum), None
    if method == "hvd avg":
        return model, hvd.DistributedOptimizer(sgd, model.named_parameters(), op=hvd.Average), None
    raise ValueError(method)


_flat_comms = {}


def flat_comm(where):
    """Across hosts, a "/g" method's hooks run on sumo's C collectives over the group's own
    calls (what init(transport="group") makes), a "/t" method's on sumo's flat TCP
    communicator (init(transport="tcp")'s); each made once for the job."""
    if where not in _flat_comms:
        from sumo.torch import _pg_transport as pgt, _stores
        if where == "g":
            t = pgt.GroupTransport(dist.group.WORLD)
            comm = t.comm(rt.state.local_size, "sumo_comm_create_transport")
        else:
            t = pgt.StoreAdapter(_stores._store_of(dist.group.WORLD))
            comm = _stores.make_tcp(t, st.rank(), st.size(),
                                    _stores._key_prefix(dist.group.WORLD), rt.state.local_size,
                                    "the group's store")
        _flat_comms[where] = (t, comm)
    return _flat_comms[where][1]


def comm_time():
    with _gloo_lock:
        g = [(a, b) for a, b in _gloo_timeline]
        _gloo_timeline.clear()
    return st.union_seconds(st.take_timeline() + g)


def run(method, make, args):
    torch.manual_seed(0)
    model = make()
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    module, opt, state = setup(method, model)
    g = torch.Generator().manual_seed(st.rank())
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times, comms = [], []
    for i in range(args.warmup + args.steps):
        st.barrier()  # steps start together, so a step's time is not the previous one's skew
        comm_time()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(module(x), y).backward()
        opt.step()
        t = time.perf_counter() - t0
        c = comm_time()
        if i >= args.warmup:
            times.append(t)
            comms.append(c)
    if state is not None:
        state.close()
    nparams = sum(p.numel() for p in model.parameters())
    return nparams, statistics.median(times), statistics.median(comms)


class _StandInBucket:
    """What the hooks read of a dist.GradBucket (index, flat buffer, its gradients as views),
    over a buffer of the size and layout DDP gave that bucket."""

    def __init__(self, index, buf, layout):
        self._index, self._buf = index, buf
        self._grads, off = [], 0
        for n in layout:
            self._grads.append(buf[off:off + n])
            off += n

    def index(self):
        return self._index

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._grads


def bucket_layouts(make, args, steps=3):
    """The buckets DDP hands a comm hook for this model, as (index, per-gradient sizes,
    dtype) in the order the hook is called, from the last of a few hooked steps (DDP rebuilds
    its buckets from the gradients' ready order after the first)."""
    torch.manual_seed(0)
    model = make()
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    ddp = DDP(model)
    seen = []

    def recording_hook(state, bucket):
        seen.append((bucket.index(), tuple(int(g.numel()) for g in bucket.gradients()),
                     bucket.buffer().dtype))
        return default_hooks.allreduce_hook(None, bucket)

    ddp.register_comm_hook(None, recording_hook)
    g = torch.Generator().manual_seed(st.rank())
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    for _ in range(steps):
        seen.clear()
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
    return list(seen)


COMM_METHODS = ["gloo", "sumo avg", "sumo adasum", "sumo acga"]


def rotated(items, i):
    """items starting at its (i mod len)-th: step i's order when every step runs each method
    once, so that no method always follows the same one (gloo's threads, say) or runs first."""
    k = i % len(items)
    return items[k:] + items[:k]


def comm_only(layouts, args):
    """Median seconds per step to reduce exactly these buckets, per method (see the module's
    docstring), methods interleaved step by step."""
    g = torch.Generator().manual_seed(1000 + st.rank())
    src = [torch.randn(sum(lay), generator=g).to(dt) for _, lay, dt in layouts]
    bufs = [t.clone() for t in src]
    buckets = [_StandInBucket(i, b, lay) for (i, lay, _), b in zip(layouts, bufs)]
    state = st.HookState()
    hooks = {"sumo avg": st.average_hook, "sumo adasum": st.adasum_hook,
             "sumo acga": st.acga_hook}
    methods = list(COMM_METHODS)
    states = {m: state for m in hooks}
    others = []
    if state.node_maps_memory:
        # Each hook also where the default does not put it: mapped (/m) or in place (/p).
        forced = {True: st.HookState(mapped_buffers=True),
                  False: st.HookState(mapped_buffers=False)}
        others.extend(forced.values())
        for m, gram_form in (("sumo avg", False), ("sumo adasum", True), ("sumo acga", True)):
            other = m + ("/p" if state.maps(gram_form) else "/m")
            hooks[other], states[other] = hooks[m], forced[not state.maps(gram_form)]
            methods.append(other)
    P = st.size()
    times = {m: [] for m in methods}
    for i in range(args.warmup + args.steps):
        for m in rotated(methods, i):
            for b, s in zip(bufs, src):
                b.copy_(s)
            st.barrier()
            t0 = time.perf_counter()
            if m == "gloo":
                works = []
                for b in bufs:  # as torch's allreduce_hook: divide, then allreduce
                    b.div_(P)
                    works.append(dist.all_reduce(b, async_op=True))
                for w in works:
                    w.wait()
            else:
                futs = [hooks[m](states[m], b) for b in buckets]
                for f in futs:
                    f.wait()
            t = time.perf_counter() - t0
            if i >= args.warmup:
                times[m].append(t)
    for hs in [state] + others:
        hs.close()
    st.take_timeline()  # the hooks' own records: not wanted here
    return {m: statistics.median(v) for m, v in times.items()}


def delta_params(method, steps=5):
    """The MLP's parameters (one flat vector) after a few steps of an Adasum delta optimizer
    ("sumo delta" or "hvd adasum") from the same start on the same per-rank data."""
    torch.manual_seed(0)
    model = mlp()
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    module, opt, _ = setup(method, model)
    for s in range(steps):
        g = torch.Generator().manual_seed(100 * s + st.rank())
        x, y = torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        F.cross_entropy(module(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


DELTA_METHODS = ["sumo delta", "sumo delta/p", "sumo delta/s", "hvd adasum"]


def delta_interleaved(make, args):
    """--delta-interleaved: median step ms of the Adasum delta optimizers, each on its own
    copy of the model, every step running each method once (order rotated step by step, a
    barrier before each), so the slow and fast phases of a shared machine hit them alike."""
    P = st.size()
    methods = [m for m in args.methods.split(",") if not m.startswith("hvd") or (
        hvd is not None and P & (P - 1) == 0)]
    setups = []
    for m in methods:
        torch.manual_seed(0)
        model = make()
        st.broadcast_parameters(model.state_dict(), root_rank=0)
        module, opt, _ = setup(m, model)
        setups.append((m, module, opt))
    g = torch.Generator().manual_seed(st.rank())
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times = {m: [] for m in methods}
    comms = {m: [] for m in methods}
    for i in range(args.warmup + args.steps):
        for m, module, opt in rotated(setups, i):
            st.barrier()
            comm_time()
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(module(x), y).backward()
            opt.step()
            t = time.perf_counter() - t0
            c = comm_time()
            if i >= args.warmup:
                times[m].append(t)
                comms[m].append(c)
    st.take_timeline()
    # Paired by step: a step's slow phase hits "none" and the method alike.
    added = {m: statistics.median(a - b for a, b in zip(times[m], times["none"]))
             if "none" in times else None for m in methods}
    return {m: (statistics.median(times[m]), statistics.median(comms[m]), added[m])
            for m in methods}


def delta_interleaved_main(args):
    """Horovod is initialised only when an hvd method is measured: its background thread
    slows everything beside it on a small machine, so "sumo delta" alone is sumo as its users
    run it, and with "hvd adasum" in --methods it is measured under the same conditions."""
    global hvd
    if not any(m.startswith("hvd") for m in args.methods.split(",")):
        hvd = None
    if hvd is not None:
        hvd.init()
    res = {m: delta_interleaved(MODELS[m], args) for m in args.models.split(",")}
    if st.rank() != 0:
        return
    print("Training steps on %d ranks x batch %d, interleaved step by step, Horovod %s, "
          "%d steps after %d warm-up (medians)" % (st.size(), args.batch, "initialised" if hvd
                                                   is not None else "not initialised", args.steps,
                                                   args.warmup))
    if rt.state.transport == "hierarchical":
        print("sumo across %d hosts of %d ranks: the hooks on the two-level communicator (sum "
              "and average: the chain in host order; Adasum: flat, over its TCP communicator); "
              "/t: a flat communicator over sumo's TCP transport, /g: over the group's own "
              "calls" % (st.size() // st.local_size(), st.local_size()))
    for m, r in res.items():
        ref = "hvd adasum" if "hvd adasum" in r else next(iter(r))
        hook = r.get("gloo hook")
        gloo = r.get("gloo")
        print("%-6s %-14s %10s %16s %10s %14s %10s %10s" % (
            "model", "method", "step ms", "vs " + ref, "comm ms", "vs gloo hook", "added ms",
            "vs gloo"))
        for method, (t, c, a) in r.items():
            no_window = method in ("gloo", "none")
            comm = "%10s" % "-" if no_window else "%10.2f" % (1e3 * c)
            vs = "%14s" % "-" if no_window or not hook or hook[1] <= 0 else \
                "%13.2fx" % (c / hook[1])
            add = "%10s" % "-" if a is None or method == "none" else "%10.2f" % (1e3 * a)
            vsa = "%10s" % "-" if a is None or method == "none" or not gloo or gloo[2] <= 0 \
                else "%9.2fx" % (a / gloo[2])
            print("%-6s %-14s %10.2f %15.2fx %s %s %s %s" % (m, method, 1e3 * t, t / r[ref][0],
                                                           comm, vs, add, vsa))
        print("comm ms: time inside communication per step (the hooks' intervals from call to "
              "completion, merged; the optimizers' collectives); gloo, DDP's built-in reducer, "
              "cannot be timed from outside")
        if "none" in r:
            print("added ms: the step's time over the same step's \"none\" (DDP with a hook that "
                  "reduces nothing), median over steps: what communication adds to a step, "
                  "DDP's own reducer (gloo) included")


def check_against_horovod(args):
    """sumo's delta optimizer and Horovod's Adasum optimizer from the same start on the same
    data: the parameters after a few steps (both per-tensor Adasum of the SGD deltas)."""
    return (delta_params("sumo delta") - delta_params("hvd adasum")).abs().max().item()


def check_only(args):
    """--check-only: sumo's delta optimizer on this many ranks (are the ranks' parameters
    bit-identical?), and Horovod's Adasum beside it when horovod imports (its error, if it
    refuses this rank count, e.g. 3: horovod issue 3400)."""
    mine = delta_params("sumo delta")
    ref = mine.clone()
    st.broadcast_(ref, root_rank=0)
    spread = torch.tensor([float((mine != ref).sum())], dtype=torch.float64)
    st.allreduce_(spread, op=sumo.Sum)
    if hvd is None:
        hv, why = None, "not run (%s)" % HVD_WHY
    else:
        try:
            hv, why = delta_params("hvd adasum"), None
        except Exception as e:  # Horovod's Adasum refuses some rank counts
            hv, why = None, "hvd adasum failed: %s: %s" % (type(e).__name__, str(e).splitlines()[0])
    if hv is not None:  # every rank's max |sumo - hvd|, slot per rank
        per_rank = torch.zeros(st.size(), dtype=torch.float64)
        per_rank[st.rank()] = (mine - hv).abs().max().item()
        st.allreduce_(per_rank, op=sumo.Sum)
    if st.rank() != 0:
        return
    print("%d ranks: sumo delta (Adasum of SGD deltas, 5 steps, MLP): %d parameter values differ "
          "from rank 0's on some rank" % (st.size(), int(spread.item())))
    if hv is None:
        print("%d ranks: horovod %s" % (st.size(), why))
    else:
        print("%d ranks: sumo delta vs hvd Adasum, max |param difference| after 5 steps, per "
              "rank: %s (largest |param| %.3g)" % (st.size(), " ".join("%.3g" % v for v in per_rank),
                                                   mine.abs().max().item()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch")
    ap.add_argument("--models", default="mlp,conv")
    ap.add_argument("--check-only", action="store_true",
                    help="only the parameter check of sumo's delta optimizer (and Horovod's "
                         "Adasum, when horovod imports) at this rank count")
    ap.add_argument("--delta-variants", action="store_true",
                    help="also the rows sumo delta/p (one parameter per bucket) and sumo "
                         "delta/s (no overlap: everything at step())")
    ap.add_argument("--delta-interleaved", "--interleaved", action="store_true",
                    help="only the training steps of --methods (by default the Adasum delta "
                         "optimizers), interleaved step by step (Horovod initialised only if "
                         "one of them is an hvd method)")
    ap.add_argument("--methods", default=",".join(DELTA_METHODS),
                    help="with --delta-interleaved (default: %(default)s); also gloo and the "
                         "hooks, e.g. 'gloo,sumo avg,sumo adasum,sumo adasum/p' (/m, /p: "
                         "HookState(mapped_buffers=True, False))")
    args = ap.parse_args()
    st.init()
    torch.set_num_threads(1)  # one core per rank
    if args.check_only:
        if hvd is not None:
            hvd.init()
        check_only(args)
        return
    if args.delta_interleaved:
        delta_interleaved_main(args)
        return
    methods = ["gloo", "gloo hook", "sumo avg", "sumo adasum", "sumo acga", "sumo delta"]
    if args.delta_variants:
        methods += ["sumo delta/p", "sumo delta/s"]
    rows, comm_rows, bucket_info = [], [], {}
    for m in args.models.split(","):
        for method in methods:
            rows.append((m,) + (method,) + run(method, MODELS[m], args))
        layouts = bucket_layouts(MODELS[m], args)
        bucket_info[m] = layouts
        for method, t in comm_only(layouts, args).items():
            comm_rows.append((m, method, t))
    diff = None
    P = st.size()
    pow2 = P & (P - 1) == 0  # Horovod's Adasum refuses other rank counts (horovod issue 3400)
    if hvd is not None:  # last: see the module's docstring
        hvd.init()
        for m in args.models.split(","):
            for method in ("hvd adasum", "hvd avg", "sumo delta+h") + (
                    ("sumo delta/p+h", "sumo delta/s+h") if args.delta_variants else ()):
                if method != "hvd adasum" or pow2:
                    rows.append((m, method) + run(method, MODELS[m], args))
        if pow2:
            diff = check_against_horovod(args)
    order = {m: i for i, m in enumerate(args.models.split(","))}
    rows.sort(key=lambda r: order[r[0]])  # stable: each model's rows in the order measured
    if st.rank() != 0:
        return
    print("DDP on %d ranks x batch %d, torch %s, %d steps after %d warm-up (medians)" % (
        P, args.batch, torch.__version__, args.steps, args.warmup))
    print("%-6s %-12s %9s %10s %11s %10s %9s" % ("model", "method", "params", "step ms",
                                                 "samples/s", "comm ms", "vs gloo"))
    base = {}
    for m, method, n, t, c in rows:
        if method == "gloo hook":
            base[m] = c
        rel = "%8.2fx" % (c / base[m]) if m in base and method not in (
            "gloo", "gloo hook", "hvd adasum", "hvd avg") and base[m] > 0 else "-"
        cms = "-" if method in ("gloo", "hvd adasum", "hvd avg") else "%10.2f" % (1e3 * c)
        print("%-6s %-12s %9d %10.2f %11.0f %10s %9s" % (m, method, n, 1e3 * t, P * args.batch / t,
                                                          cms, rel))
    print("comm ms: time inside communication per step (the union of the buckets' intervals); "
          "vs gloo: comm ms / the gloo hook's")
    print()
    print("Communication only: the buckets DDP hands the hook, reduced with nothing else running")
    for m, layouts in bucket_info.items():
        print("  %s: %d bucket(s): %s" % (m, len(layouts), ", ".join(
            "%d tensors / %.2f MB" % (len(lay), sum(lay) * torch.empty(0, dtype=dt).element_size() / 1e6)
            for _, lay, dt in layouts)))
    print("%-6s %-13s %13s %9s" % ("model", "method", "comm-only ms", "vs gloo"))
    gbase = {m: t for m, method, t in comm_rows if method == "gloo"}
    for m, method, t in comm_rows:
        rel = "-" if method == "gloo" else "%8.2fx" % (t / gbase[m])
        print("%-6s %-13s %13.2f %9s" % (m, method, 1e3 * t, rel))
    if hvd is None:
        print("horovod: not run (%s)" % HVD_WHY)
    elif diff is None:
        print("horovod: no hvd adasum rows: Horovod's Adasum runs on a power of 2 ranks only "
              "(horovod issue 3400); sumo's runs on %d" % P)
    else:
        print("horovod: sumo delta vs hvd Adasum, max |param difference| after 5 steps: %.3g" % diff)


if __name__ == "__main__":
    main()
