"""sumo.torch.elastic, Horovod's elastic API, against references computed here without sumo.

Processes started each on its own (subprocess), meeting through a store on the shared-memory
transport, train a small model in an elastic.run loop (elastic_worker.py); one is killed with
SIGKILL inside the step's gradient allreduce after a process joined; and the Horovod elastic
example (examples/horovod_elastic.py) under python -m sumo.launch loses a process between
steps. The survivors must finish with the deadline a few seconds, lose nothing committed,
and end with the parameters, bit for bit, of the training computed here in which that
process leaves at the last commit before its death (the steps after it are redone) and the
joiner comes in at the first commit; nothing of theirs is left in /dev/shm. Each job is three
processes: torch 2.x takes seconds of CPU to start one, and the machine has few cores.

In the pytest process itself: the two commits a state keeps, and the run loop's recovery on
a one-rank communicator. Every test here is collective or skipped under a launcher."""
import glob
import importlib.util
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import sumo.torch as hvd
from sumo.torch import _init, _runtime, _stores

import elastic_worker as worker

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LAUNCHED = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                         "TORCHELASTIC_RUN_ID"))
DEADLINE = 10  # SUMO_TIMEOUT of the processes started here (a joiner that starts torch on a busy machine)
GUARD = 120   # seconds a job of them may take at all (torch's start-up on a busy machine)


# The workers' training computed without sumo (elastic_worker.reference).
reference = worker.reference


def _shm_entries():
    return {n for n in os.listdir("/dev/shm") if n.startswith("sumo.")}


def _env():
    # A lost process across hosts is found by its heartbeat: a second, not the deadline.
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), SUMO_TIMEOUT=str(DEADLINE),
                SUMO_LIVENESS_TIMEOUT="1")


def _run_job(tmp_path, store, members, kill, joiners=0, extra=(), joiner_extra=()):
    """Starts `members` processes (and `joiners` that join at the first commit) of
    elastic_worker.py with the arguments `extra`, each on its own, and waits for them: their
    exit codes, and what each survivor wrote."""
    out = tmp_path / "out"
    out.mkdir()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_worker.py")
    common = [sys.executable, script, str(store), str(out)]
    kill_args = ["--kill-rank", str(kill[0]), "--kill-step", str(kill[1]), "--kill-where",
                 kill[2]] + list(extra)
    procs = [subprocess.Popen(common + ["--join"] + kill_args + list(joiner_extra), env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(joiners)]
    procs += [subprocess.Popen(common + ["--rank", str(r), "--size", str(members),
                                         "--wait-joiners", str(joiners)] + kill_args,
                               env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
              for r in range(members)]
    end = time.monotonic() + GUARD
    codes, text, hung = [], [], []
    for i, p in enumerate(procs):
        try:
            stdout, _ = p.communicate(timeout=max(1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(i)
            p.kill()
            stdout, _ = p.communicate()
        codes.append(p.returncode)
        text.append(stdout)
    logs = "\n".join("-- process %d (exit %s):\n%s" % (i, c, t[-1500:])
                     for i, (c, t) in enumerate(zip(codes, text)))
    if hung:  # every process's output, to tell where it waited
        pytest.fail("processes %s still ran after %d s:\n%s" % (hung, GUARD, logs))
    results = [torch.load(f) for f in sorted(glob.glob(str(out / "*.pt")))]
    return codes, results, logs


def _check_survivors(codes, results, logs, lost, expect, steps=worker.STEPS):
    assert sorted(codes) == sorted([-9] * lost + [0] * (len(codes) - lost)), logs
    assert len(results) == len(codes) - lost, logs
    for res in results:
        assert res["step"] == steps and res["size"] == len(results), logs
        for kind, t, *rest in res["events"]:
            if kind == "failed":
                # From the failed collective to the new membership, within the deadline.
                after = [e for e in res["events"] if e[0] == "reset" and e[1] > t]
                assert after and after[0][1] - t < DEADLINE, res["events"]
        for name, value in expect.items():
            assert torch.equal(res["params"][name], value), (name, res["first"], logs)
    assert sorted(r["rank"] for r in results) == list(range(len(results)))


def _example():
    """examples/horovod_elastic.py as a module (its main() is not run)."""
    path = os.path.join(ROOT, "examples", "horovod_elastic.py")
    spec = importlib.util.spec_from_file_location("horovod_elastic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_reference(args, memberships):
    """The example's parameters' digest after its training with args, computed without sumo:
    memberships as reference()'s, counted in batches over the epochs; each process r of P
    takes the rows r, r + P, ... of the global batch, and their gradients are averaged."""
    ex = _example()
    a = ex.parser.parse_args(args)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = ex.Net()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    step = 0
    for epoch in range(a.epochs):
        for b in range(a.batches_per_epoch):
            size = [n for first, n in memberships if first <= step][-1]
            x, y = ex.global_batch(epoch, b, a.batch_size)
            worker.average_step(model, opt, size, lambda r: torch.nn.functional.cross_entropy(
                model(x[r::size]), y[r::size]))
            step += 1
    return ex.digest(model)


def _serve_store():
    """python -m sumo.launch --serve-store on a port the system picks: (the process, its
    tcp:// address)."""
    server = subprocess.Popen([sys.executable, "-m", "sumo.launch", "--serve-store",
                               "127.0.0.1:0"], env=_env(), stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    found = re.search(r"\(tcp://(127\.0\.0\.1:\d+)\)", line)
    if not found:
        server.kill()
        pytest.fail("the store server said %r" % line)
    return server, "tcp://" + found.group(1)


@pytest.mark.skipif(LAUNCHED, reason="starts processes of its own; runs without a launcher")
@pytest.mark.parametrize("across", [False, True], ids=["one-host", "across-hosts"])
def test_example_killed_between_steps_survivors_equal_reference(tmp_path, across):
    # The Horovod elastic example under python -m sumo.launch, 3 processes; process 1 dies
    # between steps at batch 5, the last commit was after batch 3 (of 8 per epoch), so batch 4
    # is redone by the two others. One host: sumo's directory store, shared memory. Across
    # hosts, as the docs start it: a store served by a process of its own (--serve-store),
    # the workers on gloo groups made from it (--transport group).
    before = _shm_entries()
    server = None
    if across:
        server, store = _serve_store()
        place = ["--store", store, "--transport", "group"]
    else:
        store = tmp_path / "store"
        store.mkdir(mode=0o700)
        place = ["--store", str(store)]
    args = ["--epochs", "2", "--batches-per-epoch", "8", "--kill-rank", "1", "--kill-batch", "5"]
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "sumo.launch", "--nproc", "3"] + place +
                             [os.path.join(ROOT, "examples", "horovod_elastic.py")] + args,
                             env=_env(), capture_output=True, text=True, timeout=GUARD)
    finally:
        if server is not None:
            server.terminate()
            server.communicate()
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "process 1 was killed by signal 9" in text, text[-3000:]
    assert text.count("reset: ") == 1, text[-3000:]
    assert "reset: now 2 processes, going on from epoch 0 batch 4" in text, text[-3000:]
    # The processes share the pipe, so a line may run into another: the digest's length ends it.
    done = re.findall(r"started as rank (\d) of 3\): done as rank (\d) of 2, "
                      r"parameters ([0-9a-f]{16})", text)
    assert sorted((a, b) for a, b, _ in done) == [("0", "0"), ("2", "1")], text[-3000:]
    expect = example_reference(args, [(0, 3), (4, 2)])
    assert [d for _, _, d in done] == [expect, expect], (expect, text[-3000:])
    assert _shm_entries() <= before
    print("the example: 3 processes, one killed, the two others done in %.1f s" % took)


@pytest.mark.skipif(LAUNCHED, reason="starts processes of its own; runs without a launcher")
@pytest.mark.parametrize("transport", ["shm", "tcp", "group"])
def test_joined_then_killed_inside_a_collective_survivors_equal_reference(tmp_path, transport):
    # 2 processes and one that joins at the first commit (step 2): 3 from step 2. Process 1
    # dies at step 5 inside the step's allreduce (its peers come into it later); the last
    # commit was at step 4, so steps 4 and 5 are redone by the two left (old ranks 0 and 2).
    # The store: a FileStore (sumo.torch takes joiners on a torch.distributed.Store). Over
    # shared memory, and over sumo's TCP connections or gloo groups met through the store (what
    # processes on several hosts use: the survivors agree through the store, the lost one found
    # by its heartbeat).
    before = _shm_entries()
    codes, results, logs = _run_job(tmp_path, tmp_path / "store", 2, (1, 5, "collective"),
                                    joiners=1, extra=["--transport", transport])
    _check_survivors(codes, results, logs, 1, reference([(0, 2), (2, 3), (4, 2)]))
    joiner = [r for r in results if r["first"] == (2, 3)]
    assert len(joiner) == 1, logs
    assert joiner[0]["rank"] == 1  # old ranks 0 and 2 become 0 and 1
    for res in results:
        resets = [(e[3], e[4]) for e in res["events"] if e[0] == "reset"]
        # (size, step) after each change: the grow at step 2 (the joiner was not there
        # before it), then the shrink back to the commit of step 4.
        assert resets == ([(2, 4)] if res is joiner[0] else [(3, 2), (2, 4)]), res["events"]
    assert _shm_entries() <= before
    # No heartbeat is left in the store: each process takes its own with it, and the new
    # rank 0 the lost process's (memberships, libsumo's makings: 0 the first two, 1 with the
    # joiner, 2 after the loss).
    store = dist.FileStore(str(tmp_path / "store"), -1)
    missing = b"\0none\0"
    held = [(m, r) for m in range(3) for r in range(3)
            if store.compare_set("sumo/elastic/a%d/alive/%d" % (m, r), missing, missing)
            != missing]
    assert held == [], held
    if transport == "tcp":
        # Each meeting took its own keys away (the first, the grow, the shrink's).
        for n in range(3):
            for key in ["tcp/nonce"] + ["tcp/addr/%d" % r for r in range(1, 3)]:
                key = "sumo/elastic/a%d/comm/%s" % (n, key)
                assert store.compare_set(key, missing, missing) == missing, key


@pytest.mark.skipif(LAUNCHED, reason="starts processes of its own; runs without a launcher")
def test_a_joiner_whose_model_differs_is_refused_and_the_members_go_on(tmp_path):
    # 2 processes; one joins at the first commit (step 2) with a model of another shape. Its
    # first collective on the grown communicator disagrees with the members' state sync: the
    # joiner leaves (exit 3 where the sync's own collective fails, saying its state does not
    # match; under torch 2.x its optimizer's shared buckets are a collective before that), and
    # the members drop it as a lost process and train on at 2 from the commit of step 2.
    codes, results, logs = _run_job(tmp_path, tmp_path / "store", 2, (-1, -1, "between"),
                                    joiners=1, joiner_extra=["--bad-model"])
    assert codes[0] != 0, logs
    assert codes[0] != 3 or "does not match the job's" in logs, logs
    assert codes[1:] == [0, 0], logs
    _check_survivors(codes[1:], results, logs, 0, reference([(0, 2)]))
    for res in results:
        resets = [(e[3], e[4]) for e in res["events"] if e[0] == "reset"]
        assert resets == [(3, 2), (2, 2)], res["events"]


@pytest.mark.skipif(LAUNCHED, reason="starts processes of its own; runs without a launcher")
def test_a_shrink_met_by_some_ranks_only_is_made_again_by_all(tmp_path):
    # 3 processes on gloo groups made from the store; process 2 dies between steps at step
    # 5, and process 1's first shrink meeting fails after processes 0 and 1 have met (as
    # when a member dies at the end of a meeting): process 0 must not go on with the
    # communicator it made, or the two would count memberships apart and never meet again.
    # Both make it again (libsumo's making 2) and end together, with the parameters of the
    # training in which process 2 leaves at the commit of step 4.
    codes, results, logs = _run_job(tmp_path, tmp_path / "store", 3, (2, 5, "between"),
                                    extra=["--transport", "group", "--fail-shrink-rank", "1"])
    assert "fail-shrink: the meeting under sumo/elastic/a1/comm/ fails here only" in logs, logs
    _check_survivors(codes, results, logs, 1, reference([(0, 3), (4, 2)]))


def test_state_keeps_the_last_two_commits():
    model = worker.make_model()
    opt = hvd.DistributedOptimizer(worker.make_optimizer(model.parameters()),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    seen = {}
    for c in (1, 2, 3):
        opt.zero_grad()
        worker.loss_of(model, c, hvd.rank()).backward()
        opt.step()
        state.step = c
        state.commit()
        seen[c] = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state.step = 99
    assert not state._rollback(1)  # kept: commits 2 and 3
    assert state._rollback(2)
    state._commits = 2
    state.restore()
    assert state.step == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, seen[2][k]), k
    assert set(opt.state_dict()["state"]) == {0, 1, 2, 3}  # the momenta came back too


def test_run_recovers_from_a_lost_peer_on_one_rank():
    # A failure raised inside the loop: the communicator is shrunk (to itself: one rank), the
    # state goes back to the last commit, the callbacks run, the function runs again, and the
    # optimizer's buffers are made on the new communicator.
    if hvd.size() != 1 or hvd.transport() != "threads":
        pytest.skip("replaces the communicator: the one-rank session's alone")
    model = worker.make_model()
    opt = hvd.DistributedOptimizer(worker.make_optimizer(model.parameters()),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    calls, resets = [], []
    state.register_reset_callbacks([lambda: resets.append(state.step)])
    comm = _runtime.state.comm

    @hvd.elastic.run
    def train(state):
        calls.append(state.step)
        while state.step < 6:
            opt.zero_grad()
            worker.loss_of(model, state.step, 0).backward()
            opt.step()
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
            if state.step == 5 and len(calls) == 1:
                raise _runtime.PeerLost(5, "SUMO_ERR_PEER_FAILURE", "a peer, lost (test)")
        return state.step

    assert train(state) == 6
    assert calls == [0, 4] and resets == [4]
    assert _runtime.state.comm.value != comm.value and hvd.size() == 1
    ref = worker.make_model()
    ref_opt = worker.make_optimizer(ref.parameters())
    for s in range(6):
        ref.zero_grad()
        worker.loss_of(ref, s, 0).backward()
        ref_opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref.state_dict()[k]), k


def test_init_store_arguments_are_checked():
    with pytest.raises(ValueError, match="go together"):
        _init._check_store_args("store", 0, None, None, None, False)
    with pytest.raises(ValueError, match="not a rank of 2"):
        _init._check_store_args("store", 2, 2, None, None, False)
    with pytest.raises(ValueError, match="transport='mpi'"):
        _init._check_store_args("store", 0, 2, "mpi", None, False)
    with pytest.raises(ValueError, match="no rank or size"):
        _init._check_store_args("store", 0, 2, None, None, True)
    with pytest.raises(TypeError, match="store must be"):
        _stores.store_adapter(42)
    with pytest.raises(ValueError, match="not a directory"):
        _init._check_store_args("a/dir", 0, 2, "group", None, False)


@pytest.mark.parametrize("argv, message", [
    (["--serve-store", "localhost"], "--serve-store must be HOST:PORT"),
    (["--serve-store", "localhost:0", "train.py"], "runs the store alone"),
    (["--store", "tcp://localhost:0", "--rank", "0", "--size", "2", "train.py"],
     "--store tcp:// must be HOST:PORT"),
    (["--nproc", "2"], "give the script"),
])
def test_launch_refuses_what_means_nothing(argv, message):
    from sumo import launch
    with pytest.raises(SystemExit) as e:
        launch.check(launch.parser().parse_args(argv))
    assert message in str(e.value)


def test_elastic_sampler_cuts_what_is_left_for_the_new_membership(monkeypatch):
    # Local: the membership is set by hand. 10 samples among 3 processes, then 6 of them
    # processed (one batch of 2 each) and 2 processes left: these share the last 4.
    monkeypatch.setattr(_runtime.state, "size", 3)
    monkeypatch.setattr(_runtime.state, "rank", 1)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    assert list(sampler) == [1, 4, 7, 0] and len(sampler) == 4  # the last ones repeated
    sampler.record_batch(0, 2)
    kept = sampler.state_dict()
    monkeypatch.setattr(_runtime.state, "size", 2)
    sampler.load_state_dict(kept)
    assert list(sampler) == [7, 9]
    sampler.set_epoch(1)
    assert list(sampler) == [1, 3, 5, 7, 9]
    # Shuffled: the same order on every process (seed + epoch), so the parts cover the data.
    parts = []
    for r in (0, 1):
        monkeypatch.setattr(_runtime.state, "rank", r)
        shuffled = hvd.elastic.ElasticSampler(list(range(10)), seed=5)
        shuffled.set_epoch(2)
        parts.append(list(shuffled))
    assert sorted(parts[0] + parts[1]) == list(range(10)) and parts[0] != [0, 2, 4, 6, 8]
