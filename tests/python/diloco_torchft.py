"""sumo.torch.DiLoCo next to torchft's DiLoCo (torchft.local_sgd.DiLoCo) on the same model,
data and options: two replicas on CPU, each a process of its own (torchrun --nproc_per_node 2),
every replica's parameters compared after a few outer steps, and the time per outer step of
each printed side by side. Not a pytest test: it needs two processes and torchft, which
scripts/torch-venv.sh adds to the torch 2.x environment; tests/python/run.sh runs it.

The comparison runs in float64 (model and batches), with a tolerance relative to the largest
parameter (--tol, 1e-12). In float32 it is ill-conditioned: sumo averages parameters and steps
in double where torchft averages fp32 pseudo-gradients and merges with lerp_, so the two differ
by fp32 roundings, and where a ReLU input lies within such a rounding of zero the unit flips
in one and not the other; AdamW and the Nesterov outer step then grow that into differences
of 1e-2, on some CPUs' torch kernels and settings and not others. float32 runs only for the
time columns (--no-timing leaves them out).

The configurations compared are the ones whose schedules coincide: torchft starts a fragment's
exchange `fragment_sync_delay` steps before its slot and sumo at its slot, so only delay 0
matches step for step (F 1, F 2 of whole layers, any merge). torchft's should_quantize is a
row-wise fp8 of its own in Triton kernels (a GPU's), so on CPU both exchange fp32.
"""
import argparse
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sumo.torch as st  # noqa: E402


def make_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10)).to(dtype)


def batch(rank, step, dtype, n=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 64, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g)


def local_step(model, opt, rank, step):
    x, y = batch(rank, step, next(model.parameters()).dtype)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def groups(model, F):
    """The fragments both libraries are given: F 1 the whole model, F 2 the first two linear
    layers and the last (whole layers, as torchft's fragments are modules)."""
    if F == 1:
        return [model]
    if F != 2:
        raise ValueError("--F: 1 or 2")
    children = list(model.children())
    return [torch.nn.ModuleList(children[:3]), torch.nn.ModuleList(children[3:])]


def inner(model, args):
    return torch.optim.AdamW(model.parameters(), lr=args.inner_lr)


def timed(args, step):
    """Runs every local step; returns the median wall and process CPU seconds (every thread,
    the library's own included) of an outer period: H local steps and what ends it. On a
    shared machine single periods are noisy; CPU time less so."""
    periods, t0, c0 = [], time.perf_counter(), time.process_time()
    for s in range(args.H * args.outer_steps):
        step(s)
        if (s + 1) % args.H == 0:
            t1, c1 = time.perf_counter(), time.process_time()
            periods.append((t1 - t0, c1 - c0))
            t0, c0 = t1, c1
    median = len(periods) // 2
    return (sorted(p[0] for p in periods)[median], sorted(p[1] for p in periods)[median])


def run_sumo(args, rank, dtype):
    model = make_model(dtype)
    opt = st.DiLoCo(inner(model, args), sync_every=args.H, fragments=groups(model, args.F), delay=0,
                    merge_alpha=args.merge, outer="nesterov", outer_lr=args.outer_lr,
                    outer_momentum=args.momentum)
    st.barrier()
    took = timed(args, lambda s: local_step(model, opt, rank, s))
    stats = opt.stats()
    opt.close()
    return flat(model), took, stats


def run_local(args, rank, dtype):
    """The local steps alone: what either wrapper adds is its time beyond this."""
    model = make_model(dtype)
    opt = inner(model, args)
    st.barrier()
    return timed(args, lambda s: local_step(model, opt, rank, s))


def run_torchft(args, rank, lighthouse, dtype):
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    model = make_model(dtype)
    opt = inner(model, args)
    # One replica group per process, each with its own store, as torchft's own tests run them.
    # init_sync off: at the first quorum (the end of step H) it would otherwise replace the
    # second replica's model with the first's, local steps and all, instead of averaging.
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=2,
                      load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
                      state_dict=lambda: {"model": model.state_dict()},
                      replica_id="replica%d-%s" % (rank, str(dtype)[6:]), store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
                      port=0, timeout=timedelta(seconds=60), use_async_quorum=False,
                      init_sync=False)
    # The paper's outer step: torch SGD with Nesterov momentum, one per fragment.
    fragments = groups(model, args.F)
    outers = [torch.optim.SGD(f.parameters(), lr=args.outer_lr, momentum=args.momentum,
                              nesterov=True) for f in fragments]
    st.barrier()
    with DiLoCo(manager, fragments, opt, outers, sync_every=args.H,
                fragment_update_alpha=args.merge):
        took = timed(args, lambda s: local_step(model, opt, rank, s))
    manager.shutdown(wait=False)
    return flat(model), took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--H", type=int, default=20)
    ap.add_argument("--F", type=int, default=1)
    ap.add_argument("--merge", type=float, default=0.0)
    ap.add_argument("--outer-steps", type=int, default=8)
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--tol", type=float, default=1e-12,
                    help="the largest float64 difference allowed, relative to the largest "
                         "parameter")
    ap.add_argument("--no-timing", action="store_true",
                    help="compare only (float64), without the float32 runs that time each")
    args = ap.parse_args()
    torch.set_num_threads(1)
    st.init()
    rank = st.rank()
    lighthouse = None
    if rank == 0:
        from torchft.coordination import LighthouseServer
        server = LighthouseServer(bind="[::]:0", min_replicas=st.size())
        lighthouse = server.address()
    lighthouse = st.broadcast_object(lighthouse)

    theirs, _ = run_torchft(args, rank, lighthouse, torch.float64)
    ours, _, stats = run_sumo(args, rank, torch.float64)
    nan = (float("nan"), float("nan"))
    t_ft = t_sumo = t_local = nan
    if not args.no_timing:
        _, t_ft = run_torchft(args, rank, lighthouse, torch.float32)
        _, t_sumo, _ = run_sumo(args, rank, torch.float32)
        t_local = run_local(args, rank, torch.float32)

    err = float((ours - theirs).abs().max())
    scale = float(theirs.abs().max())
    errs = torch.tensor([err, *t_sumo, *t_ft, *t_local, scale], dtype=torch.float64)
    every = [torch.zeros_like(errs) for _ in range(st.size())]
    for r in range(st.size()):
        buf = errs.clone()
        st.broadcast_(buf, r)
        every[r] = buf
    if rank == 0:
        n = ours.numel()
        worst = max(float(e[0]) for e in every)
        worst_rel = max(float(e[0]) / float(e[-1]) for e in every)
        print("torch %s, %d replicas, %d parameters, H %d, F %d, merge %g, %d outer steps, "
              "AdamW %g, Nesterov %g/%g" % (torch.__version__, st.size(), n, args.H, args.F,
                                            args.merge, args.outer_steps, args.inner_lr,
                                            args.outer_lr, args.momentum))
        print("max |sumo - torchft| over replicas, float64: %.3g (largest parameter %.3g: "
              "%.3g of it, tolerance %g of it)" % (worst, scale, worst_rel, args.tol))
        if not args.no_timing:
            print("per outer step in float32 (%d local steps and the sync; medians, the slowest "
                  "replica's):" % args.H)
            for name, col in (("sumo.torch.DiLoCo", 1), ("torchft DiLoCo", 3),
                              ("local steps only", 5)):
                wall = max(float(e[col]) for e in every)
                cpu = max(float(e[col + 1]) for e in every)
                print("  %-18s %7.1f ms wall %7.1f ms CPU" % (name, 1e3 * wall, 1e3 * cpu))
        print("sumo's exchanges: %d rounds, %d payload bytes per replica"
              % (stats["rounds"], stats["bytes"]))
        print("PASS" if worst_rel <= args.tol else "FAIL")
        sys.stdout.flush()
        server.shutdown()
    st.barrier()
    if any(float(e[0]) > args.tol * float(e[-1]) for e in every):
        sys.exit(1)


if __name__ == "__main__":
    main()
