"""sumo.torch.DiLoCo and StreamingDiLoCo against a float64 reference written here from the
papers (DiLoCo, arXiv 2311.08105; Streaming DiLoCo, arXiv 2501.18512) and against the C
library driven directly (build/tests/diloco_driver), under every launcher run.sh uses.

The local step of the parity tests is SGD at lr 0.5 on grad = delta / lr, which moves the
parameters by exactly delta (a power-of-two rate), so every rank's whole trajectory is known
to the reference without running a model. Every test is collective: all ranks run the same
tests in the same order."""
import math
import os
import shutil
import tempfile

import pytest
import torch

import sumo
import sumo.torch as st

from driver_files import floats_to_file, run_outer_driver
from reference import adasum_per_tensor

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SHAPES = [(37,), (2, 3), (4, 5), (9,), (4, 4)]
SIZES = [math.prod(s) for s in SHAPES]
N = sum(SIZES)
INNER_LR = 0.5
STEPS = 13

# name: (H, fragments (an int: the contiguous split; a list: fragment of each tensor; ("ranges",
#        F): F ranges of the flat vector, cutting tensors), delay, merge_alpha, outer,
#        outer_lr, outer_momentum, combine, quantize, block_size)
CONFIGS = {
    "diloco": (4, 1, 0, 0.0, "nesterov", 0.7, 0.9, "average", "none", 128),
    "heavy-ball": (3, 1, 0, 0.0, "heavy_ball", 1.0, 0.5, "average", "none", 128),
    "streaming-fp32": (6, 3, 1, 0.5, "nesterov", 0.7, 0.9, "average", "none", 128),
    "strided-delay2": (4, [0, 1, 0, 1, 0], 2, 0.3, "nesterov", 0.5, 0.8, "average", "none", 128),
    "bf16-F4": (4, 4, 1, 0.5, "nesterov", 0.7, 0.9, "average", "bf16", 8),
    "e4m3": (4, 2, 1, 0.0, "nesterov", 0.7, 0.9, "average", "e4m3", 16),
    "e3m0": (6, 3, 2, 0.5, "nesterov", 0.7, 0.9, "average", "e3m0", 8),
    "adasum": (4, 2, 1, 0.5, "nesterov", 0.7, 0.9, "adasum", "none", 128),
    "acga": (4, 2, 1, 0.5, "nesterov", 0.7, 0.9, "acga", "none", 128),
    "ranges-F6": (6, ("ranges", 6), 1, 0.5, "nesterov", 0.7, 0.9, "average", "none", 128),
    "ranges-e3m0": (4, ("ranges", 3), 1, 0.5, "nesterov", 0.7, 0.9, "average", "e3m0", 8),
}
_ENUM = {"nesterov": 0, "heavy_ball": 1, "average": 0, "adasum": 1, "acga": 2, "none": 0,
         "bf16": 1, "e4m3": 2, "e3m0": 3}


def inputs(steps=STEPS):
    start = torch.randn(N, generator=torch.Generator().manual_seed(11))
    deltas = [torch.randn(steps, N, generator=torch.Generator().manual_seed(100 + r)) * 0.01
              for r in range(st.size())]
    return start, deltas


def wrap(params, cfg, **kw):
    H, frags, delay, merge, outer, olr, mom, combine, quantize, block = cfg
    if isinstance(frags, tuple):
        kw["split"], frags = frags
    elif not isinstance(frags, int):
        frags = [[p for p, f in zip(params, frags) if f == g] for g in range(max(frags) + 1)]
    return st.DiLoCo(torch.optim.SGD(params, lr=INNER_LR), sync_every=H, fragments=frags,
                     delay=delay, merge_alpha=merge, outer=outer, outer_lr=olr,
                     outer_momentum=mom, combine=combine, quantize=quantize, block_size=block,
                     **kw)


def run_python(cfg, start, deltas, steps=STEPS):
    """This rank's parameters after `steps` local steps of its deltas under sumo.torch."""
    params, off = [], 0
    for shape, n in zip(SHAPES, SIZES):
        params.append(torch.nn.Parameter(start[off:off + n].clone().view(shape)))
        off += n
    opt = wrap(params, cfg)
    mine = deltas[st.rank()]
    for s in range(steps):
        off = 0
        for p, n in zip(params, SIZES):
            p.grad = (mine[s, off:off + n] / INNER_LR).view(p.shape).clone()
            off += n
        opt.step()
    out = torch.cat([p.detach().reshape(-1) for p in params])
    opt.close()
    return out


# ---- the float64 reference, from the papers ----------------------------------------------

def contiguous_split(F):
    """Fragments of whole tensors in model order (docs/design/diloco.md): fragment f closes at
    the first tensor boundary where the running count reaches ceil((f + 1) n / F), leaving a
    tensor for each later fragment."""
    T, out, t, count = len(SIZES), [], 0, 0
    for f in range(F):
        goal, tensors = -(-(f + 1) * N // F), []
        while t < T - (F - 1 - f):
            tensors.append(t)
            count += SIZES[t]
            t += 1
            if count >= goal and f < F - 1:
                break
        out.append(tensors)
    return out


def fragments_of(frags):
    if isinstance(frags, int):
        return contiguous_split(frags)
    return [[t for t, f in enumerate(frags) if f == g] for g in range(max(frags) + 1)]


def _grid(fmt):
    """The non-negative values of a scaled format, and its largest."""
    if fmt == "e3m0":  # sign, 3 exponent bits of bias 3, no mantissa; field 0 is zero
        vals = [0.0] + [2.0 ** (e - 3) for e in range(1, 8)]
    else:  # e4m3 (OCP FN): bias 7, subnormals, S.1111.111 is NaN
        vals = [m / 8 * 2.0 ** -6 for m in range(8)]
        vals += [(1 + m / 8) * 2.0 ** (e - 7) for e in range(1, 16) for m in range(8)
                 if (e, m) != (15, 7)]
    return torch.tensor(sorted(vals), dtype=torch.float64), max(vals)


def quantize(x, fmt, block):
    """x as the format carries it: bf16 rounds each element to 8 significant bits; e4m3 and
    e3m0 scale each block by the smallest power of two 2^s with max|x| <= largest 2^s and
    round |x| / 2^s to the nearest value of the format, a tie to the even code (averages of
    two ranks' grid values land on ties often)."""
    if fmt == "none":
        return x
    if fmt == "bf16":
        return x.to(torch.bfloat16).to(torch.float64)
    grid, largest = _grid(fmt)
    out = torch.empty_like(x)
    for a in range(0, x.numel(), block):
        b = x[a:a + block]
        amax = float(b.abs().max())
        if amax == 0:
            out[a:a + block] = 0
            continue
        s = math.ceil(math.log2(amax / largest))
        while amax > largest * 2.0 ** s:
            s += 1
        while amax <= largest * 2.0 ** (s - 1):
            s -= 1
        dist = ((b.abs() / 2.0 ** s).unsqueeze(1) - grid).abs()
        i = dist.argmin(dim=1)  # the lower of two at a tie
        # A tie goes to the even code; the grid is in code order.
        up = (i % 2 == 1) & (i + 1 < len(grid))
        up &= dist.gather(1, (i + 1).clamp(max=len(grid) - 1).unsqueeze(1)).squeeze(1) == \
            dist.gather(1, i.unsqueeze(1)).squeeze(1)
        out[a:a + block] = torch.sign(b) * grid[i + up.long()] * 2.0 ** s
    return out


def store(x):
    """x as a float32 tensor holds it."""
    return x.to(torch.float32).to(torch.float64)


def reference(cfg, start, deltas, steps=STEPS):
    """Every rank's parameters after `steps` steps, in float64: each rank moves by its deltas;
    fragment f's outer gradient Delta = combine_r(anchor_f - theta_r,f) is formed at the end
    of steps floor((f + 1) H / F) + j H and applied `delay` steps later: the outer step from
    the anchor gives the new anchor g, and the fragment becomes alpha theta + (1 - alpha) g.
    The arithmetic is float64, but what the parameters' dtype holds (parameters, anchors,
    momenta, each Delta_r, a compressed sum) is rounded to float32 where it is stored, as the
    design fixes (docs/design/diloco.md): without that a Delta near a bf16 or e3m0 rounding
    boundary lands on the other side, one step of the format apart."""
    H, frags, delay, alpha, outer, lr, mu, combine, fmt, block = cfg
    P = len(deltas)
    tensors = fragments_of(frags)
    F = len(tensors)
    offs = [sum(SIZES[:t]) for t in range(len(SIZES))]
    index = [torch.cat([torch.arange(offs[t], offs[t] + SIZES[t]) for t in ts]) for ts in tensors]
    first = [(f + 1) * H // F for f in range(F)]
    theta = [start.to(torch.float64).clone() for _ in range(P)]
    anchor = start.to(torch.float64).clone()
    v = torch.zeros(N, dtype=torch.float64)
    pending = None

    def apply(f, D):
        i = index[f]
        if outer == "nesterov":
            m = mu * v[i] + D
            g = anchor[i] - lr * (D + mu * m)
        else:  # SlowMo's heavy ball, gamma the inner rate
            m = mu * v[i] + D / INNER_LR
            g = anchor[i] - lr * INNER_LR * m
        v[i], anchor[i] = store(m), store(g)
        for r in range(P):
            theta[r][i] = store(alpha * theta[r][i] + (1 - alpha) * anchor[i])

    for k in range(1, steps + 1):
        for r in range(P):
            theta[r] = store(theta[r] - deltas[r][k - 1].to(torch.float64))
        if pending is not None and pending[1] == k:
            apply(pending[0], pending[2])
            pending = None
        starts = [f for f in range(F) if (k - first[f]) % H == 0 and k >= first[f]]
        if starts:
            f = starts[0]
            i = index[f]
            d = [store(anchor[i] - theta[r][i]) for r in range(P)]
            if combine == "adasum":  # per tensor of the fragment
                pieces, at = [], 0
                for t in tensors[f]:
                    pieces.append(at)
                    at += SIZES[t]
                per_rank = [[x[a:a + SIZES[t]] for a, t in zip(pieces, tensors[f])] for x in d]
                D = torch.cat(adasum_per_tensor(per_rank))
            elif fmt == "none":
                D = sum(d) / P
            else:  # each rank's share decoded, summed in fp32 in rank order, divided once
                total = torch.zeros_like(d[0])
                for x in d:
                    total = store(total + quantize(x, fmt, block))
                D = quantize(store(total / P), fmt, block)
            if delay == 0:
                apply(f, D)
            else:
                pending = (f, k + delay, D)
    return theta


# Observed on this data after 13 steps (3 or 4 outer steps a fragment), P 1 to 3: at most
# 7.2e-7, the fp32 parameter average (sumo's) against the float64 one, a few float32 ulps of
# values near 4; the quantized and one-rank runs match exactly. The tolerance is about 3x
# that, far below one local step's change (0.01) or a step of bf16, e4m3 or e3m0.
# Unlike a comparison of two trainings of a model, this one cannot flip with the CPU: the
# deltas are data, not gradients of a model whose ReLUs could switch. The one step that is
# not continuous, the rounding of the quantized rows to their grid, takes elementwise sums
# and products, correctly rounded whatever the CPU's vector width, so their exact agreement
# is the same on every CPU; Adasum's dot products follow the vector width, but only move its
# unquantized row by a few roundings, as the average's 7.2e-7.
TOL = 2e-6


@pytest.mark.parametrize("name", [n for n in CONFIGS
                                  if n != "acga" and not isinstance(CONFIGS[n][1], tuple)])
def test_equals_float64_reference(name):
    cfg = CONFIGS[name]
    start, deltas = inputs()
    got = run_python(cfg, start, deltas).to(torch.float64)
    want = reference(cfg, start, deltas)[st.rank()]
    err = float((got - want).abs().max())
    assert err <= TOL, "%s: |sumo - float64 reference| = %.3g > %g" % (name, err, TOL)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_python_and_c_give_the_same_bits(name):
    cfg = CONFIGS[name]
    H, frags, delay, merge, outer, olr, mom, combine, fmt, block = cfg
    start, deltas = inputs()
    got = run_python(cfg, start, deltas)
    folder = st.broadcast_object(tempfile.mkdtemp(prefix="sumo-diloco-") if st.rank() == 0 else None)
    try:
        floats_to_file(got, os.path.join(folder, "py.%d" % st.rank()))
        st.barrier()
        ok = torch.zeros(1, dtype=torch.float64)
        if st.rank() == 0:
            ranges = isinstance(frags, tuple)
            F = frags[1] if ranges else frags if isinstance(frags, int) else max(frags) + 1
            # ... the inner lr, no inner averaging, unsharded, the split.
            options = [H, F, delay, merge, _ENUM[outer], olr, mom, _ENUM[combine], _ENUM[fmt],
                       block, INNER_LR, 0, 0, int(ranges)]
            c = run_outer_driver(folder, SIZES, None if isinstance(frags, (int, tuple)) else frags,
                                 options, STEPS, start, deltas)
            ok[0] = float(all(open(os.path.join(folder, "py.%d" % r), "rb").read() ==
                              c[r * N * 4:(r + 1) * N * 4] for r in range(st.size())))
        st.broadcast_(ok, 0)
        assert ok.item() == 1, "%s: sumo.torch.DiLoCo and the C sumo_diloco differ" % name
    finally:
        st.barrier()
        if st.rank() == 0:
            shutil.rmtree(folder, ignore_errors=True)


# ---- on a model: ranks, checkpoints, communication ------------------------------------------

def make_model(seed=0, hidden=16):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 5))


def loss_of(model, rank, step, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(n, 12, generator=g), torch.randint(0, 5, (n,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def train(model, opt, first, last):
    for s in range(first, last):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def identical_across_ranks(t):
    t = t.to(torch.float64) if t.is_floating_point() else t
    root = t.clone()
    st.broadcast_(root, 0)
    differ = torch.tensor([0.0 if torch.equal(t, root) else 1.0], dtype=torch.float64)
    st.allreduce_(differ, op=sumo.Sum)
    return differ.item() == 0


def blob_tensor(blob):
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(torch.float64)


def test_ranks_bit_identical():
    # DiLoCo (F 1, merge 0): every rank holds the same parameters after each outer step.
    model = make_model()
    opt = st.DiLoCo(torch.optim.AdamW(model.parameters(), lr=0.01), sync_every=3)
    train(model, opt, 0, 6)
    assert opt.synchronized
    assert identical_across_ranks(flat(model))
    # Streaming with merge 0.5 keeps local parts apart, but the outer state (anchors, momenta,
    # the exchange's result) is the same bits on every rank.
    model = make_model()
    opt = st.StreamingDiLoCo(torch.optim.AdamW(model.parameters(), lr=0.01), sync_every=6,
                             fragments=3, delay=1, block_size=16)
    train(model, opt, 0, 10)
    assert identical_across_ranks(blob_tensor(opt.state_dict()["diloco"]["state"]))
    assert opt.stats()["rounds"] == 5  # fragments start at 2, 4, 6, 8, 10


@pytest.mark.parametrize("quantize", ["none", "e3m0"])
def test_resume_mid_schedule_equals_uninterrupted(quantize):
    # H 6, F 2 (syncs at 3, 6, 9, ...), delay 2: stopping after steps 3, 4, 6, 7 leaves an
    # exchange in flight, which the checkpoint keeps and the resumed run applies.
    steps = 11
    kw = dict(sync_every=6, fragments=2, delay=2, merge_alpha=0.5, quantize=quantize,
              block_size=16)
    model = make_model()
    opt = st.StreamingDiLoCo(torch.optim.Adam(model.parameters(), lr=0.01), **kw)
    train(model, opt, 0, steps)
    whole = flat(model)
    in_flight = 0
    for stop in range(1, steps):
        model = make_model()
        opt = st.StreamingDiLoCo(torch.optim.Adam(model.parameters(), lr=0.01), **kw)
        train(model, opt, 0, stop)
        in_flight += bool(opt._due()[0] & 1)  # the next step applies an earlier exchange
        saved = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                 "opt": opt.state_dict()}
        opt.close()
        # A fresh process would start here: another model, another optimizer.
        model = make_model(seed=1)
        opt = st.StreamingDiLoCo(torch.optim.Adam(model.parameters(), lr=0.01), **kw)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        train(model, opt, stop, steps)
        assert torch.equal(flat(model), whole), "resumed after step %d differs" % stop
        opt.close()
    assert in_flight >= 2


def test_local_steps_do_not_communicate():
    model = make_model()
    opt = st.StreamingDiLoCo(torch.optim.SGD(model.parameters(), lr=0.05), sync_every=40,
                             fragments=2, delay=1)
    # Rank 0 takes its local steps while the others wait in an allreduce: a collective in a
    # local step would meet that allreduce (a mismatch, or a wrong sum) instead; and no
    # sumo.torch collective is recorded on the timeline during local steps.
    t = torch.full((3,), float(st.rank() + 1), dtype=torch.float64)
    st.take_timeline()
    if st.rank() == 0:
        train(model, opt, 0, 5)
        quiet = st.take_timeline() == []
    st.allreduce_(t, op=sumo.Sum)
    st.take_timeline()
    if st.rank() != 0:
        train(model, opt, 0, 5)
        quiet = st.take_timeline() == []
    assert t.tolist() == [st.size() * (st.size() + 1) / 2] * 3
    loud = torch.tensor([0.0 if quiet else 1.0], dtype=torch.float64)
    st.allreduce_(loud, op=sumo.Sum)
    assert loud.item() == 0, "a local step used a sumo.torch collective"
    assert opt.stats()["rounds"] == 0
    train(model, opt, 5, 20)  # fragment 0 starts at the end of step 20
    assert opt.stats()["rounds"] == 1


# ---- refusals -------------------------------------------------------------------------------

def _sgd(model=None):
    return torch.optim.SGD((model or make_model()).parameters(), lr=0.1)


@pytest.mark.parametrize("kw,match", [
    (dict(preset="adam"), "preset must be one of"),
    (dict(outer="adam"), "outer must be one of"),
    (dict(combine="median"), "combine must be one of"),
    (dict(quantize="int4"), "quantize must be one of"),
    (dict(sync_every=0), "sync_every"),
    (dict(sync_every=4, fragments=5), "fragments"),
    (dict(sync_every=12, fragments=7), "number of tensors"),
    (dict(sync_every=8, fragments=2, delay=5), "delay"),
    (dict(merge_alpha=1.5), "merge_alpha"),
    (dict(outer_lr=0.0), "lr"),
    (dict(outer_momentum=1.0), "momentum"),
    (dict(combine="adasum", quantize="e3m0"), "compression"),
    (dict(quantize="e3m0", block_size=12), "block"),
])
def test_bad_options_raise_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        st.DiLoCo(_sgd(), **kw)
    # The communicator is still usable.
    t = torch.ones(1)
    st.allreduce_(t, op=sumo.Sum)
    assert t.item() == st.size()


def test_bad_parameters_and_splits_raise():
    model = make_model()
    with pytest.raises(TypeError, match="float32 or float64"):
        st.DiLoCo(torch.optim.SGD(make_model().half().parameters(), lr=0.1))
    mixed = make_model()
    mixed[4].double()
    with pytest.raises(TypeError, match="mix"):
        st.DiLoCo(torch.optim.SGD(mixed.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="compression|fp32"):
        st.DiLoCo(torch.optim.SGD(make_model().double().parameters(), lr=0.1), quantize="bf16")
    with pytest.raises(ValueError, match="in no fragment"):
        st.DiLoCo(_sgd(model), fragments=[model[0], model[2]])
    with pytest.raises(ValueError, match="in fragments 0 and 1"):
        st.DiLoCo(_sgd(model), fragments=[model[0], model[0].weight, [model[2].weight,
                                                                       model[2].bias, model[4]]])
    # The paper's strided split is accepted.
    layers = [model[0], model[2], model[4]]
    opt = st.DiLoCo(_sgd(model), sync_every=4, fragments=[layers[0::2], layers[1::2]])
    assert opt.fragments == 2 and opt._frag_tensors == [[0, 1, 4, 5], [2, 3]]
    opt.close()


def test_mismatched_models_raise_on_every_rank():
    if st.size() == 1:
        pytest.skip("needs two ranks")
    model = make_model(hidden=8 + st.rank())
    with pytest.raises(sumo.SumoError, match="SUMO_ERR_MISMATCH"):
        st.DiLoCo(_sgd(model), sync_every=4)
    # Same model, other options on one rank: refused alike.
    with pytest.raises(sumo.SumoError, match="SUMO_ERR_MISMATCH"):
        st.DiLoCo(_sgd(), sync_every=4 + (st.rank() == 1))


@pytest.mark.parametrize("quantize", ["none", "bf16"])
def test_nonfinite_values_raise_on_every_rank(quantize):
    # The last rank's parameters go NaN during local steps: its outer exchange carries them,
    # and every rank raises at the outer step, on the same step.
    model = make_model()
    opt = st.DiLoCo(_sgd(model), sync_every=3, quantize=quantize)
    train(model, opt, 0, 1)
    if st.rank() == st.size() - 1:
        with torch.no_grad():
            model[2].weight[0, 0] = float("nan")
    train(model, opt, 1, 2)
    with pytest.raises(sumo.SumoError, match="SUMO_ERR_NONFINITE"):
        train(model, opt, 2, 3)


def test_nonfinite_gradients_are_skipped_where_they_happen():
    model = make_model()
    opt = st.DiLoCo(_sgd(model), sync_every=4)
    for s in range(8):
        opt.zero_grad()
        loss_of(model, st.rank(), s).backward()
        if s == 2 and st.rank() == st.size() - 1:
            model[0].weight.grad[0, 0] = float("inf")
        opt.step()
    last = st.rank() == st.size() - 1
    assert opt.skipped == (1 if last else 0) and opt.steps == (7 if last else 8)
    assert identical_across_ranks(flat(model))


def test_heavy_ball_refuses_lr_zero_at_an_exchange_and_other_states():
    model = make_model()
    opt = st.DiLoCo(torch.optim.SGD(model.parameters(), lr=0.0), sync_every=2,
                    preset="slowmo")
    train(model, opt, 0, 1)  # a local step at lr 0 is fine
    with pytest.raises(ValueError, match="divides by the rate"):
        train(model, opt, 1, 2)
    other = st.DiLoCo(_sgd(), sync_every=3)
    with pytest.raises(sumo.SumoError, match="INVALID_ARGUMENT"):
        other.load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="not a DiLoCo state"):
        other.load_state_dict({"optimizer": {}})


def test_huge_finite_gradients_are_not_skipped():
    # float64 gradients whose sum overflows are finite all the same: the step is taken.
    model = make_model().double()
    opt = st.DiLoCo(torch.optim.SGD(model.parameters(), lr=0.0), sync_every=4)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e308)
    opt.step()
    assert opt.skipped == 0 and opt.steps == 1
    model[0].weight.grad[0, 0] = float("nan")
    opt.step()
    assert opt.skipped == 1 and opt.steps == 1
    opt.close()
