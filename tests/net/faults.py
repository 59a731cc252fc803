"""One process of tests/net/faults.sh's jobs across hosts (network namespaces, real TCP), run
by python -m sumo.launch --store tcp://host0:PORT (the communicator made from the store before
this runs), or on its own to check what the processes wrote:

    faults.py elastic OUT [--fault down|cut --fault-host H --fault-step S [--back-after T]]
                          [--wait-joiners K] [--bad-model-on H]
        tests/python/elastic_worker.py's model, optimizer and batches (every process computes
        the same thing from (step, rank) alone) trained with sumo.torch.elastic for STEPS
        steps. The process of host H takes its own host off the network at step S, inside the
        step's gradient allreduce: `ip link set eth0 down` (down) or every packet dropped
        (cut, nftables), and (--back-after T) back T seconds later. Run by hand inside the
        host, not at a time after the start (scripts/net-hosts.sh --flap/--cut): torch's
        start takes seconds that vary with the machine's load, a step a few milliseconds.
        --wait-joiners K: rank 0 waits at the first commit until K joiners asked to come in;
        --bad-model-on H: host H's process has a model of another shape.
        What each process saw goes to OUT/<host>-<pid>.pt; one that ends with an error writes
        the message to OUT/<host>-<pid>.err.
    faults.py plain OUT --fault-host H --fault-step S
        the same steps without the elastic API (one allreduce per step), host H's link taken
        down inside step S's: every process must end with an error naming the lost host;
        OUT/<host>-<pid>.err says which, and when.
    faults.py check OUT SIZE [--lost N --fault-step S | --refused]
        the checks, printed as ok/FAIL lines: the processes that finished end with the
        parameters, bit for bit, of the training computed here without sumo in which the
        membership changed where they say it did (and nowhere else), and at the step the test
        wanted; recovery times, from the fault to the next completed step on every survivor.
"""
import argparse
import glob
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import elastic_worker as worker  # noqa: E402

STEPS = 24
COMMIT_EVERY = 2
NAP = 0.05  # seconds a step takes at least: the fault's seconds fall inside the run


def host():
    return int(os.environ.get("NET_HOST", "0"))


def fault(kind, back_after, out):
    """This host off the network now; back after back_after seconds if given (a thread's,
    returned). The time it went is written to OUT/fault.time."""
    if kind == "down":
        off, on = ["ip", "link", "set", "eth0", "down"], ["ip", "link", "set", "eth0", "up"]
    else:
        off = ["sh", "-c", "nft add table inet sumocut && nft add chain inet sumocut in "
               "'{ type filter hook input priority -10; policy drop; }' && nft add chain inet "
               "sumocut out '{ type filter hook output priority -10; policy drop; }' && "
               "nft add rule inet sumocut in iif lo accept && "
               "nft add rule inet sumocut out oif lo accept"]
        on = ["nft", "delete", "table", "inet", "sumocut"]

    # Now, before this process's part of the step: the others are inside the step's
    # allreduce, waiting for it, when the link goes.
    subprocess.run(off, check=True)
    with open(os.path.join(out, "fault.time"), "w") as f:
        f.write("%.6f\n" % time.time())
    print("host%d: %s at %.3f" % (host(), kind, time.time()), flush=True)

    def go():
        if back_after:
            time.sleep(back_after)
            subprocess.run(on, check=True)
            with open(os.path.join(out, "back.time"), "w") as f:
                f.write("%.6f\n" % time.time())
            print("host%d: back at %.3f" % (host(), time.time()), flush=True)

    t = threading.Thread(target=go, daemon=False)
    t.start()
    return t


def write(out, what, data):
    path = os.path.join(out, "host%d-%d.%s" % (host(), os.getpid(), what))
    if what == "pt":
        torch.save(data, path)
    else:
        with open(path, "w") as f:
            f.write(data)


def elastic(a):
    import sumo.torch as hvd
    from sumo.torch import _membership, _runtime

    torch.set_num_threads(1)
    first = (hvd.rank(), hvd.size())
    events, done = [], []
    model = worker.make_model()
    if host() == a.bad_model_on:
        model = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))
    opt = hvd.DistributedOptimizer(worker.make_optimizer(model.parameters()),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    state.register_reset_callbacks([lambda: events.append(
        ("reset", time.time(), hvd.rank(), hvd.size(), state.step))])
    faulted = []

    @hvd.elastic.run
    def train(state):
        events.append(("call", time.time(), hvd.rank(), hvd.size(), state.step))
        while state.step < STEPS:
            s = state.step
            time.sleep(NAP)
            if a.fault and host() == a.fault_host and s == a.fault_step and not faulted:
                faulted.append(fault(a.fault, a.back_after, a.out))
            opt.zero_grad()
            try:
                worker.loss_of(model, s, hvd.rank()).backward()
                opt.step()
            except hvd.elastic.HorovodInternalError as e:
                events.append(("failed", time.time(), hvd.rank(), hvd.size(), s, str(e)))
                raise
            state.step += 1
            done.append((s, time.time(), hvd.size()))
            if state.step % COMMIT_EVERY == 0:
                if a.wait_joiners and hvd.rank() == 0 and _runtime.state.memberships == 0:
                    while _membership.tickets_taken() < a.wait_joiners:
                        time.sleep(0.05)
                state.commit()

    try:
        train(state)
    except Exception as e:  # the process the others went on without, a refused joiner
        write(a.out, "err", "%.6f %s: %s\n" % (time.time(), type(e).__name__, e))
        print("host%d: ended: %s: %s" % (host(), type(e).__name__, e), flush=True)
        for t in faulted:
            t.join()
        sys.exit(3)
    write(a.out, "pt", {"first": first, "rank": hvd.rank(), "size": hvd.size(),
                        "step": state.step, "events": events, "done": done,
                        "memberships": _runtime.state.memberships,
                        "params": {k: v.clone() for k, v in model.state_dict().items()}})
    for t in faulted:
        t.join()


def plain(a):
    import sumo.torch as hvd

    torch.set_num_threads(1)
    t = torch.ones(1 << 16)
    for s in range(STEPS):
        time.sleep(NAP)
        if host() == a.fault_host and s == a.fault_step:
            fault("down", 0, a.out)
        try:
            hvd.allreduce(t, op=hvd.Sum, name="step%d" % s)
        except Exception as e:
            write(a.out, "err", "%.6f %s: %s\n" % (time.time(), type(e).__name__, e))
            print("host%d: ended at step %d: %s: %s" % (host(), s, type(e).__name__, e),
                  flush=True)
            sys.exit(3)
    write(a.out, "err", "no error: every step completed\n")


def check(a):
    ok_all = True

    def say(ok, text):
        nonlocal ok_all
        ok_all &= bool(ok)
        print("%s - %s" % ("ok  " if ok else "FAIL", text), flush=True)

    res = [torch.load(f) for f in sorted(glob.glob(os.path.join(a.out, "*.pt")))]
    errs = {os.path.basename(f): open(f).read().strip()
            for f in glob.glob(os.path.join(a.out, "*.err"))}
    survivors = a.size - a.lost
    say(len(res) == survivors and all(r["size"] == survivors and r["step"] == STEPS
                                      for r in res),
        "%s: %d processes finished all %d steps at size %d (of %d: %s)"
        % (a.what, len(res), STEPS, survivors, a.size,
           sorted((r["rank"], r["size"], r["step"]) for r in res)))
    if not res:
        return ok_all
    # Where the membership changed, as every survivor saw it: the same on all of them.
    changes = {tuple((e[4], e[3]) for e in r["events"] if e[0] == "reset") for r in res}
    say(len(changes) == 1, "%s: every survivor saw the membership change at the same steps: %s"
        % (a.what, sorted(changes)))
    change = sorted(changes)[0]
    memberships = [(0, a.size)] + list(change)
    if a.lost:
        want = a.fault_step - a.fault_step % COMMIT_EVERY
        say(len(change) == 1 and change[0] == (want, survivors),
            "%s: the lost host left at the commit before its fault (step %d), once: %s"
            % (a.what, want, list(change)))
    elif a.refused:
        say([n for _, n in change] == [a.size + 1, a.size],
            "%s: the joiner came in and was dropped again: %s" % (a.what, list(change)))
    else:
        say(not change and not any(e[0] == "failed" for r in res for e in r["events"]),
            "%s: no membership change and no failed step" % a.what)
    expect = worker.reference(memberships, STEPS)
    same = all(torch.equal(r["params"][k], v) for r in res for k, v in expect.items())
    say(same, "%s: the survivors' parameters are bit for bit the reference's where the "
        "membership was %s" % (a.what, memberships))
    for name, text in sorted(errs.items()):
        print("     %s: %s" % (name, text.splitlines()[0][:300]), flush=True)
    when = os.path.join(a.out, "fault.time")
    if a.lost and os.path.exists(when):
        cut = float(open(when).read())
        # The lost host's process: ended with a message, every store call of its bounded.
        bound = 5 * float(os.environ.get("SUMO_TIMEOUT", "10"))
        mine = [t for n, t in errs.items() if n.startswith("host%d-" % a.fault_host)]
        took = float(mine[0].split()[0]) - cut if mine else None
        say(took is not None and took < bound,
            "%s: the process on the lost host ended with a message, %s after the fault "
            "(bound: %.0f s, 5 x SUMO_TIMEOUT)" % (a.what, "never" if took is None else
                                                   "%.1f s" % took, bound))
        after = [min((t for s, t, n in r["done"] if t > cut and n == survivors), default=None)
                 for r in res]
        # The survivors' watchers see the silent member's beat stand still and fail the
        # collective they are in (not its deadline, SUMO_TIMEOUT); the agreement then takes
        # it for dead after a liveness time of its own.
        limit = 3 * float(os.environ.get("SUMO_LIVENESS_TIMEOUT", "5")) + 2
        took = max(after) - cut if all(t is not None for t in after) else None
        say(took is not None and took < limit,
            "%s: recovery (fault -> next completed step on every survivor): %s (bound: %.0f s, "
            "3 x SUMO_LIVENESS_TIMEOUT + 2 s)"
            % (a.what, "never" if took is None else "%.2f s" % took, limit))
    return ok_all


def main():
    if os.environ.get("FAULTS_DUMP"):  # where a process waits, for a run that hangs
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["FAULTS_DUMP"]), exit=True)
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("elastic", "plain", "check"))
    p.add_argument("out")
    p.add_argument("size", type=int, nargs="?")
    p.add_argument("--fault", choices=("down", "cut"))
    p.add_argument("--fault-host", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--back-after", type=float, default=0)
    p.add_argument("--wait-joiners", type=int, default=0)
    p.add_argument("--bad-model-on", type=int, default=-1)
    p.add_argument("--refused", action="store_true")
    p.add_argument("--lost", type=int, default=0)
    p.add_argument("--what", default="job")
    a = p.parse_args()
    if a.mode == "elastic":
        elastic(a)
    elif a.mode == "plain":
        plain(a)
    else:
        sys.exit(0 if check(a) else 1)


if __name__ == "__main__":
    main()
