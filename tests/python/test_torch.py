"""sumo.torch against independent references, under mpirun -np 2 and 3 (and alone).

Every test is collective: all ranks run the same tests in the same order, and a test's
verdict is agreed across ranks where one rank alone could differ."""
import copy
import ctypes
import os
import shutil
import subprocess
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import sumo
import sumo.torch as st

from driver_files import run_outer_driver
from reference import adasum_per_tensor
from sumo._abi import (SUMO_COMBINE_AVERAGE, SUMO_COMPRESS_NONE, SUMO_OUTER_HEAVY_BALL,
                       SUMO_SPLIT_TENSORS)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


# The tests that compare a training with a reference over several steps run in float64
# (model and inputs). In float32 the two sides round differently (an average in another
# order, a step fused or not), a ReLU input within such a rounding of zero flips its unit on
# one side only, and the optimizers grow that into a difference far above any tolerance;
# whether it happens depends on the CPU's kernels, so a float32 comparison passes or fails by
# chance. In float64 the roundings are 2^-53, and the two sides agree to about 1e-15 of the
# largest parameter: F64_REL below. The float32 tests left are one step (both sides run the
# same forward and backward kernels on the same bits; only the combination differs, and no
# ReLU comes after it), bit for bit against the same code, or about dtypes themselves.
F64 = torch.float64
F64_REL = 1e-12


def make_model(seed=0, hidden=24, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 5)).to(dtype)


def batch(rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 12, generator=g), torch.randint(0, 5, (n,), generator=g)


def dtype_of(model):
    return next(model.parameters()).dtype


def loss_of(model, rank, step):
    """The batch in the model's dtype (float32 values, exact in float64)."""
    x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(x.to(dtype_of(model))), y)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_identical_across_ranks(tensors):
    """Bit-identical on every rank: each compares with rank 0's copy, and all agree."""
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
    root = flat.clone()
    st.broadcast_(root, 0)
    differ = torch.tensor([0.0 if torch.equal(flat, root) else 1.0], dtype=torch.float64)
    st.allreduce_(differ, op=sumo.Sum)
    assert differ.item() == 0, "%d rank(s) differ from rank 0" % differ.item()


def assert_close(a, b, rel=F64_REL):
    """Float64 parameters a against b: the largest difference at most rel times the largest
    |b|, over all tensors."""
    assert all(x.dtype == F64 and y.dtype == F64 for x, y in zip(a, b)), "compare in float64"
    err = max(float((x - y).abs().max()) for x, y in zip(a, b))
    scale = max(float(y.abs().max()) for y in b)
    assert err <= rel * scale, "max |a - b| = %.3g > %g x the largest parameter %.3g" % (
        err, rel, scale)


def train_ddp(hook=None, steps=4, bucket_cap_mb=25, state=None, dtype=F64):
    model = make_model(dtype=dtype)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        ddp.register_comm_hook(state if state is not None else st.HookState(), hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(steps):
        opt.zero_grad()
        loss_of(ddp, st.rank(), s).backward()
        opt.step()
    return model


# ---- start-up and tensors --------------------------------------------------------------------

def test_init_matches_launcher():
    # Whoever started the ranks, sumo's world is theirs, never a world of one per process.
    expect = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or "1")
    assert st.size() == expect
    assert 0 <= st.local_rank() < st.local_size() <= st.size()
    forced = os.environ.get("SUMO_TEST_TRANSPORT")
    if forced:
        want = forced
    elif "OMPI_COMM_WORLD_SIZE" in os.environ:
        want = "mpi"
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        want = "shm" if expect > 1 else "group"  # every torchrun rank here is on one host
    else:
        want = "threads"
    assert st.transport() == want
    assert dist.is_initialized() and dist.get_world_size() == st.size()
    # The MPI transport (and with it Open MPI) is loaded for an MPI launch alone.
    with open("/proc/self/maps") as f:
        assert ("/libsumo_mpi.so" in f.read()) == (want == "mpi")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_allreduce_dtypes(dtype):
    t = torch.arange(7, dtype=torch.float32).to(dtype) + st.rank()
    st.allreduce_(t, op=sumo.Sum, name="t")
    expect = sum(torch.arange(7, dtype=torch.float32) + r for r in range(st.size()))
    assert t.dtype == dtype
    torch.testing.assert_close(t.float(), expect)


def test_bad_tensors_raise_naming_the_tensor():
    with pytest.raises(TypeError, match="counts.*bool"):
        st.allreduce_(torch.ones(3, dtype=torch.bool), name="counts")
    with pytest.raises(ValueError, match="weight_t.*not contiguous"):
        st.allreduce_(torch.ones(3, 4).t(), name="weight_t")
    model = make_model()
    model[0].weight = torch.nn.Parameter(torch.ones(12, 24).t())  # a transposed view
    with pytest.raises(ValueError, match="0.weight.*not contiguous"):
        st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                model.named_parameters())


def test_mismatched_models_raise_on_every_rank():
    # Each rank a different hidden width: the collective sees different counts.
    if st.size() == 1:
        pytest.skip("needs two ranks")
    for op in (sumo.Average, sumo.Adasum):
        model = make_model(hidden=8 + st.rank())
        opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      model.named_parameters(), op=op)
        loss_of(model, st.rank(), 0).backward()
        with pytest.raises(sumo.SumoError, match="SUMO_ERR_MISMATCH") as e:
            opt.step()
        assert e.value.name == "SUMO_ERR_MISMATCH"
    # The communicator is still usable afterwards.
    t = torch.ones(2)
    st.allreduce_(t, op=sumo.Sum)
    assert t[0].item() == st.size()


def test_broadcast_parameters_and_optimizer_state():
    model = make_model(seed=st.rank())
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (st.rank() + 1))
    loss_of(model, st.rank(), 0).backward()
    opt.step()
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    st.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert_identical_across_ranks(params_of(model) + state)


# ---- DDP hooks -------------------------------------------------------------------------------

@pytest.mark.parametrize("bucket_cap_mb", [25, 0.001])
def test_average_hook_equals_ddp_default(bucket_cap_mb):
    ref = train_ddp(None, bucket_cap_mb=bucket_cap_mb)
    got = train_ddp(st.average_hook, bucket_cap_mb=bucket_cap_mb)
    assert_close(params_of(got), params_of(ref))
    assert_identical_across_ranks(params_of(got))


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.001])
def test_average_hook_on_mapped_buckets_equals_ddp_default(bucket_cap_mb):
    ref = train_ddp(None, bucket_cap_mb=bucket_cap_mb)
    state = st.HookState(mapped_buffers=True)
    got = train_ddp(st.average_hook, bucket_cap_mb=bucket_cap_mb, state=state)
    state.close()
    assert_close(params_of(got), params_of(ref))
    assert_identical_across_ranks(params_of(got))


@pytest.mark.parametrize("mapped_buffers", [False, True, None])
@pytest.mark.parametrize("bucket_cap_mb", [25, 0.001])
def test_adasum_hook_equals_reference(bucket_cap_mb, mapped_buffers):
    steps = 3
    state = st.HookState(mapped_buffers=mapped_buffers)
    got = train_ddp(st.adasum_hook, steps=steps, bucket_cap_mb=bucket_cap_mb, state=state)
    state.close()
    assert_identical_across_ranks(params_of(got))
    # Reference: every rank's gradient computed here, combined per tensor in float64.
    ref = make_model(dtype=F64)
    for s in range(steps):
        grads = []
        for r in range(st.size()):
            ref.zero_grad()
            loss_of(ref, r, s).backward()
            grads.append([p.grad.detach().clone() for p in ref.parameters()])
        combined = adasum_per_tensor(grads)
        with torch.no_grad():
            for p, g in zip(ref.parameters(), combined):
                p -= 0.1 * g.to(p.dtype)
    assert_close(params_of(got), params_of(ref))


@pytest.mark.parametrize("mapped_buffers", [False, True, None])
def test_hooks_reduce_in_place_unless_mapped(mapped_buffers):
    # Mapped (True; None: Adasum and ACGA): under MPI on one node the hook returns the
    # bucket's mapped buffer and leaves the bucket as it was (Adasum reads it, ACGA copies
    # it); else (and alone, on threads) the bucket itself, reduced.
    layout = [37, 5, 100, 1]
    one_node = st.transport() in ("mpi", "shm") and st.size() > 1 and st.local_size() == st.size()
    state = st.HookState(mapped_buffers=mapped_buffers)
    for hook, gram_form in ((st.average_hook, False), (st.adasum_hook, True),
                            (st.acga_hook, True)):
        buf = torch.randn(sum(layout), generator=torch.Generator().manual_seed(st.rank()))
        before = buf.clone()
        got = hook(state, _Bucket(buf, layout)).wait()
        maps = one_node and (gram_form if mapped_buffers is None else mapped_buffers)
        assert (got.data_ptr() != buf.data_ptr()) == maps, hook.__name__
        if maps:
            assert torch.equal(buf, before), hook.__name__
        assert_identical_across_ranks([got])
    state.close()


def test_hook_state_refuses_an_unknown_mapped_buffers():
    with pytest.raises(TypeError, match="mapped_buffers"):
        st.HookState(mapped_buffers="yes")


def test_mapped_bucket_follows_a_rebuilt_bucket():
    # DDP rebuilds its buckets after the first iteration: the same index, another size. The
    # hook must reduce the new bucket whole, not the old mapped buffer's size of it.
    state = st.HookState(mapped_buffers=True)
    for layout in ([300, 20], [7], [300, 20, 1000]):
        grads = [[torch.randn(sum(layout), generator=torch.Generator().manual_seed(r))]
                 for r in range(st.size())]
        buf = grads[st.rank()][0].clone()
        got = st.adasum_hook(state, _Bucket(buf, layout)).wait()
        off, ref = 0, []
        for n in layout:
            ref.append(adasum_per_tensor([[g[0][off:off + n]] for g in grads])[0])
            off += n
        assert got.numel() == sum(layout)
        torch.testing.assert_close(got.to(torch.float64), torch.cat(ref), rtol=1e-5, atol=1e-6)
        assert_identical_across_ranks([got])
    state.close()


def test_acga_hook_identical_and_checkpointable():
    state = st.HookState(acga_beta=0.5)
    got = train_ddp(st.acga_hook, steps=4, state=state, dtype=torch.float32)  # ACGA: fp32 only
    assert_identical_across_ranks(params_of(got))
    sd = state.state_dict()
    assert sd["acga"] and all(isinstance(v, bytes) for v in sd["acga"].values())
    other = st.HookState(acga_beta=0.5)
    other.load_state_dict(sd)
    assert other.state_dict()["acga"] == sd["acga"]
    state.close()
    other.close()


# ---- the Horovod-style optimizer -------------------------------------------------------------

def delta_reference(start, factory, steps, loss, passes=1):
    """Horovod's delta mode simulated here: one replica and optimizer per rank, each taking
    its local step (passes backward passes of loss(model, rank, step, k)) from the common
    start; the deltas are combined per tensor in float64 and added to start, returned."""
    replicas = [copy.deepcopy(start) for _ in range(st.size())]
    opts = [factory(m.parameters()) for m in replicas]
    for s in range(steps):
        deltas = []
        for r, (m, o) in enumerate(zip(replicas, opts)):
            with torch.no_grad():
                for p, q in zip(m.parameters(), start.parameters()):
                    p.copy_(q)
            o.zero_grad()
            for k in range(passes):
                loss(m, r, s, k).backward()
            o.step()
            deltas.append([p.detach() - q.detach() for p, q in zip(m.parameters(), start.parameters())])
        combined = adasum_per_tensor(deltas)
        with torch.no_grad():
            for q, d in zip(start.parameters(), combined):
                q += d.to(q.dtype)
    return start


OPTIMIZERS = {
    "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_delta_optimizer_equals_reference(name):
    steps = 4
    factory = OPTIMIZERS[name]
    model = make_model(dtype=F64)
    opt = st.DistributedOptimizer(factory(model.parameters()), model.named_parameters(),
                                  op=sumo.Adasum)
    for s in range(steps):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        opt.step()
    assert_identical_across_ranks(params_of(model))
    start = delta_reference(make_model(dtype=F64), factory, steps,
                            lambda m, r, s, k: loss_of(m, r, s))
    assert_close(params_of(model), params_of(start))


class _Gated(torch.nn.Module):
    """make_model() plus a side layer that only some steps and ranks use (so the ranks'
    gradients arrive differently) and a parameter no step uses."""

    def __init__(self, dtype=F64):
        super().__init__()
        self.net = make_model(dtype=dtype)
        self.side = torch.nn.Linear(12, 5).to(dtype)
        self.unused = torch.nn.Parameter(torch.ones(4, dtype=dtype))

    def forward(self, x, use_side):
        y = self.net(x)
        return y + self.side(x) if use_side else y


def _gated_loss(model, rank, step, k):
    x, y = batch(rank, 10 * step + k)
    x = x.to(dtype_of(model))
    use_side = (step + rank) % 3 == 0  # differs across ranks within a step
    return torch.nn.functional.cross_entropy(model(x, use_side), y)


OVERLAP_OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}


@pytest.mark.parametrize("name", sorted(OVERLAP_OPTIMIZERS))
@pytest.mark.parametrize("bucket_cap_mb,passes", [(0, 1), (1.0, 1), (0.001, 2)])
def test_overlapped_delta_optimizer_equals_reference(name, bucket_cap_mb, passes):
    # The local steps happen in the backward pass's hooks, per parameter; parameters without
    # a gradient (side on some ranks and steps, unused always) are stepped at step(), from
    # their .grad as a full step would (zeros once they had one: momentum moves them on).
    steps = 5
    factory = OVERLAP_OPTIMIZERS[name]
    model = _Gated()
    opt = st.DistributedOptimizer(factory(model.parameters()), model.named_parameters(),
                                  op=sumo.Adasum, backward_passes_per_step=passes,
                                  bucket_cap_mb=bucket_cap_mb)
    assert opt.overlap and len(opt._buckets) >= (8 if bucket_cap_mb == 0 else 1)
    for s in range(steps):
        opt.zero_grad()
        for k in range(passes):
            _gated_loss(model, st.rank(), s, k).backward()
        opt.step()
    assert_identical_across_ranks(params_of(model))
    # The reference takes full (non-overlapped) steps.
    start = delta_reference(_Gated(), factory, steps, _gated_loss, passes)
    assert_close(params_of(model), params_of(start))
    # The unused parameter never had a gradient: its delta is zero on every rank.
    assert torch.equal(model.unused.detach(), torch.ones(4, dtype=F64))


def test_overlapped_delta_optimizer_starts_during_backward():
    model = make_model()
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), op=sumo.Adasum, bucket_cap_mb=0)
    loss_of(model, st.rank(), 0).backward()
    assert opt._next == len(opt._buckets) == 6  # every bucket started before step()
    opt.step()
    # A second backward pass before step() with backward_passes_per_step=1: step() raises
    # on every rank and leaves the parameters where they started.
    before = params_of(model)
    opt.zero_grad()
    loss_of(model, st.rank(), 1).backward()
    loss_of(model, st.rank(), 2).backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step=1"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), before))
    assert_identical_across_ranks(params_of(model))
    # and the next step works.
    opt.zero_grad()
    loss_of(model, st.rank(), 3).backward()
    opt.step()
    assert_identical_across_ranks(params_of(model))


def test_overlapped_and_plain_delta_optimizer_agree():
    a, b = make_model(dtype=F64), make_model(dtype=F64)
    oa = st.DistributedOptimizer(torch.optim.AdamW(a.parameters(), lr=0.01), a.named_parameters(),
                                 op=sumo.Adasum)
    ob = st.DistributedOptimizer(torch.optim.AdamW(b.parameters(), lr=0.01), b.named_parameters(),
                                 op=sumo.Adasum, overlap=False)
    assert oa.overlap and not ob.overlap
    for s in range(4):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            loss_of(m, st.rank(), s).backward()
            o.step()
    assert_close(params_of(a), params_of(b))
    # Checkpoint round trip: the state is the wrapped optimizer's.
    sd = oa.state_dict()
    oa.load_state_dict(sd)
    assert set(sd["state"]) == set(ob.state_dict()["state"])


def test_average_optimizer_equals_ddp_default():
    ref = train_ddp(None)
    model = make_model(dtype=F64)
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  model.named_parameters(), op=sumo.Average)
    for s in range(4):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        opt.step()
    assert_close(params_of(model), params_of(ref))
    assert_identical_across_ranks(params_of(model))
    # Checkpoint round trip through the wrapper.
    opt.load_state_dict(opt.state_dict())


# ---- SlowMo ------------------------------------------------------------------------------------

def _train_local(wrap, steps, lr=0.05, inf_at=None):
    model = make_model(dtype=F64)
    opt = wrap(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    for s in range(steps):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        if inf_at is not None and s == inf_at and st.rank() == st.size() - 1:
            next(model.parameters()).grad[0, 0] = float("inf")
        opt.step()
    return model, opt


def test_localsgd_equals_post_localsgd():
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer
    period, steps = 3, 9
    got, _ = _train_local(lambda o: st.LocalSGD(o, period=period), steps)
    # PeriodicModelAverager counts from 0 and averages at warmup_steps, then every period:
    # warmup period - 1 averages after local steps period, 2 period, ... as Local SGD does.
    ref, _ = _train_local(lambda o: PostLocalSGDOptimizer(
        o, PeriodicModelAverager(period=period, warmup_steps=period - 1)), steps)
    assert_close(params_of(got), params_of(ref))
    assert_identical_across_ranks(params_of(got))


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_slowmo_momentum0_lr1_equals_localsgd(memory_efficient):
    got, _ = _train_local(lambda o: st.SlowMo(o, slowmo_frequency=3, slowmo_lr=1.0,
                                              slowmo_momentum=0.0, localsgd_frequency=0,
                                              slowmo_memory_efficient=memory_efficient), 9)
    ref, _ = _train_local(lambda o: st.LocalSGD(o, period=3, slowmo_memory_efficient=False), 9)
    assert_close(params_of(got), params_of(ref))


def test_slowmo_every_step_equals_plain_averaging():
    def plain(o):
        for g in o.param_groups:
            g["momentum"] = 0.0
        return o

    got, _ = _train_local(lambda o: st.SlowMo(plain(o), slowmo_frequency=1, localsgd_frequency=1,
                                              slowmo_momentum=0.0, slowmo_lr=1.0), 4)
    ref, _ = _train_local(lambda o: st.DistributedOptimizer(plain(o), op=sumo.Average), 4)
    assert_close(params_of(got), params_of(ref))


@pytest.mark.parametrize("memory_efficient", [False, True])
def test_slowmo_identical_after_outer_steps_and_checkpoint(memory_efficient):
    model, opt = _train_local(lambda o: st.SlowMo(o, slowmo_frequency=4, localsgd_frequency=2,
                                                  slowmo_memory_efficient=memory_efficient), 8)
    assert_identical_across_ranks(params_of(model))
    sd = opt.state_dict()
    blob = sd["diloco"]["state"]
    assert isinstance(blob, bytes) and len(blob) > 80
    opt.load_state_dict(sd)
    assert opt.state_dict()["diloco"]["state"] == blob
    # A state for other options is refused, naming what differs.
    other = st.SlowMo(torch.optim.SGD(make_model(dtype=F64).parameters(), lr=0.05),
                      slowmo_frequency=5, localsgd_frequency=0)
    with pytest.raises(sumo.SumoError):
        other.load_state_dict(sd)


def test_nonfinite_step_is_skipped_where_it_happens():
    # The last rank alone sees inf at step 2: it skips that step alone (no collective decides
    # it), counts it, and every rank meets at the outer steps with equal replicas.
    model, opt = _train_local(lambda o: st.LocalSGD(o, period=4), 8, inf_at=2)
    last = st.rank() == st.size() - 1
    assert opt.skipped == (1 if last else 0) and opt.steps == (7 if last else 8)
    assert_identical_across_ranks(params_of(model))


def test_slowmo_local_steps_do_not_communicate():
    # Between synchronisations nothing is exchanged (the earlier wrapper agreed on a
    # non-finite flag with an allreduce at every step).
    st.take_timeline()
    model = make_model()
    opt = st.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05), period=4)
    for s in range(3):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        opt.step()
    assert st.take_timeline() == []


@pytest.mark.parametrize("config", [(3, 0, 1.0, 0.5, 0), (3, 0, 1.0, 0.5, 1),
                                    (4, 2, 0.9, 0.6, 1), (2, 1, 1.0, 0.0, 0)])
def test_slowmo_python_and_c_give_the_same_bits(config):
    tau, inner, alpha, beta, efficient = config
    lr, steps, sizes = 0.5, 9, (37, 6)
    n = sum(sizes)
    start = torch.randn(n, generator=torch.Generator().manual_seed(11))
    # Each rank's deltas, step by step; the local step is SGD at lr on grad = delta / lr, which
    # moves the parameters by exactly delta (lr a power of two).
    deltas = [torch.randn(steps, n, generator=torch.Generator().manual_seed(100 + r)) * 0.01
              for r in range(st.size())]
    ps = [torch.nn.Parameter(start[:sizes[0]].clone()), torch.nn.Parameter(start[sizes[0]:].clone())]
    opt = st.SlowMo(torch.optim.SGD(ps, lr=lr), slowmo_frequency=tau, localsgd_frequency=inner,
                    slowmo_lr=alpha, slowmo_momentum=beta, slowmo_memory_efficient=bool(efficient))
    for s in range(steps):
        d = deltas[st.rank()][s]
        ps[0].grad = (d[:sizes[0]] / lr).clone()
        ps[1].grad = (d[sizes[0]:] / lr).clone()
        opt.step()
    got = torch.cat([p.detach().reshape(-1) for p in ps])
    folder = st.broadcast_object(tempfile.mkdtemp(prefix="sumo-slowmo-") if st.rank() == 0 else None)
    try:
        ok = torch.zeros(1, dtype=torch.float64)
        if st.rank() == 0:
            # H, F, delay, merge, heavy ball, alpha, beta, average, no compression, block,
            # the inner lr, inner period, sharded, whole tensors.
            options = [tau, 1, 0, 0.0, SUMO_OUTER_HEAVY_BALL, alpha, beta, SUMO_COMBINE_AVERAGE,
                       SUMO_COMPRESS_NONE, 128, lr, inner, efficient, SUMO_SPLIT_TENSORS]
            c = run_outer_driver(folder, sizes, None, options, steps, start, deltas)
            # Rank 0's parameters, the first of the driver's rows.
            c = torch.frombuffer(bytearray(c[:n * 4]), dtype=torch.float32)
            ok[0] = float(torch.equal(c, got))
        st.broadcast_(ok, 0)
        assert ok.item() == 1, "sumo.torch.SlowMo and the C SlowMo differ"
        assert_identical_across_ranks([got]) if (steps % tau == 0) else None
    finally:
        st.barrier()
        if st.rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)


# ---- the C driver and the Python path on the same inputs -----------------------------------

def write_bytes(path, t):
    """t's bytes as they lie in memory (what numpy's tofile writes), without numpy."""
    with open(path, "wb") as f:
        f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


class _Bucket:
    """What a hook reads from dist.GradBucket, for driving a hook without DDP."""

    def __init__(self, buf, layout):
        self._buf, self._layout = buf, layout

    def buffer(self):
        return self._buf

    def index(self):
        return 0

    def gradients(self):
        out, off = [], 0
        for n in self._layout:
            out.append(self._buf[off:off + n])
            off += n
        return out


@pytest.mark.parametrize("method,hook", [("avg", st.average_hook), ("adasum", st.adasum_hook),
                                         ("acga", st.acga_hook)])
def test_c_driver_and_python_give_the_same_bits(method, hook):
    driver = os.path.join(ROOT, "build", "tests", "combine_driver")
    layout = [37, 5, 100, 1]
    g = torch.Generator().manual_seed(7 + st.rank())
    buf = torch.randn(sum(layout), generator=g)
    folder = st.broadcast_object(tempfile.mkdtemp(prefix="sumo-parity-") if st.rank() == 0 else None)
    try:
        write_bytes(os.path.join(folder, "in.%d" % st.rank()), buf)
        state = st.HookState()
        got = hook(state, _Bucket(buf, layout)).wait().clone()  # close() frees a mapped result
        state.close()
        write_bytes(os.path.join(folder, "py.%d" % st.rank()), got)
        st.barrier()
        ok = torch.zeros(1, dtype=torch.float64)
        if st.rank() == 0:
            out = os.path.join(folder, "c.out")
            subprocess.run([driver, method, out, ",".join(map(str, layout))] +
                           [os.path.join(folder, "in.%d" % r) for r in range(st.size())],
                           check=True)
            c = open(out, "rb").read()
            ok[0] = float(all(open(os.path.join(folder, "py.%d" % r), "rb").read() == c
                              for r in range(st.size())))
        st.broadcast_(ok, 0)
        assert ok.item() == 1, "%s: the C driver and the Python path differ" % method
    finally:
        st.barrier()
        if st.rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)
