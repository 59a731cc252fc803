"""Which host each rank runs on, and whether the hosts are the shape a two-level communicator
takes (every host a block of the same number of consecutive ranks). A module because init()
and the tests that build hosts of their own choosing ask the same two questions.
"""


def hosts_of(where, local_size):
    """Host index per rank (hosts numbered by their lowest rank): from where each rank runs,
    or, with SUMO_LOCAL_SIZE = local_size, blocks of that many consecutive ranks. A simulated
    host must lie inside one real host (its ranks share memory)."""
    size = len(where)
    if local_size:
        hosts = [r // local_size for r in range(size)]
        for r in range(size):
            if where[r] != where[hosts[r] * local_size]:
                raise RuntimeError(
                    "sumo.torch.init: SUMO_LOCAL_SIZE=%d puts ranks %d and %d on one host, but "
                    "they run on different machines" % (local_size, hosts[r] * local_size, r))
        return hosts
    first = {}
    for r in range(size):
        first.setdefault(where[r], len(first))
    return [first[w] for w in where]


def blocks(hosts):
    """L when every host holds L consecutive ranks (rank = host * L + local rank), the shape
    sumo_comm_create_hier composes; 0 otherwise (ranks of a host not consecutive, or hosts
    of different sizes)."""
    size = len(hosts)
    nhosts = max(hosts) + 1 if hosts else 0
    if nhosts == 0 or size % nhosts:
        return 0
    per = size // nhosts
    return per if all(hosts[r] == r // per for r in range(size)) else 0
