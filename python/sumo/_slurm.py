"""A Slurm job step (srun) as sumo joins it, read from the environment alone, so it is tested
without Slurm: the task's rank (SLURM_PROCID), the step's size (SLURM_NTASKS), the rank on its
node (SLURM_LOCALID), the first host of SLURM_STEP_NODELIST, where rank 0 listens, and a port
derived from SLURM_JOB_ID and SLURM_STEP_ID, so every task of a step computes the same one and
two steps of a job do not meet (MASTER_ADDR and MASTER_PORT, when set, win)."""
import re

# Where the derived ports lie: below Linux's ephemeral range (32768-60999), so a port the
# kernel handed to an outgoing connection is not what rank 0 asks for.
PORT_BASE = 12000
PORT_SPAN = 20000

REQUIRED = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
            "SLURM_JOB_ID", "SLURM_STEP_ID")


def in_step(environ):
    """Whether srun started this process as a task of a step of more than one task."""
    if "SLURM_STEP_ID" not in environ and "SLURM_STEP_NODELIST" not in environ:
        return False  # a batch script or salloc's shell: no step
    try:
        return int(environ.get("SLURM_NTASKS", "1") or 1) > 1
    except ValueError:
        return True  # let step() name the malformed variable


def _split(text):
    """Splits on the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError("hostlist %r: nested brackets" % text)
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("hostlist %r: ']' without '['" % text)
        elif c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("hostlist %r: '[' without ']'" % text)
    items.append(text[start:])
    return items


def _expand(name, whole):
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", name)
    if not m:
        return [name]
    prefix, body, rest = m.groups()
    values = []
    for piece in body.split(","):
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not r:
            raise ValueError("hostlist %r: %r is not a number or a range" % (whole, piece))
        lo, hi = r.group(1), r.group(2) if r.group(2) is not None else r.group(1)
        if int(hi) < int(lo):
            raise ValueError("hostlist %r: range %s runs backwards" % (whole, piece))
        width = len(lo)  # node[01-10]: zero padded to the width of the first bound
        values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    tails = _expand(rest, whole)
    return [prefix + v + t for v in values for t in tails]


def expand_hostlist(text):
    """Slurm's hostlist syntax expanded, in order: "node[01-04,07],login" -> node01, node02,
    node03, node04, node07, login; several bracket groups in one name multiply out
    ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2). ValueError for a malformed list."""
    hosts = []
    for item in _split(text.strip()):
        if not item:
            raise ValueError("hostlist %r: an empty name" % text)
        hosts += _expand(item, text)
    return hosts


def step(environ):
    """The task's place in its step: a dict of rank, size, local_rank, host (rank 0's: the
    first of SLURM_STEP_NODELIST, or MASTER_ADDR) and port (MASTER_PORT, or derived from the
    job and step ids). RuntimeError naming the variable that is missing or malformed."""
    missing = [v for v in REQUIRED if not environ.get(v)]
    if missing:
        raise RuntimeError("sumo: started by srun, but %s %s not set: cannot join the job step "
                           "(run the tasks with srun, or set them)"
                           % (", ".join(missing), "is" if len(missing) == 1 else "are"))
    ints = {}
    for var in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        try:
            ints[var] = int(environ[var])
        except ValueError:
            raise RuntimeError("sumo: %s=%r is not a number" % (var, environ[var])) from None
    rank, size = ints["SLURM_PROCID"], ints["SLURM_NTASKS"]
    if not 0 <= rank < size:
        raise RuntimeError("sumo: SLURM_PROCID=%d is not a rank of SLURM_NTASKS=%d" % (rank, size))
    try:
        hosts = expand_hostlist(environ["SLURM_STEP_NODELIST"])
    except ValueError as e:
        raise RuntimeError("sumo: SLURM_STEP_NODELIST: %s" % e) from None
    port = environ.get("MASTER_PORT")
    if port:
        try:
            port = int(port)
        except ValueError:
            raise RuntimeError("sumo: MASTER_PORT=%r is not a number" % port) from None
    else:
        port = PORT_BASE + (ints["SLURM_JOB_ID"] * 64 + ints["SLURM_STEP_ID"]) % PORT_SPAN
    return {"rank": rank, "size": size, "local_rank": ints["SLURM_LOCALID"],
            "host": environ.get("MASTER_ADDR") or hosts[0], "port": port}
