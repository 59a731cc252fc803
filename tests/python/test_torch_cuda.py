"""sumo.torch on CUDA tensors.

On the host (everywhere): the refusals (a transport that moves host memory only, no
libsumo_cuda or no device, tensors of two devices in one call), the NCCL id's rendezvous
through a store, and the plumbing of the CUDA path: tensors that say they are on cuda:0 but
hold host memory (Mock, below) go through every CUDA branch of the binding, with the stream
it would pass recorded, and the results must equal the CPU path's bit for bit (the host
kernels run them). On a device (skipped with one line without one): the same calls on real
CUDA tensors against the CPU path, sum and average bit for bit, Adasum in float64 within the
rounding bound, the DDP hooks, DistributedOptimizer and DiLoCo.

Every test is collective where it runs one (all ranks, same order)."""
import copy
import threading

import pytest
import torch
import torch.distributed as dist

import sumo
import sumo.torch as st
from sumo import _lib
from sumo.torch import _calls, _cuda, _init, _runtime as rt, _tensors
from sumo.torch import hooks as sumo_hooks

HAVE_CUDA = torch.cuda.is_available()
needs_device = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device for torch "
                                  "(torch.cuda.is_available() is False)")


def one_rank(test):
    """A refusal that fails the communicator (sumo_comm_fail for the peers): one rank only."""
    import functools

    @functools.wraps(test)
    def run(*a, **kw):
        if st.size() != 1:
            pytest.skip("a refusal that fails the communicator's peers: one rank only")
        return test(*a, **kw)
    return run


class Mock(torch.Tensor):
    """A host tensor that says it is on cuda:0: the binding takes its CUDA branches, and the
    host kernels (which claim its memory) compute."""

    @property
    def device(self):
        return torch.device("cuda", 0)

    @property
    def is_cuda(self):
        return True


def mock(t):
    return t.clone().as_subclass(Mock)


FAKE_STREAM = 0x5eed0  # what current_stream reports for Mock tensors


@pytest.fixture
def cuda_mocked(monkeypatch):
    """The CUDA path on host memory: no kernels object (the host table claims the memory),
    a made-up current stream that is recorded and then replaced by NULL for the C call (the
    host kernels are handed no stream), futures without devices."""
    calls = []
    real = _calls.collective
    if rt.state.transport == "hierarchical":
        # The calls reach the two-level communicator as they are, as the CPU path's do (its
        # NCCL level and hierarchical Adasum for CUDA buffers: the test below).
        monkeypatch.setattr(rt.state, "transport", "tcp")

    def spy(kind, send, recv, count, dtype, stream, op=0, root=0, request=None):
        calls.append((kind, getattr(send, "value", send), stream))
        return real(kind, send, recv, count, dtype, 0, op=op, root=root, request=request)

    monkeypatch.setattr(_cuda, "cuda_ready", lambda t, name: None)
    monkeypatch.setattr(_cuda, "current_stream",
                        lambda t: FAKE_STREAM if t.device.type == "cuda" else 0)
    monkeypatch.setattr(_cuda, "legacy_ready", lambda t: None)
    monkeypatch.setattr(_cuda, "inputs_ready", lambda t: None)
    monkeypatch.setattr(_cuda, "inputs_event", lambda t: None)
    monkeypatch.setattr(_cuda, "future_devices", lambda t: None)
    monkeypatch.setattr(_calls, "collective", spy)
    return calls


def data(seed, n=37, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * seed + st.rank())
    return torch.randn(n, generator=g).to(dtype)


def same_bits(a, b):
    a, b = torch.Tensor(a).detach(), torch.Tensor(b).detach()  # plain tensors again
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(-1).view(torch.uint8) if a.numel() else a,
        b.contiguous().view(-1).view(torch.uint8) if b.numel() else b)


# ---- refusals -------------------------------------------------------------------------------

def test_cuda_tensor_on_a_host_transport_refused_by_name(monkeypatch):
    monkeypatch.setattr(rt.state, "transport", "group")
    t = mock(torch.ones(4))
    with pytest.raises(ValueError, match=r"tensor grads\.w is on cuda:0; the group transport "
                                         r"moves host memory only.*transport=\"nccl\""):
        _tensors.tensor_args(t, "grads.w")


def test_cuda_tensor_on_the_shm_transport_is_taken(monkeypatch):
    """The shared-memory transport (torchrun's processes on one node) takes CUDA tensors
    through CUDA IPC: no refusal by transport; without a device, the device's own reason."""
    assert "shm" in _cuda.CUDA_TRANSPORTS
    monkeypatch.setattr(rt.state, "transport", "shm")
    t = mock(torch.ones(4))
    if HAVE_CUDA:
        pytest.skip("a CUDA device is present (the shm transport on it: gpu-check.sh)")
    with pytest.raises(ValueError) as e:
        _tensors.tensor_args(t, "grads.w")
    assert "moves host memory only" not in str(e.value)
    assert "tensor grads.w is on cuda:0: " in str(e.value)


def test_shm_cuda_inputs_are_waited_for(monkeypatch):
    """On the shm transport the peers read a CUDA tensor from their own processes: the
    current stream is synchronised before the call (as for NCCL), never on a CPU tensor."""
    calls = []

    class Stream:
        cuda_stream = 0

        def synchronize(self):
            calls.append("sync")

    monkeypatch.setattr(rt.state, "transport", "shm")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    _cuda.inputs_ready(mock(torch.ones(4)))
    _cuda.legacy_ready(mock(torch.ones(4)))
    _cuda.inputs_ready(torch.ones(4))
    assert calls == ["sync", "sync"]


@one_rank
def test_cuda_tensor_without_device_or_library_is_a_clear_error():
    """Here: libsumo_cuda built, no device -> the reason sumo_cuda_device_count gives; not
    built -> that it is not built. Never a crash, always the tensor's name."""
    if HAVE_CUDA:
        pytest.skip("a CUDA device is present: its tensors are taken")
    t = mock(torch.ones(4))
    with pytest.raises(ValueError, match=r"tensor weights\.grad is on cuda:0: ") as e:
        st.allreduce_(t, name="weights.grad", op=sumo.Sum)
    msg = str(e.value)
    if _lib.os.path.exists(_lib.CUDA_LIBRARY):
        assert "sumo_cuda_kernels_create(0) failed" in msg and "no CUDA device" in msg, msg
    else:
        assert "libsumo_cuda is not built" in msg, msg


def test_mixed_devices_refused_naming_both():
    a, b = torch.ones(3), mock(torch.ones(3))
    with pytest.raises(ValueError, match=r"grouped allreduce of grads mixes devices: grads\[0\] "
                                         r"is on cpu and grads\[1\] on cuda:0"):
        st.grouped_allreduce_([a, b], name="grads", op=sumo.Sum)
    with pytest.raises(ValueError, match=r"mixes devices: w is on cpu and b on cuda:0"):
        st.broadcast_parameters([("w", a), ("b", b)], root_rank=0)


def test_distributed_optimizer_refuses_mixed_parameters():
    w = torch.zeros(3, requires_grad=True)
    b = mock(torch.zeros(2)).requires_grad_()
    opt = torch.optim.SGD([w, b], lr=0.1)
    with pytest.raises(ValueError, match=r"DistributedOptimizer's parameters mixes devices: "
                                         r"w is on cpu and b on cuda:0"):
        st.DistributedOptimizer(opt, named_parameters=[("w", w), ("b", b)], op=sumo.Adasum)


@one_rank
def test_diloco_refuses_mixed_parameters():
    w = torch.zeros(3, requires_grad=True)
    b = mock(torch.zeros(2)).requires_grad_()
    opt = torch.optim.SGD([w, b], lr=0.1)
    with pytest.raises(ValueError, match=r"the parameters mix devices: param_groups\[0\]"
                                         r"\.params\[0\] is on cpu and param_groups\[0\]"
                                         r"\.params\[1\] on cuda:0"):
        st.DiLoCo(opt, sync_every=2)


def test_acga_hook_refuses_a_cuda_bucket(monkeypatch):
    monkeypatch.setattr(rt, "fail_together", lambda e, code=None: (_ for _ in ()).throw(e))
    state = st.HookState()
    with pytest.raises(ValueError, match=r"bucket 0 \(ACGA\) is on cuda:0; the ACGA hook"):
        sumo_hooks.acga_hook(state, _Bucket(0, mock(torch.ones(5)), [5]))
    state.close()


def test_init_refuses_an_unknown_transport_naming_nccl():
    with pytest.raises(ValueError, match="'hierarchical', 'nccl' or 'threads'"):
        saved, rt.state.comm = rt.state.comm, None
        try:
            st.init(transport="infiniband")
        finally:
            rt.state.comm = saved


# ---- the NCCL id through the store ----------------------------------------------------------

def test_nccl_rendezvous_shares_rank0s_id_through_the_store():
    """Four ranks as threads on one store: rank 0 makes the id, every rank ends with its
    bytes; the others wait for it (they start first here)."""
    store = dist.HashStore()
    made = []

    def make():
        made.append(bytes(range(128)))
        return made[-1]

    got = [None] * 4
    errors = []

    def rank(r):
        try:
            got[r] = _cuda.nccl_rendezvous(store, "sumo/test/1/nccl_id", r, make, 30)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (3, 2, 1)]
    for t in threads:
        t.start()
    rank(0)
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(made) == 1
    assert got == [made[0]] * 4


def test_nccl_rendezvous_refuses_an_id_of_another_size():
    store = dist.HashStore()
    store.set("k", b"short")
    with pytest.raises(RuntimeError,
                       match="the store holds 5 bytes under k, not an NCCL id of 128"):
        _cuda.nccl_rendezvous(store, "k", 1, None, 5)
    with pytest.raises(RuntimeError, match="an NCCL id of 3 bytes, not 128"):
        _cuda.nccl_rendezvous(dist.HashStore(), "k", 0, lambda: b"abc", 5)


def test_nccl_rendezvous_times_out_without_rank0():
    with pytest.raises(Exception, match="(?i)timeout|timed out|deadline"):
        _cuda.nccl_rendezvous(dist.HashStore(), "never", 1, None, 0.2)


def test_nccl_transport_without_a_device_says_why():
    if HAVE_CUDA:
        pytest.skip("a CUDA device is present (the NCCL transport is checked by gpu-check.sh)")
    saved, rt.state.comm = rt.state.comm, None
    try:
        with pytest.raises(RuntimeError,
                           match=r"transport 'nccl' needs (libsumo_cuda|a CUDA device)"):
            _init._init_nccl(None)
    finally:
        rt.state.comm = saved


# ---- the CUDA path's plumbing, on host memory ------------------------------------------------

def test_cuda_on_the_two_level_communicator_adds_nccl_and_takes_hierarchical_adasum(
        monkeypatch):
    """On the two-level communicator (transport "hierarchical", init()'s default across
    hosts) a CUDA buffer's first collective adds the NCCL level (_cuda.across_ready, counted
    here), Adasum of one tensor runs as a hierarchical Adasum op made once, and an Adasum op
    of a layout made for CUDA buffers is hierarchical from the start; a CPU buffer's op stays
    the flat one. On host memory the hierarchical op gives the tree over the means of the
    session's hosts (local_size consecutive ranks; one host: the average)."""
    import ctypes
    from sumo._abi import SUMO_COLLECTIVE_ALLREDUCE, SUMO_FLOAT64, SUMO_OP_ADASUM
    from reference import adasum_tree
    x = data(7, 7, torch.float64)
    rows, L = st.allgather(x.view(1, -1)), st.local_size()
    want = adasum_tree([rows[h:h + L].mean(0) for h in range(0, len(rows), L)])
    made = []
    monkeypatch.setattr(rt.state, "transport", "hierarchical")
    monkeypatch.setattr(_cuda, "across_ready", lambda: made.append(1))
    monkeypatch.setattr(_cuda._Cuda, "adasum", None)
    created = []
    real_create = _lib.lib.sumo_op_create_adasum

    def create(comm, opts, out):
        created.append(opts._obj.hierarchical)  # opts: ctypes.byref of the options
        return real_create(comm, opts, out)

    monkeypatch.setattr(_lib.lib, "sumo_op_create_adasum", create)
    ops = []
    try:
        ops.append(_tensors.adasum_op(rt.state.comm, [3, 4], "CUDA", torch.device("cuda", 0)))
        ops.append(_tensors.adasum_op(rt.state.comm, [3, 4], "CPU", torch.device("cpu")))
        assert created == [1, 0] and made == [1]
        px = ctypes.c_void_p(x.data_ptr())
        assert _calls.collective(SUMO_COLLECTIVE_ALLREDUCE, px, px, 7, SUMO_FLOAT64, 0,
                                 op=SUMO_OP_ADASUM) == 0
        assert created == [1, 0, 1] and len(made) == 2
        assert torch.allclose(x, want, rtol=1e-10, atol=1e-12), (x, want)
        assert _calls.collective(SUMO_COLLECTIVE_ALLREDUCE, px, px, 7, SUMO_FLOAT64, 0,
                                 op=SUMO_OP_ADASUM) == 0
        assert created == [1, 0, 1] and len(made) == 3  # the op made once
    finally:
        for op in ops:
            _lib.lib.sumo_op_destroy(rt.state.comm, op)
        if _cuda._Cuda.adasum is not None:
            _lib.lib.sumo_op_destroy(rt.state.comm, _cuda._Cuda.adasum[1])


@pytest.mark.parametrize("op", [sumo.Sum, sumo.Average, sumo.Adasum])
def test_cuda_path_allreduce_passes_pointer_and_stream(cuda_mocked, op):
    x = data(1)
    cpu = st.allreduce(x, op=op, name="x")
    t = mock(x)
    got = st.allreduce_(t, op=op, name="x")
    assert same_bits(got, cpu)
    assert cuda_mocked and all(c[2] == FAKE_STREAM for c in cuda_mocked)
    assert cuda_mocked[-1][1] == t.data_ptr()


def test_cuda_path_grouped_broadcast_allgather_reducescatter(cuda_mocked):
    xs = [data(2, 5), data(3, 7), data(4, 3, torch.float64)]
    cpu = st.grouped_allreduce([x.clone() for x in xs], op=sumo.Average)
    got = st.grouped_allreduce([mock(x) for x in xs], op=sumo.Average)
    assert all(same_bits(a, b) for a, b in zip(got, cpu))
    b = mock(data(5))
    st.broadcast_(b, root_rank=0)
    ref = data(5)
    st.broadcast_(ref, root_rank=0)
    assert same_bits(b, ref)
    g = st.allgather(mock(data(6, 4).view(2, 2)))
    assert same_bits(g, st.allgather(data(6, 4).view(2, 2)))
    rows = 2 * st.size()
    r = st.reducescatter(mock(data(7, rows * 3).view(rows, 3)), op=sumo.Sum)
    assert same_bits(r, st.reducescatter(data(7, rows * 3).view(rows, 3), op=sumo.Sum))
    kinds = {c[0] for c in cuda_mocked}
    assert kinds == {1, 2, 3, 4} and all(c[2] == FAKE_STREAM for c in cuda_mocked)


def test_cuda_path_async_fused_and_broadcast(cuda_mocked):
    xs = [data(8 + i, 6) for i in range(3)]
    cpu = [st.synchronize(st.allreduce_async(x, op=sumo.Sum)) for x in xs]
    hs = [st.allreduce_async_(mock(x), op=sumo.Sum) for x in xs]
    got = [st.synchronize(h) for h in hs]
    assert all(same_bits(a, b) for a, b in zip(got, cpu))
    h = st.broadcast_async_(mock(data(12)), root_rank=0)
    ref = data(12)
    st.broadcast_(ref, 0)
    assert same_bits(st.synchronize(h), ref)
    assert all(c[2] == FAKE_STREAM for c in cuda_mocked)


class _Bucket:
    """What the hooks read of a dist.GradBucket."""

    def __init__(self, index, buf, layout):
        self._i, self._buf, self._layout = index, buf, layout

    def index(self):
        return self._i

    def buffer(self):
        return self._buf

    def gradients(self):
        out, off = [], 0
        for n in self._layout:
            out.append(self._buf[off:off + n])
            off += n
        return out


@pytest.mark.parametrize("hook", ["average_hook", "sum_hook", "adasum_hook"])
def test_cuda_path_ddp_hooks(cuda_mocked, hook):
    fn = getattr(sumo_hooks, hook)
    state = st.HookState(mapped_buffers=False)
    layout = [5, 11, 3]
    x = data(13, sum(layout), torch.float64)
    cpu = fn(state, _Bucket(0, x.clone(), layout)).wait()
    t = mock(x)
    got = fn(state, _Bucket(0, t, layout)).wait()
    state.close()
    assert got is t  # reduced in place on the device, handed back as it is
    assert same_bits(got, cpu)
    assert cuda_mocked[-1][1:] == (t.data_ptr(), FAKE_STREAM)


@pytest.mark.parametrize("op", [sumo.Average, sumo.Adasum])
def test_cuda_path_distributed_optimizer(cuda_mocked, op):
    """Mock parameters through DistributedOptimizer (overlapped buckets and step) against
    the same on CPU parameters."""
    def run(wrap):
        torch.manual_seed(0)
        ws = [wrap(torch.randn(4, 3)).requires_grad_(), wrap(torch.randn(3)).requires_grad_()]
        opt = st.DistributedOptimizer(torch.optim.SGD(ws, lr=0.1, momentum=0.9, foreach=False),
                                      named_parameters=[("w", ws[0]), ("b", ws[1])], op=op)
        for step in range(3):
            x = data(20 + step, 3).double().float()
            loss = ((wrap(x) * ws[0]).sum() + ws[1].sum() * x.sum()) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
        return [torch.Tensor(w.detach()).clone() for w in ws]

    cpu = run(lambda t: t)
    got = run(mock)
    assert all(same_bits(a, b) for a, b in zip(got, cpu))
    assert cuda_mocked and all(c[2] == FAKE_STREAM for c in cuda_mocked)


def test_cuda_path_diloco(cuda_mocked):
    def run(wrap):
        torch.manual_seed(0)
        w = wrap(torch.randn(6)).requires_grad_()
        opt = st.DiLoCo(torch.optim.SGD([w], lr=0.1, foreach=False), sync_every=2)
        for step in range(4):
            opt.zero_grad()
            ((w * wrap(data(30 + step, 6))).sum() ** 2).backward()
            opt.step()
        opt.close()
        return torch.Tensor(w.detach()).clone()

    assert same_bits(run(mock), run(lambda t: t))


# ---- on a device ----------------------------------------------------------------------------
#
# sumo.torch's communicator here is the session's (conftest.py): the threads transport at one
# rank, or SUMO_TEST_TRANSPORT=nccl under torchrun, one GPU per rank.

def _dev():
    return torch.device("cuda", torch.cuda.current_device())


def _takes_cuda():
    """The session's communicator takes CUDA tensors: a CUDA transport, or the hierarchical
    path across hosts (SUMO_TEST_TRANSPORT=hierarchical: CUDA IPC in the host, NCCL between)."""
    return rt.state.transport in _cuda.CUDA_TRANSPORTS


def _hosts():
    """Hosts of the two-level communicator (consecutive blocks of local_size ranks)."""
    return st.size() // st.local_size() if rt.state.transport == "hierarchical" else 1


@needs_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", [sumo.Sum, sumo.Average])
def test_device_sum_average_bits_of_the_cpu_path(dtype, op):
    if not _takes_cuda():
        pytest.skip("the %s transport moves host memory only" % rt.state.transport)
    x = data(40, 1001, dtype)
    got = st.allreduce(x.to(_dev()), op=op, name="x")
    torch.cuda.synchronize()
    assert got.is_cuda
    want = _cpu_reference(x, op)
    if _hosts() == 1:
        assert same_bits(got.cpu(), want)
    else:  # device memory across hosts: SUMO_ALGORITHM_TWO_LEVEL rounds once per level
        assert torch.allclose(got.cpu().double(), want.double(), rtol=1e-2, atol=1e-2)


def _cpu_reference(x, op):
    """The CPU path: the same data as a CPU tensor through the same communicator."""
    return st.allreduce(x.clone(), op=op, name="x (CPU)")


@needs_device
def test_device_adasum_float64_within_the_bound():
    """Adasum per tensor of float64 CUDA tensors against the reference on the CPU (the Gram
    form's dot products in a fixed order of their own: within n u sum|x_a x_b|)."""
    if not _takes_cuda():
        pytest.skip("the %s transport moves host memory only" % rt.state.transport)
    from reference import adasum_per_tensor
    layout = [7, 300, 1]
    x = data(41, sum(layout), torch.float64)
    state = st.HookState()
    got = sumo_hooks.adasum_hook(state, _Bucket(0, x.to(_dev()), layout)).wait()
    torch.cuda.synchronize()
    state.close()
    rows = st.allgather(x.view(1, -1))
    if rt.state.transport == "hierarchical":
        # Across hosts CUDA buffers take the hierarchical Adasum op: the hosts' averages.
        L = st.local_size()
        rows = torch.stack([rows[h * L:(h + 1) * L].mean(0) for h in range(_hosts())])
    ref = torch.cat(adasum_per_tensor([list(rows[r].split(layout)) for r in range(len(rows))]))
    n = max(layout)
    bound = 4 * n * 2 ** -53 * (rows.abs().sum(0) * rows.abs().max() + 1e-300)
    assert bool(((got.cpu() - ref).abs() <= bound).all()), (got.cpu() - ref).abs().max()


@needs_device
@pytest.mark.parametrize("hook", ["average_hook", "sum_hook", "adasum_hook"])
def test_device_ddp_hook_matches_the_cpu_model(hook):
    """One training step of DDP on CUDA with a sumo hook against the same on the CPU with the
    same hook: the parameters agree (the model's own kernels differ between CPU and GPU, so
    within rounding; the reduction itself is checked bit for bit above). In float64: the
    two sides' forward passes round apart, and in float32 a ReLU input within that rounding
    of zero would flip its unit on one side and part the gradients by far more than the
    rounding (test_torch.py), by chance of the data and the kernels."""
    if not _takes_cuda():
        pytest.skip("the %s transport moves host memory only" % rt.state.transport)
    if not dist.is_initialized():
        pytest.skip("no torch.distributed group for DDP")
    from torch.nn.parallel import DistributedDataParallel as DDP
    cpu_hook = hook
    if rt.state.transport == "hierarchical" and hook == "adasum_hook":
        # Across hosts the CUDA path's Adasum combines the hosts' averages, the CPU path's the
        # ranks (docs/torch/cuda.md): on one host the CUDA one is the average.
        if _hosts() > 1:
            pytest.skip("Adasum over hosts' averages has no CPU counterpart to compare with")
        cpu_hook = "average_hook"
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(),
                               torch.nn.Linear(24, 5)).double()
    x, y = data(42, 16 * 12, torch.float64).view(16, 12), torch.arange(16) % 5
    results = []
    for device in ("cpu", _dev()):
        model = copy.deepcopy(base).to(device)
        ddp = DDP(model, device_ids=[device.index] if isinstance(device, torch.device) else None)
        state = st.HookState()
        ddp.register_comm_hook(state, getattr(sumo_hooks, hook if device != "cpu" else cpu_hook))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
        opt.step()
        torch.cuda.synchronize()
        state.close()
        results.append([p.detach().cpu() for p in model.parameters()])
    err = max(float((a - b).abs().max()) for a, b in zip(*results))
    scale = max(float(b.abs().max()) for b in results[0])
    assert err <= 1e-12 * scale, (err, scale)


@needs_device
@pytest.mark.parametrize("op", [sumo.Average, sumo.Adasum])
def test_device_distributed_optimizer_and_diloco_run(op):
    """DistributedOptimizer and DiLoCo on CUDA parameters: the same parameters on every
    rank after the combine, close to the CPU run. In float32 over 4 steps: the loss,
    (w . x)^2, is smooth (no ReLU, no max), so the CPU's and the GPU's roundings stay
    roundings, amplified by no more than the steps' own factors, and nothing flips."""
    if not _takes_cuda():
        pytest.skip("the %s transport moves host memory only" % rt.state.transport)

    def run(device, kind):
        torch.manual_seed(0)
        w = torch.randn(40, device=device, requires_grad=True)
        inner = torch.optim.SGD([w], lr=0.05, momentum=0.9)
        opt = st.DistributedOptimizer(inner, named_parameters=[("w", w)], op=op) \
            if kind == "dopt" else st.DiLoCo(inner, sync_every=2)
        for step in range(4):
            opt.zero_grad()
            ((w * data(50 + step, 40).to(device)).sum() ** 2).backward()
            opt.step()
        torch.cuda.synchronize()
        if kind == "diloco":
            opt.close()
        return w.detach().cpu()

    if rt.state.transport == "hierarchical":
        # Across hosts Adasum of CUDA buffers combines the hosts' averages, unlike the CPU
        # path; DiLoCo's average crosses the hosts over NCCL, rounding once per level.
        a, b = run(_dev(), "diloco"), run("cpu", "diloco")
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), ("diloco", (a - b).abs().max())
        a = run(_dev(), "dopt")
        rows = st.allgather(a.view(1, -1))
        assert all(same_bits(rows[r], a) for r in range(st.size()))
        if op is sumo.Adasum:
            return
        b = run("cpu", "dopt")
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()
        return
    for kind in ("dopt", "diloco"):
        a, b = run(_dev(), kind), run("cpu", kind)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (kind, (a - b).abs().max())
