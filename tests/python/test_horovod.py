"""sumo.torch as a Horovod drop-in and on both torch lines (1.13, 2.x), against references
written here, alone and under mpirun -np 2 and 3. Every test is collective: all ranks run
the same tests in the same order.

Each rank's data is a function of its rank, so every rank can compute what every other
rank contributed and build the expected result without sumo."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import sumo
import sumo.torch as hvd
from sumo.torch import _calls

from reference import adasum_tree
from test_torch import (F64, assert_close, assert_identical_across_ranks, loss_of, make_model,
                        params_of)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# Started by a launcher (mpirun, torchrun): tests that start processes of their own run in the
# plain one-process session, where the children do not inherit a launcher's world.
LAUNCHED = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                         "TORCHELASTIC_RUN_ID"))


def data(rank, n=37, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(n, generator=g).to(dtype)


def everyone(fn):
    return [fn(r) for r in range(hvd.size())]


# ---- torch 2.x: what the wrappers must not change ----------------------------------------------

@pytest.mark.parametrize("wrap", ["average", "adasum", "adasum-flat", "slowmo"])
def test_zero_grad_does_what_the_wrapped_optimizer_does(wrap):
    # torch 2.x's zero_grad() sets gradients to None, 1.13's to zeros: a wrapper must leave
    # what the optimizer it wraps leaves (None skips a parameter's update; zeros step it).
    def wrapped(opt, model):
        if wrap == "slowmo":
            return hvd.SlowMo(opt, slowmo_frequency=2, localsgd_frequency=1)
        return hvd.DistributedOptimizer(opt, model.named_parameters(),
                                        op=sumo.Average if wrap == "average" else sumo.Adasum,
                                        overlap=wrap == "adasum")

    bare_model, model = make_model(), make_model()
    bare = torch.optim.SGD(bare_model.parameters(), lr=0.1)
    opt = wrapped(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for m, o in ((bare_model, bare), (model, opt)):
        loss_of(m, hvd.rank(), 0).backward()
        o.step()
        o.zero_grad()
    for p, q in zip(bare_model.parameters(), model.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad)
    with pytest.raises(TypeError):
        opt.zero_grad(set_to_none=True, bogus=1)  # the wrapped optimizer's own signature


class Picklable:
    """Not a tensor, dict or list: torch.load(weights_only=True), torch 2.6's default,
    refuses it."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Picklable) and other.value == self.value


def test_broadcast_object_of_any_picklable_object():
    obj = Picklable({"rank": hvd.rank(), "list": [1, 2.5], "t": torch.arange(3)})
    got = hvd.broadcast_object(obj, root_rank=0)
    assert got.value["rank"] == 0 and got.value["list"] == [1, 2.5]
    assert torch.equal(got.value["t"], torch.arange(3))
    gathered = hvd.allgather_object(("rank", hvd.rank(), b"\x00" * hvd.rank()))
    assert gathered == [("rank", r, b"\x00" * r) for r in range(hvd.size())]


NO_NUMPY = r"""
import sys
sys.modules["numpy"] = None   # import numpy fails, as where it is not installed
import torch, sumo, sumo.torch as hvd
hvd.init()
model = torch.nn.Linear(3, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.ones(4, 3)).sum().backward()
opt.step()
hvd.broadcast_optimizer_state(opt, root_rank=0)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
assert hvd.broadcast_object({"a": [1, 2]}) == {"a": [1, 2]}
assert hvd.allgather_object("x") == ["x"]
assert hvd.allgather(torch.arange(4)).tolist() == [0, 1, 2, 3]
assert hvd.broadcast(torch.tensor([2 ** 60 + 1])).item() == 2 ** 60 + 1
print("ok without numpy")
"""


@pytest.mark.skipif(LAUNCHED, reason="starts its own one-rank process; runs without a launcher")
def test_binding_needs_no_numpy():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", NO_NUMPY], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "ok without numpy" in out.stdout, out.stderr[-2000:]


# ---- allreduce -----------------------------------------------------------------------------

@pytest.mark.parametrize("op", [sumo.Sum, sumo.Average, sumo.Adasum])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.5, 3.0)])
def test_allreduce_equals_reference(op, scales):
    pre, post = scales
    mine = data(hvd.rank())
    before = mine.clone()
    got = hvd.allreduce(mine, op=op, prescale_factor=pre, postscale_factor=post, name="x")
    assert torch.equal(mine, before), "allreduce must not modify its input"
    inputs = [t.double() * pre for t in everyone(data)]
    if op == sumo.Adasum:
        ref = adasum_tree(inputs)
    else:
        ref = sum(inputs) / (hvd.size() if op == sumo.Average else 1)
    torch.testing.assert_close(got.double(), ref * post, rtol=1e-5, atol=1e-5)
    assert_identical_across_ranks([got])
    # In place gives the same bits.
    again = data(hvd.rank())
    assert hvd.allreduce_(again, op=op, prescale_factor=pre, postscale_factor=post) is again
    assert torch.equal(again, got)


def test_allreduce_op_and_deprecated_average():
    t = data(hvd.rank())
    ref_sum = hvd.allreduce(t, op=sumo.Sum)
    with pytest.warns(DeprecationWarning):
        assert torch.equal(hvd.allreduce(t, average=False), ref_sum)
    with pytest.warns(DeprecationWarning):
        assert torch.equal(hvd.allreduce(t, True), hvd.allreduce(t))
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(t, average=True, op=sumo.Sum)
    # An op in average's place (sumo's op numbers are not Horovod's) is refused.
    with pytest.raises(TypeError, match="average"):
        hvd.allreduce(t, sumo.Adasum)
    with pytest.raises(ValueError, match="op must be"):
        hvd.allreduce(t, op=7)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_allreduce_of_integers(dtype):
    big = 2 ** 40 if dtype == torch.int64 else 2 ** 20

    def mine(r):
        return torch.tensor([r + 1, -3 * r - 1, big + r, 7], dtype=dtype)
    total = sum(everyone(mine))
    assert torch.equal(hvd.allreduce(mine(hvd.rank()), op=sumo.Sum), total)
    avg = hvd.allreduce(mine(hvd.rank()))
    assert avg.dtype == dtype
    assert torch.equal(avg, torch.div(total, hvd.size(), rounding_mode="trunc"))
    with pytest.raises(TypeError, match="integer"):
        hvd.allreduce(mine(hvd.rank()), op=sumo.Adasum)


@pytest.mark.parametrize("compression,dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@pytest.mark.parametrize("op", [sumo.Sum, sumo.Average])
def test_compressed_allreduce_accumulates_in_fp32(compression, dtype, op):
    # Values near 2000 with fp16's 11 bits: a 16-bit running sum would round after every
    # rank; sumo rounds each input and the result, and sums in fp32 in rank order.
    def mine(r):
        return data(r, 500) * 100 + 2000
    got = hvd.allreduce(mine(hvd.rank()), op=op, compression=getattr(hvd.Compression, compression))
    assert got.dtype == torch.float32
    acc = torch.zeros(500)
    for t in everyone(mine):
        acc += t.to(dtype).float()
    if op == sumo.Average:
        acc /= hvd.size()
    assert torch.equal(got, acc.to(dtype).float())


def test_allreduce_is_differentiable():
    x = data(hvd.rank(), 5).requires_grad_()
    y = hvd.allreduce(x * 2, op=sumo.Sum, postscale_factor=0.5)
    (y * torch.arange(5.0)).sum().backward()
    # d/dx_r of sum_k c_k * 0.5 * sum_s 2 x_s,k is c_k on every rank, reduced as forward: Sum
    # of every rank's c * 0.5, times 2 by the chain rule.
    torch.testing.assert_close(x.grad, torch.arange(5.0) * 0.5 * hvd.size() * 2)


def test_grouped_and_async_allreduce_equal_one_by_one():
    tensors = [data(hvd.rank(), n, seed=n) for n in (3, 50, 1)] + \
              [data(hvd.rank(), 4, dtype=torch.float64), torch.arange(3) + hvd.rank()]
    one_by_one = [hvd.allreduce(t, op=sumo.Average) for t in tensors]
    grouped = hvd.grouped_allreduce(tensors, op=sumo.Average)
    assert all(torch.equal(a, b) for a, b in zip(grouped, one_by_one))
    adasum = hvd.grouped_allreduce(tensors[:3], op=sumo.Adasum)
    assert all(torch.equal(a, hvd.allreduce(t, op=sumo.Adasum)) for a, t in zip(adasum, tensors))
    copies = [t.clone() for t in tensors]
    assert hvd.grouped_allreduce_(copies) is not None
    assert all(torch.equal(a, b) for a, b in zip(copies, one_by_one))
    handles = [hvd.allreduce_async(t, op=sumo.Average) for t in tensors]
    in_place = tensors[1].clone()
    h = hvd.allreduce_async_(in_place, op=sumo.Average)
    assert all(torch.equal(hvd.synchronize(hd), ref) for hd, ref in zip(handles, one_by_one))
    while not hvd.poll(h):
        pass
    assert hvd.synchronize(h) is in_place and torch.equal(in_place, one_by_one[1])
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.synchronize(h)


# ---- allgather, broadcast ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
def test_allgather_concatenates_differing_first_dimensions(dtype):
    def mine(r):
        g = torch.Generator().manual_seed(r)
        return (torch.randn(r + 1, 2, 3, generator=g) * 10).to(dtype)
    got = hvd.allgather(mine(hvd.rank()), name="rows")
    assert torch.equal(got, torch.cat(everyone(mine)))
    empty = hvd.allgather(torch.zeros(0, 4, dtype=dtype))
    assert empty.shape == (0, 4)
    scalar = hvd.allgather(torch.tensor(float(hvd.rank())))
    assert scalar.tolist() == [float(r) for r in range(hvd.size())]


def test_allgather_refuses_differing_trailing_dimensions_on_every_rank():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(ValueError, match="rank 1 float32 \\(1, 3\\)"):
        hvd.allgather(torch.zeros(1, 2 + min(hvd.rank(), 1)))
    assert_identical_across_ranks([torch.ones(1)])  # still usable


def test_allgather_is_differentiable():
    x = torch.ones(hvd.rank() + 1, 2, requires_grad=True)
    y = hvd.allgather(x)
    weights = torch.arange(float(y.numel())).view_as(y)
    (y * weights).sum().backward()
    # Each rank's gradient is its rows of the sum over ranks of the weights.
    offset = sum(r + 1 for r in range(hvd.rank()))
    torch.testing.assert_close(x.grad, weights[offset:offset + hvd.rank() + 1] * hvd.size())


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8])
def test_broadcast_out_of_place_and_in_place(dtype):
    root = hvd.size() - 1

    def mine(r):
        return (torch.tensor([3, 5, 0, 1]) * (r + 1) % 7).to(dtype) \
            if dtype != torch.float32 else data(r, 4)
    t = mine(hvd.rank())
    before = t.clone()
    got = hvd.broadcast(t, root_rank=root)
    assert torch.equal(t, before) and torch.equal(got, mine(root))
    assert hvd.broadcast_(t, root) is t and torch.equal(t, mine(root))
    big = torch.tensor([2 ** 60 + hvd.rank()])
    assert hvd.broadcast(big, 0).item() == 2 ** 60  # bit for bit, not through float64
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(t, root_rank=hvd.size())


def test_broadcast_is_differentiable():
    x = torch.full((3,), float(hvd.rank()), requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    expect = float(hvd.size()) if hvd.rank() == 0 else 0.0
    assert x.grad.tolist() == [expect] * 3


def test_broadcast_parameters_takes_what_horovod_takes():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(hvd.rank())
    model[1].num_batches_tracked.fill_(2 ** 55 + hvd.rank())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert model[1].num_batches_tracked.item() == 2 ** 55  # exact: not through float64
    assert all(bool((p == 0).all()) for p in model.parameters())
    with torch.no_grad():
        model[0].bias.fill_(hvd.rank() + 5)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    assert model[0].bias.tolist() == [5.0] * 4
    with torch.no_grad():
        model[0].bias.fill_(hvd.rank() + 6)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert model[0].bias.tolist() == [6.0] * 4


def test_what_this_build_has():
    assert not hvd.gloo_built()
    assert hvd.cuda_built() == os.path.exists(sumo._lib.CUDA_LIBRARY)  # libsumo_cuda beside
    assert hvd.nccl_built() == int(hvd.cuda_built())
    assert hvd.mpi_built() == os.path.exists(sumo._lib.MPI_LIBRARY)
    assert hvd.mpi_enabled() == (hvd.transport() == "mpi")
    assert hvd.is_initialized()


# ---- DistributedOptimizer with Horovod's arguments ---------------------------------------------

def _grads_of_every_rank(step, model_seed=0):
    out = []
    for r in range(hvd.size()):
        m = make_model(model_seed)
        loss_of(m, r, step).backward()
        out.append([p.grad.detach().clone() for p in m.parameters()])
    return out


def _one_step(**kw):
    """One step in float32. Its comparisons cannot flip with the CPU: every side runs the same
    forward and backward on the same bits, and only the combination of the gradients (an order
    of sums, a division) differs, after which no ReLU comes."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   model.named_parameters(), **kw)
    opt.zero_grad()
    loss_of(model, hvd.rank(), 0).backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("compression,dtype", [("none", None), ("fp16", torch.float16),
                                               ("bf16", torch.bfloat16)])
def test_optimizer_compression_equals_reference(compression, dtype):
    model, _ = _one_step(compression=getattr(hvd.Compression, compression))
    grads = _grads_of_every_rank(0)
    start = params_of(make_model())
    for k, (p, s) in enumerate(zip(model.parameters(), start)):
        acc = sum((g[k] if dtype is None else g[k].to(dtype).float()) for g in grads) / hvd.size()
        g = acc if dtype is None else acc.to(dtype).float()
        assert torch.equal(p.detach(), s - g) if dtype is not None else \
            torch.allclose(p.detach(), s - g, rtol=1e-6, atol=1e-7)
    assert_identical_across_ranks(params_of(model))


def test_optimizer_gradient_predivide_factor():
    plain, _ = _one_step()
    split, _ = _one_step(gradient_predivide_factor=4.0)
    assert_close_params(plain, split)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        _one_step(op=sumo.Sum, gradient_predivide_factor=2.0)


def assert_close_params(a, b, rtol=1e-6, atol=1e-7):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("groups", [1, 2, 5, "lists"])
def test_optimizer_groups_give_the_same_bits(groups):
    plain, _ = _one_step()
    if groups == "lists":
        model = make_model()
        groups = [[model[0].weight, model[2].bias], [model[4].weight]]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       model.named_parameters(), groups=groups)
        assert len(opt._sync_groups) == 2 + 3
        loss_of(model, hvd.rank(), 0).backward()
        opt.step()
    else:
        model, opt = _one_step(groups=groups)
        assert len(opt._sync_groups) == groups
    assert all(torch.equal(p, q) for p, q in zip(params_of(model), params_of(plain)))
    with pytest.raises(ValueError, match="groups"):
        _one_step(groups=0)
    with pytest.raises(ValueError, match="only appear once"):
        m = make_model()
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1.0),
                                 groups=[[m[0].weight], [m[0].weight]])


def test_optimizer_checks_named_parameters_as_horovod_does():
    model = make_model()
    named = list(model.named_parameters())
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(sgd, named[:2])
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, [("w", p) for _, p in named])
    with pytest.raises(ValueError, match="pairs"):
        hvd.DistributedOptimizer(sgd, [p for _, p in named])
    # sumo's old third positional argument was op; Horovod's is compression.
    with pytest.raises(TypeError, match="compression"):
        hvd.DistributedOptimizer(sgd, named, sumo.Adasum)


def test_optimizer_synchronize_then_clip_then_step():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   model.named_parameters(), op=sumo.Sum)
    loss_of(model, hvd.rank(), 0).backward()
    opt.synchronize()
    summed = [p.grad.clone() for p in model.parameters()]
    grads = _grads_of_every_rank(0)
    ref = [sum(g[k] for g in grads) for k in range(len(summed))]
    for a, b in zip(summed, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    clipped = [p.grad.clone() for p in model.parameters()]
    start = params_of(model)
    with opt.skip_synchronize():
        opt.step()
    assert all(torch.equal(p, s - g) for p, s, g in zip(params_of(model), start, clipped))
    # step() after synchronize() without skip_synchronize() warns and does not sum twice.
    opt.zero_grad()
    loss_of(model, hvd.rank(), 1).backward()
    opt.synchronize()
    once = [p.grad.clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="not combined again"):
        opt.step()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), once))
    adasum = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                      model.named_parameters(), op=sumo.Adasum, overlap=False)
    adasum.synchronize()  # nothing to do: Adasum combines at step()
    with pytest.raises(RuntimeError, match="skip_synchronize"):
        with adasum.skip_synchronize():
            pass


def test_optimizer_leaves_frozen_parameters_alone():
    model = make_model()
    model[0].weight.requires_grad_(False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0, weight_decay=0.5),
                                   model.named_parameters())
    before = model[0].weight.detach().clone()
    loss_of(model, hvd.rank(), 0).backward()
    opt.step()
    assert model[0].weight.grad is None and torch.equal(model[0].weight, before)


@pytest.mark.parametrize("overlap", [True, False])
def test_adasum_delta_with_fp16_compression_equals_reference(overlap):
    steps = 2
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   model.named_parameters(), op=sumo.Adasum,
                                   compression=hvd.Compression.fp16, overlap=overlap)
    # Reference, step by step from the parameters sumo's step started from: every rank's SGD
    # delta, rounded to fp16, combined by Adasum per tensor in float64, rounded to fp16 once,
    # added to the start. Both sides round to fp16 (sumo's delta is p - start in float32, the
    # reference's -0.5 grad: a tie may round one fp16 unit apart, hence the tolerance), so
    # neither a float64 model nor a comparison of whole runs would do: after a step that
    # differs by an fp16 unit, a ReLU input that close to zero could flip on one side. From
    # the same start, both sides run the same forward and backward on the same bits.
    for s in range(steps):
        start = {k: v.clone() for k, v in model.state_dict().items()}
        opt.zero_grad()
        loss_of(model, hvd.rank(), s).backward()
        opt.step()
        assert_identical_across_ranks(params_of(model))
        deltas = []
        for r in range(hvd.size()):
            m = make_model()
            m.load_state_dict(start)
            loss_of(m, r, s).backward()
            deltas.append([(-0.5 * p.grad).half() for p in m.parameters()])
        ref = make_model()
        ref.load_state_dict(start)
        with torch.no_grad():
            for k, p in enumerate(ref.parameters()):
                p += adasum_tree([d[k] for d in deltas]).view_as(p).half().float()
        for p, q in zip(params_of(model), params_of(ref)):
            torch.testing.assert_close(p, q, rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="op=Adasum takes"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), op=sumo.Adasum,
                                 compression=_Scaled)


class _Scaled(hvd.compression.Compressor):
    """A Horovod-style compressor of the user's own."""

    @staticmethod
    def compress(tensor):
        return tensor * 2, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor / 2


def test_optimizer_takes_a_users_compressor():
    plain, _ = _one_step()
    scaled, _ = _one_step(compression=_Scaled)
    assert_close_params(plain, scaled)


# ---- join ------------------------------------------------------------------------------------

def test_join_takes_part_with_zeros_until_every_rank_joined():
    if hvd.size() == 1:
        assert hvd.join() == 0
        return
    # Uneven data: rank r trains size - 1 - r steps (the last rank none), then joins; rank
    # 0 joins last.
    steps = hvd.size() - 1 - hvd.rank()

    def active(s):
        return [r for r in range(hvd.size()) if s < hvd.size() - 1 - r]
    # In float64: a comparison over steps (test_torch.py says why not in float32).
    model = make_model(dtype=F64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   model.named_parameters())
    results = []
    for s in range(steps):
        opt.zero_grad()
        loss_of(model, hvd.rank(), s).backward()
        opt.step()
        results.append(hvd.allreduce(torch.full((3,), float(hvd.rank() + 1))))
        hvd.barrier()
    assert hvd.join() == 0
    # The joined ranks gave zeros, and Average still divides by size(), as Horovod's.
    for s, got in enumerate(results):
        assert torch.equal(got, torch.full((3,), float(sum(r + 1 for r in active(s)))) / hvd.size())
    ref = make_model(dtype=F64)
    for s in range(steps):
        grads = []
        for r in active(s):
            ref.zero_grad()
            loss_of(ref, r, s).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        with torch.no_grad():
            for k, p in enumerate(ref.parameters()):
                p -= sum(g[k] for g in grads) / hvd.size()
    assert_close(params_of(model), params_of(ref))


def test_join_refuses_a_broadcast_on_every_rank_and_answers_any_average():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    last = hvd.size() - 1
    # The last rank joins at once; the others try a broadcast, which a joined rank cannot
    # take part in: it raises on every rank, the joined one too, as in Horovod.
    with pytest.raises(sumo.SumoError, match="rank %d called sumo_join" % last) as e:
        if hvd.rank() == last:
            hvd.join()
        else:
            hvd.broadcast(torch.ones(2), 0)
    assert e.value.name == "SUMO_ERR_INVALID_USAGE"
    # Still usable; now every rank joins in the same round: the highest is the last.
    assert hvd.join() == last
    # An allreduce made outside the Horovod surface (the DDP hooks', SlowMo's) is answered
    # too: the joined rank adds zeros.
    if hvd.rank() == last:
        assert hvd.join() == last - 1
    else:
        got = torch.ones(5)
        _calls.allreduce_tensor(got, sumo.Average, "raw")
        assert torch.equal(got, torch.full((5,), float(hvd.size() - 1) / hvd.size()))
        assert hvd.join() == last - 1
    assert_identical_across_ranks([torch.ones(2)])  # every rank out of join, still usable


def test_a_collective_costs_its_own_c_call_and_nothing_else():
    # Nothing is sent before a collective for join's sake: sumo's communicator counts one C
    # collective per allreduce, barrier or broadcast of the surface, at every size.
    from sumo.torch import collectives

    def cost(call):
        before = collectives.comm_stats()["rounds"]
        call()
        return collectives.comm_stats()["rounds"] - before
    assert cost(lambda: hvd.allreduce(torch.ones(3))) == 1
    assert cost(lambda: hvd.allreduce_(torch.ones(3), op=sumo.Sum)) == 1
    assert cost(hvd.barrier) == 1
    assert cost(lambda: hvd.broadcast_(torch.ones(3), 0)) == 1
    assert cost(lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(3)))) == 1
    grown = torch.tensor([float(collectives.comm_stats()["rounds"])], dtype=torch.float64)
    assert_identical_across_ranks([grown])


def test_compressors_send_integers_as_they_are():
    t, ctx = hvd.Compression.fp16.compress(torch.arange(3))
    assert t.dtype == torch.int64 and ctx is None
    t, ctx = hvd.Compression.bf16.compress(torch.ones(2, dtype=torch.float64))
    assert t.dtype == torch.bfloat16
    assert hvd.Compression.bf16.decompress(t, ctx).dtype == torch.float64


# ---- a Horovod script, unchanged but for its import ----------------------------------------

FASHION = "/usr/share/datasets/fashion-mnist"


def _run_horovod_example(launch, mode):
    if not os.path.isdir(FASHION):
        pytest.skip("no %s (apt-get install dataset-fashion-mnist)" % FASHION)
    flags = {"gradients": [], "adasum": ["--use-adasum"], "fp16": ["--fp16-allreduce"]}[mode]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(launch + [os.path.join(ROOT, "examples", "horovod_style.py"), "--epochs",
                                   "1", "--train-limit", "6000", "--test-limit", "1000", "--lr",
                                   "0.05", "--momentum", "0.9", "--check-replicas"] + flags,
                         env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert text.count("replicas identical: True") == 2, text[-3000:]
    first = float(re.search(r"Train Epoch: 1 \[0/\d+ .*Loss: ([0-9.]+)", text).group(1))
    accuracy = float(re.search(r"Accuracy: ([0-9.]+)%", text).group(1))
    loss = float(re.search(r"Test set: Average loss: ([0-9.]+)", text).group(1))
    # Ten classes: chance is 10%; one epoch over 6000 images reaches about 60%.
    assert accuracy > 45 and loss < first, text[-3000:]


@pytest.mark.skipif(LAUNCHED, reason="starts its own mpirun; runs without a launcher")
@pytest.mark.parametrize("mode", ["gradients", "adasum", "fp16"])
def test_horovod_style_example_trains_under_mpirun(mode):
    if not shutil.which("mpirun") or not hvd.mpi_built():
        pytest.skip("no mpirun, or libsumo built without MPI")
    _run_horovod_example(["mpirun", "--oversubscribe", "-np", "2", sys.executable], mode)


@pytest.mark.skipif(LAUNCHED, reason="starts its own torchrun; runs without a launcher")
@pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2,
                    reason="Debian's torch 1.13 ships a torchrun that cannot start on Python 3.11")
@pytest.mark.parametrize("mode", ["gradients", "adasum"])
def test_horovod_style_example_trains_under_torchrun(mode):
    # The same script, its import the only change from Horovod's, started by torchrun: sumo
    # joins torchrun's world (the processes of one host: sumo's shared memory).
    _run_horovod_example([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2"], mode)


# ---- the asynchronous forms and reduce-scatter of sumo's core -----------------------------

@pytest.mark.parametrize("op", [sumo.Sum, sumo.Average])
def test_reducescatter_against_the_sum(op):
    P = hvd.size()
    rows = 3 * P
    mine = torch.arange(rows * 5, dtype=torch.float32).view(rows, 5) + hvd.rank()
    whole = sum(torch.arange(rows * 5, dtype=torch.float32).view(rows, 5) + r for r in range(P))
    if op == sumo.Average:
        whole = whole / P
    want = whole[hvd.rank() * 3:(hvd.rank() + 1) * 3]
    assert torch.equal(hvd.reducescatter(mine, op=op), want)
    h = hvd.reducescatter_async(mine, op=op)
    got = hvd.synchronize(h)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.reducescatter(mine, op=sumo.Adasum)


def test_broadcast_async_in_order_with_allreduce():
    # Started back to back: the allreduce must complete before the broadcast reads the buffer.
    t = torch.full((64,), float(hvd.rank() + 1))
    h1 = hvd.allreduce_async_(t, op=sumo.Sum)
    h2 = hvd.broadcast_async_(t, root_rank=hvd.size() - 1)
    hvd.synchronize(h1)
    got = hvd.synchronize(h2)
    assert torch.equal(got, torch.full((64,), float(hvd.size() * (hvd.size() + 1) // 2)))
