"""Independent references for the tests: Adasum's pairwise tree in float64 per tensor, as
include/sumo.h defines it, written without sumo."""
import torch

_TINY = 2.0 ** -511


def adasum_pair(a, b):
    dot = float(torch.dot(a, b))
    na, nb = float(torch.dot(a, a)), float(torch.dot(b, b))
    ca = 1.0 if na < _TINY else 1.0 - dot / (2 * na)
    cb = 1.0 if nb < _TINY else 1.0 - dot / (2 * nb)
    return ca * a + cb * b


def adasum_tree(vectors):
    """P vectors -> Adasum: the first 2R ranks pair up (R = P - largest power of two <= P),
    then a balanced tree in rank order, lower rank on the left."""
    v = [x.to(torch.float64).reshape(-1) for x in vectors]
    p = len(v)
    p2 = 1
    while p2 * 2 <= p:
        p2 *= 2
    r = p - p2
    level = [adasum_pair(v[2 * i], v[2 * i + 1]) for i in range(r)] + v[2 * r:]
    while len(level) > 1:
        level = [adasum_pair(level[2 * i], level[2 * i + 1]) for i in range(len(level) // 2)]
    return level[0]


def adasum_per_tensor(per_rank_tensors):
    """per_rank_tensors[r][k]: rank r's tensor k. Returns the combined tensors (float64)."""
    ntensors = len(per_rank_tensors[0])
    return [adasum_tree([ranks[k] for ranks in per_rank_tensors]).view(per_rank_tensors[0][k].shape)
            for k in range(ntensors)]
