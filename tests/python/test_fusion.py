"""Tensor fusion in sumo.torch: asynchronous allreduces packed into buffers by the order of
the calls, and DistributedOptimizer's Average and Sum overlapped with the backward pass,
against references written here (rank-order sums and means of every rank's data, which
each rank can compute because data is a function of the rank). Collective: every rank runs
the same tests in the same order."""
import contextlib

import pytest
import torch

import sumo
import sumo.torch as hvd
from sumo.torch import _fused

from test_torch import (F64, assert_close, assert_identical_across_ranks, loss_of, make_model,
                        params_of)



@contextlib.contextmanager
def threshold(nbytes):
    """The fusion threshold for one test (read once per process from the environment)."""
    was = _fused._fusion_threshold()
    _fused._fusion.threshold = nbytes
    try:
        yield
    finally:
        _fused._fusion.threshold = was


def mine(rank, k, n, dtype):
    g = torch.Generator().manual_seed(7919 * k + rank)
    return (torch.randn(n, generator=g) * 3).to(dtype)


# (count, dtype, op, prescale, postscale) of each call, in call order: dtypes and ops
# interleaved, sizes from 1 to 300 elements, some scaled.
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
CALLS = [(1 + (37 * k) % 300, DTYPES[k % 4], sumo.Sum if k % 3 else sumo.Average,
          0.5 if k % 5 == 0 else 1.0, 2.0 if k % 7 == 0 else 1.0) for k in range(48)]


def reference(k):
    """Rank-order sum (fp32 accumulation for 16-bit types, rounded once), as include/sumo.h
    defines Sum; Average divides it by size()."""
    n, dtype, op, pre, post = CALLS[k]
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    acc = None
    for r in range(hvd.size()):
        t = (mine(r, k, n, dtype) * pre).to(wide)
        acc = t if acc is None else acc + t
    if op == sumo.Average:
        acc = acc / hvd.size()
    return acc.to(dtype) * post


def buffers_by_the_rule(limit):
    """How many collectives the documented rule makes of CALLS when nothing waits before
    the last call: per (dtype, op) buffers filled in call order, one started when the next
    tensor would take it past the limit, or when it reaches the limit."""
    started, fill = 0, {}
    for n, dtype, op, _, _ in CALLS:
        nbytes = n * torch.empty(0, dtype=dtype).element_size()
        key = (dtype, op)
        if key in fill and fill[key] + nbytes > limit:
            started += 1
            del fill[key]
        fill[key] = fill.get(key, 0) + nbytes
        if fill[key] >= limit:
            started += 1
            del fill[key]
    return started + len(fill)


@pytest.mark.parametrize("limit", [0, 700, 64 << 20])
def test_fused_async_allreduces_equal_the_reference(limit):
    with threshold(limit):
        before = hvd.fusion_stats()
        inputs = [mine(hvd.rank(), k, n, dt) for k, (n, dt, _, _, _) in enumerate(CALLS)]
        handles = [hvd.allreduce_async(t, op=op, prescale_factor=pre, postscale_factor=post,
                                       name="t%d" % k)
                   for k, (t, (_, _, op, pre, post)) in enumerate(zip(inputs, CALLS))]
        # Waited for out of order: the first wait starts every open buffer.
        got = {k: hvd.synchronize(handles[k]) for k in reversed(range(len(CALLS)))}
        after = hvd.fusion_stats()
    assert after["tensors"] - before["tensors"] == len(CALLS)
    assert after["buffers"] - before["buffers"] == buffers_by_the_rule(limit)
    if limit >= 64 << 20:
        assert after["buffers"] - before["buffers"] == 8  # one per dtype and op
    for k, (n, dtype, op, pre, post) in enumerate(CALLS):
        assert got[k].dtype == dtype and got[k].shape == (n,)
        assert torch.equal(inputs[k], mine(hvd.rank(), k, n, dtype)), "the input was modified"
        ref = reference(k)
        if op == sumo.Sum:
            assert torch.equal(got[k], ref), k
        else:  # the division may round apart from torch's by one unit
            torch.testing.assert_close(got[k], ref, rtol=1e-2 if dtype in (
                torch.float16, torch.bfloat16) else 1e-6, atol=1e-6)
    assert_identical_across_ranks([got[k] for k in range(len(CALLS))])


def test_fused_gives_the_bits_of_one_collective_per_call():
    tensors = [mine(hvd.rank(), k, n, dt) for k, (n, dt, _, _, _) in enumerate(CALLS)]
    with threshold(0):
        alone = [hvd.synchronize(hvd.allreduce_async(t, op=c[2], prescale_factor=c[3],
                                                     postscale_factor=c[4]))
                 for t, c in zip(tensors, CALLS)]
    with threshold(1 << 20):
        in_place = [t.clone() for t in tensors]
        handles = [hvd.allreduce_async_(t, op=c[2], prescale_factor=c[3], postscale_factor=c[4])
                   for t, c in zip(in_place, CALLS)]
        while not hvd.poll(handles[3]):  # a poll starts the open buffers too
            pass
        fused = [hvd.synchronize(h) for h in handles]
    assert all(f is t for f, t in zip(fused, in_place))
    for a, f in zip(alone, fused):
        assert torch.equal(a, f)


def test_a_collective_starts_the_open_buffers_first():
    # An allreduce_async left open, then a blocking collective and a barrier: the open buffer
    # goes first on every rank, and the blocking one gets its own result.
    with threshold(1 << 20):
        before = hvd.fusion_stats()["buffers"]
        h = hvd.allreduce_async(torch.full((5,), float(hvd.rank() + 1)), op=sumo.Sum)
        total = hvd.allreduce(torch.ones(3), op=sumo.Sum)
        assert hvd.fusion_stats()["buffers"] == before + 1
        hvd.barrier()
        assert torch.equal(total, torch.full((3,), float(hvd.size())))
        P = hvd.size()
        assert torch.equal(hvd.synchronize(h), torch.full((5,), float(P * (P + 1) // 2)))


def test_fused_refusals_are_unchanged():
    with threshold(1 << 20):
        h = hvd.allreduce_async(torch.ones(4), op=sumo.Sum)
        with pytest.raises(ValueError, match="weight_t.*not contiguous"):
            hvd.allreduce_async_(torch.ones(3, 4).t(), name="weight_t")
        with pytest.raises(ValueError, match="op must be"):
            hvd.allreduce_async(torch.ones(2), op=7)
        with pytest.raises(ValueError, match="unknown handle"):
            hvd.synchronize(10 ** 9)
        # The refused calls left the open buffer as it was.
        assert torch.equal(hvd.synchronize(h), torch.full((4,), float(hvd.size())))
    assert_identical_across_ranks([torch.ones(1)])  # every rank still in step


def test_thresholds_read_from_the_environment(monkeypatch):
    def read(**env):
        for var in ("SUMO_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        _fused._fusion.threshold = None  # read again
        return _fused._fusion_threshold()
    was = _fused._fusion_threshold()
    try:
        assert read() == 64 << 20
        assert read(HOROVOD_FUSION_THRESHOLD="100") == 100      # Horovod's name alone
        assert read(HOROVOD_FUSION_THRESHOLD="100", SUMO_FUSION_THRESHOLD="0") == 0
        with pytest.raises(ValueError, match="SUMO_FUSION_THRESHOLD='64MB' is not a byte count"):
            read(SUMO_FUSION_THRESHOLD="64MB")
        with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD='-1' is not a byte count"):
            read(HOROVOD_FUSION_THRESHOLD="-1")
        # Ten 40-byte tensors under 100 bytes: 5 buffers of 2 (a third would pass it).
        read(HOROVOD_FUSION_THRESHOLD="100")
        before = hvd.fusion_stats()["buffers"]
        hs = [hvd.allreduce_async(torch.ones(10), op=sumo.Sum) for _ in range(10)]
        assert all(torch.equal(hvd.synchronize(h), torch.full((10,), float(hvd.size())))
                   for h in hs)
        assert hvd.fusion_stats()["buffers"] - before == 5
    finally:
        _fused._fusion.threshold = was


# ---- DistributedOptimizer: Average and Sum overlapped with the backward pass ------------------

def _train(op, overlap, passes, steps=2, cap=0.001):
    """Steps of SGD (lr 1) with `passes` backward passes each, in float64 (test_torch.py says
    why a comparison over steps is not made in float32); bucket_cap_mb=0.001 cuts the model's
    6 parameters (4.6 KB largest) into several buckets."""
    model = make_model(dtype=F64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   model.named_parameters(), op=op, overlap=overlap,
                                   backward_passes_per_step=passes, bucket_cap_mb=cap)
    grads = []
    for s in range(steps):
        opt.zero_grad()
        for k in range(passes):
            loss_of(model, hvd.rank(), passes * s + k).backward()
        opt.synchronize()
        grads.append([p.grad.clone() for p in model.parameters()])
        with opt.skip_synchronize():
            opt.step()
    return model, opt, grads


@pytest.mark.parametrize("op", [sumo.Average, sumo.Sum])
@pytest.mark.parametrize("passes", [1, 2])
def test_overlapped_average_equals_step_time_and_the_plain_mean(op, passes):
    model, opt, grads = _train(op, True, passes)
    assert opt.overlap and len(opt._buckets) > 1
    flat, _, flat_grads = _train(op, False, passes)
    # Overlapped and at step(): the same bits.
    assert all(torch.equal(a, b) for a, b in zip(params_of(model), params_of(flat)))
    assert all(torch.equal(a, b) for g, h in zip(grads, flat_grads) for a, b in zip(g, h))
    # Reference: every rank's gradient (its passes accumulated) from the same parameters,
    # summed in rank order (the mean: divided by size()), one SGD step at lr 1.
    ref = make_model(dtype=F64)
    for s in range(2):
        per_rank = []
        for r in range(hvd.size()):
            m = make_model(dtype=F64)
            m.load_state_dict(ref.state_dict())
            for k in range(passes):
                loss_of(m, r, passes * s + k).backward()
            per_rank.append([p.grad for p in m.parameters()])
        combined = [sum(g[j] for g in per_rank) for j in range(len(per_rank[0]))]
        if op == sumo.Average:
            combined = [c / hvd.size() for c in combined]
        assert_close(grads[s], combined)
        with torch.no_grad():
            for p, c in zip(ref.parameters(), combined):
                p -= c
    assert_close(params_of(model), params_of(ref))
    assert_identical_across_ranks(params_of(model))


def test_overlapped_average_starts_buckets_during_backward():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   model.named_parameters(), bucket_cap_mb=0.001)
    loss_of(model, hvd.rank(), 0).backward()
    # Every parameter got its gradient, so every bucket was started in the backward pass.
    assert opt._next == len(opt._buckets) and all(b.req is not None for b in opt._buckets)
    opt.step()
    assert all(b.req is None for b in opt._buckets)
    # A third pass with backward_passes_per_step=2 raises at step() on every rank.
    opt.set_backward_passes_per_step(2)
    for k in range(3):
        loss_of(model, hvd.rank(), k).backward()
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=2"):
        opt.step()


def test_overlapped_average_with_a_layer_some_ranks_skip():
    # The last layer's parameters get no gradient on rank 0 (zeros there, as at step()): its
    # bucket waits for step() on rank 0 and starts in backward elsewhere, in the same order.
    def run(overlap):
        model = make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       model.named_parameters(), overlap=overlap,
                                       bucket_cap_mb=0.001)
        opt.zero_grad()
        x, _ = torch.ones(4, 12) * (hvd.rank() + 1), None
        h = model[:4](x)
        out = h.sum() if hvd.rank() == 0 else model[4](h).sum()
        out.backward()
        opt.step()
        return model
    a, b = run(True), run(False)
    assert all(torch.equal(p, q) for p, q in zip(params_of(a), params_of(b)))
    assert_identical_across_ranks(params_of(a))
