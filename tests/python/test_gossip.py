"""sumo.torch's gossip: SlowMoDistributedDataParallel over SGP and OSGP against SlowMo's
Algorithm 1 with the gossip base written here in float64 (every rank computes every rank's
run: the local SGD steps, the push-sum rounds over the exponential graph, the exact average
and the slow momentum step), and the DDP gossip hook against push-sum rounds. One rank: the
gossip base has no round (the reference's rounds then give each rank back its own value), and
the hook refuses by name (a round needs a peer). Collective: every rank runs every test."""
import pytest
import torch

import sumo.torch as st

STEPS = 9
LR = 0.1


def make_model():
    torch.manual_seed(3)
    return torch.nn.Linear(4, 3).to(torch.float64)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(8, 4, generator=g, dtype=torch.float64),
            torch.randn(8, 3, generator=g, dtype=torch.float64))


def loss_fn(model, rank, step):
    x, y = batch(rank, step)
    return 0.5 * ((model(x) - y) ** 2).mean()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def grad_at(z, rank, step):
    """The gradient of rank's loss at the flat parameters z (autograd on a copy)."""
    m = make_model()
    with torch.no_grad():
        off = 0
        for p in m.parameters():
            p.copy_(z[off:off + p.numel()].view_as(p))
            off += p.numel()
    loss_fn(m, rank, step).backward()
    return torch.cat([p.grad.reshape(-1) for p in m.parameters()])


def offset_of(n, k):
    """The exponential graph's offset in round k with one peer: 2^(k mod (K + 1))."""
    K = 0
    while (1 << (K + 1)) <= n - 1:
        K += 1
    return 1 << (k % (K + 1))


def reference(base, n, tau, alpha, beta, L=1):
    """Every rank's parameters z = X / W after each step, in float64. L > 1 (SGP): nodes of L
    ranks average, then the n / L nodes gossip."""
    x0 = flat(make_model()).clone()
    X = [x0.clone() for _ in range(n)]
    W = [1.0] * n
    u = torch.zeros_like(x0)
    sent, sw = [None] * n, [0.0] * n
    flight, k, out = False, 0, []
    for t in range(1, STEPS + 1):
        # The local step on z = X / W moves the numerator.
        for r in range(n):
            X[r] = X[r] - LR * grad_at(X[r] / W[r], r, t - 1)
        sync = t % tau == 0
        if base == "sgp":
            H = n // L
            node = [sum(X[h * L + l] for l in range(L)) / L for h in range(H)]
            off = offset_of(H, k)
            k += 1
            node = [node[h] / 2 + node[(h - off) % H] / 2 for h in range(H)]
            X = [node[r // L].clone() for r in range(n)]
        else:  # OSGP, staleness 1: a round's shares arrive one step later
            if flight:
                off = offset_of(n, k - 1)
                X = [X[r] + sent[(r - off) % n] for r in range(n)]
                W = [W[r] + sw[(r - off) % n] for r in range(n)]
                flight = False
            if not sync:
                X = [x / 2 for x in X]
                W = [w / 2 for w in W]
                sent, sw = list(X), list(W)
                flight, k = True, k + 1
        if sync:
            avg = sum(X[r] / W[r] for r in range(n)) / n
            u = beta * u + (x0 - avg) / LR
            x0 = x0 - alpha * LR * u
            X, W = [x0.clone() for _ in range(n)], [1.0] * n
        out.append([X[r] / W[r] for r in range(n)])
    return out


def all_true(ok):
    t = torch.tensor([0.0 if ok else 1.0], dtype=torch.float64)
    st.allreduce_(t, op=st.Sum)
    return t.item() == 0


@pytest.mark.parametrize("base", ["sgp", "osgp"])
def test_slowmo_ddp_equals_float64_reference(base):
    n = st.size()
    model = st.SlowMoDistributedDataParallel(
        make_model(), nprocs_per_node=1, slowmo_base_algorithm=st.SlowMoBaseAlgorithm.SGP,
        overlap=base == "osgp", slowmo_frequency=4, slowmo_lr=1.0, slowmo_momentum=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref = reference(base, n, 4, 1.0, 0.5)
    worst = 0.0
    for t in range(STEPS):
        opt.zero_grad()
        loss_fn(model, st.rank(), t).backward()
        opt.step()
        model.perform_slowmo(opt)
        worst = max(worst, (flat(model) - ref[t][st.rank()]).abs().max().item())
    stats = model.stats()
    model.close()
    assert all_true(worst < 1e-12), "worst difference %g" % worst
    if n > 1:  # the gossip rounds (one a step but at the averages for OSGP) and 2 averages
        assert stats["rounds"] == (STEPS if base == "sgp" else STEPS - 2) + 2, stats


def test_slowmo_ddp_per_node_equals_float64_reference():
    # On a two-level communicator (hosts of L ranks: SUMO_LOCAL_SIZE under torchrun, or real
    # hosts) with at least 2 of them; elsewhere nprocs_per_node > 1 is refused by name.
    n, L = st.size(), st.local_size()
    two_level = L > 1 and n % L == 0 and n // L >= 2 and st.transport() == "hierarchical"
    kw = dict(nprocs_per_node=max(L, 2), slowmo_base_algorithm="sgp", slowmo_frequency=4,
              slowmo_lr=1.0, slowmo_momentum=0.5)
    if not two_level:
        model = st.SlowMoDistributedDataParallel(make_model(), **kw)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        with pytest.raises(ValueError, match="nprocs_per_node|two-level|no peer"):
            model.perform_slowmo(opt)
        return
    model = st.SlowMoDistributedDataParallel(make_model(), **kw)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref = reference("sgp", n, 4, 1.0, 0.5, L=L)
    worst = 0.0
    for t in range(STEPS):
        opt.zero_grad()
        loss_fn(model, st.rank(), t).backward()
        opt.step()
        model.perform_slowmo(opt)
        worst = max(worst, (flat(model) - ref[t][st.rank()]).abs().max().item())
    model.close()
    assert all_true(worst < 1e-12), "worst difference %g" % worst


def test_fairscale_names_and_refusals():
    model = st.SlowMoDistributedDataParallel(make_model(), nprocs_per_node=1)
    assert model.slowmo_base_algorithm == "localsgd"
    assert (model.localsgd_frequency, model.slowmo_frequency) == (3, 48)
    assert (model.slowmo_lr, model.slowmo_momentum) == (1.0, 0.5)
    with pytest.raises(ValueError, match="slowmo_base_algorithm"):
        st.SlowMoDistributedDataParallel(make_model(), slowmo_base_algorithm="adam")
    with pytest.raises(ValueError, match="overlap needs the SGP base"):
        st.SlowMoDistributedDataParallel(make_model(), overlap=True,
                                         slowmo_base_algorithm="dpsgd")
    opt = torch.optim.SGD(make_model().parameters(), lr=LR)
    with pytest.raises(ValueError, match="nprocs_per_node > 1 needs a gossip base"):
        st.SlowMo(opt, nprocs_per_node=2)


class _Bucket:
    """What the hook reads of a dist.GradBucket."""

    def __init__(self, buf):
        self._buf = buf

    def buffer(self):
        return self._buf

    def index(self):
        return 0


def test_gossip_hook_is_one_push_sum_round():
    n, r = st.size(), st.rank()
    state = st.GossipHookState()
    grads = [torch.randn(50, generator=torch.Generator().manual_seed(40 + q),
                         dtype=torch.float64) for q in range(n)]
    if n == 1:
        with pytest.raises(Exception, match="no peer"):
            st.gossip_hook(state, _Bucket(grads[0].clone())).wait()
        state.close()
        return
    ok = True
    want = list(grads)
    buf = grads[r].clone()
    for k in range(3):
        got = st.gossip_hook(state, _Bucket(buf)).wait()
        off = offset_of(n, k)
        want = [want[q] / 2 + want[(q - off) % n] / 2 for q in range(n)]
        ok = ok and (got - want[r]).abs().max().item() < 1e-14
    state.close()
    assert all_true(ok)
