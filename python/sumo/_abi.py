"""Every C constant and struct the binding restates for ctypes, each under its name in
include/*.h, in one place, and check(lib), which compares them with the library that was
loaded: its version, each struct's size (sumo_struct_size), each constant's value
(sumo_enum_value). A library that lays out or numbers anything differently is refused at
import, naming what differs, instead of being handed bytes it reads otherwise. The rest of the
binding takes C values from here by name: no other module writes one as a number.

Adding a struct or a SUMO_ constant here is enough for check() to cover it. Field offsets are
not compared (the library does not report them): a field moved without changing the size
passes, so a change to a mirrored struct's fields is a change to this file.
"""
import ctypes

# The library's major.minor this mirror was written for (sumo_version).
SUMO_VERSION = (0, 3)

# -- sumo.h ------------------------------------------------------------------------------------
sumo_result = ctypes.c_int  # what every call returns (the enum's C type)
SUMO_SUCCESS = 0
SUMO_ERR_INVALID_ARGUMENT = 1
SUMO_ERR_INVALID_USAGE = 2
SUMO_ERR_MISMATCH = 3
SUMO_ERR_TIMEOUT = 4
SUMO_ERR_PEER_FAILURE = 5
SUMO_ERR_SYSTEM = 6
SUMO_ERR_INTERNAL = 7
SUMO_IN_PROGRESS = 8
SUMO_ERR_NONFINITE = 9

# sumo_dtype
SUMO_FLOAT32 = 0
SUMO_FLOAT64 = 1
SUMO_FLOAT16 = 2
SUMO_BFLOAT16 = 3

# sumo_op: the predefined ops (an op made by sumo_op_create_adasum is a value above them)
SUMO_OP_SUM = 0
SUMO_OP_AVERAGE = 1
SUMO_OP_ADASUM = 2

# sumo_comm_param and sumo_algorithm (sumo_comm_set_param)
SUMO_PARAM_ALGORITHM = 1
SUMO_PARAM_RESTORE_ON_FAILURE = 2
SUMO_ALGORITHM_AUTO = 0
SUMO_ALGORITHM_RANKED = 5
SUMO_ALGORITHM_CHAIN = 6
SUMO_ALGORITHM_TWO_LEVEL = 7

# sumo_compression_format
SUMO_COMPRESS_NONE = 0
SUMO_COMPRESS_BF16 = 1
SUMO_COMPRESS_FP8_E4M3 = 2
SUMO_COMPRESS_E3M0 = 3


class sumo_adasum_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("tensor_counts", ctypes.POINTER(ctypes.c_size_t)),
                ("ntensors", ctypes.c_size_t),
                ("hierarchical", ctypes.c_int),
                ("group_size", ctypes.c_int)]


# -- sumo_aggregation.h --------------------------------------------------------------------------
# sumo_aggregation
SUMO_AGGREGATE_SUM = 0
SUMO_AGGREGATE_AVERAGE = 1
SUMO_AGGREGATE_ADASUM = 2
SUMO_AGGREGATE_ACGA = 3


class sumo_acga_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("beta", ctypes.c_double),
                ("per_tensor", ctypes.c_int),
                ("reference_permutation", ctypes.c_int),
                ("negative_guard", ctypes.c_int),
                ("rescale", ctypes.c_int),
                ("eps", ctypes.c_double)]


class sumo_aggregator_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("method", ctypes.c_int),
                ("tensor_counts", ctypes.POINTER(ctypes.c_size_t)),
                ("ntensors", ctypes.c_size_t),
                ("adasum_hierarchical", ctypes.c_int),
                ("adasum_group_size", ctypes.c_int),
                ("acga", sumo_acga_options)]


class sumo_comm_stats(ctypes.Structure):
    _fields_ = [("rounds", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64)]


# -- sumo_diloco.h -------------------------------------------------------------------------------
# sumo_outer_optimizer
SUMO_OUTER_NESTEROV = 0
SUMO_OUTER_HEAVY_BALL = 1

# sumo_outer_combine
SUMO_COMBINE_AVERAGE = 0
SUMO_COMBINE_ADASUM = 1
SUMO_COMBINE_ACGA = 2

# sumo_diloco_preset
SUMO_DILOCO_PRESET_DILOCO = 0
SUMO_DILOCO_PRESET_STREAMING = 1
SUMO_DILOCO_PRESET_LOCALSGD = 2
SUMO_DILOCO_PRESET_SLOWMO = 3
SUMO_DILOCO_PRESET_BMUF = 4
SUMO_DILOCO_PRESET_SGP = 5
SUMO_DILOCO_PRESET_OSGP = 6
SUMO_DILOCO_PRESET_DPSGD = 7
SUMO_DILOCO_PRESET_SLOWMO_SGP = 8

# sumo_diloco_due's mask
SUMO_DILOCO_LOCAL = 0
SUMO_DILOCO_APPLY = 1
SUMO_DILOCO_START = 2
SUMO_DILOCO_AVERAGE = 4

# sumo_fragment_split
SUMO_SPLIT_TENSORS = 0
SUMO_SPLIT_RANGES = 1

# sumo_diloco_base
SUMO_BASE_LOCAL = 0
SUMO_BASE_SGP = 1
SUMO_BASE_OSGP = 2
SUMO_BASE_DPSGD = 3

# sumo_gossip_mode (sumo_gossip.h)
SUMO_GOSSIP_PUSH_SUM = 0
SUMO_GOSSIP_SYMMETRIC = 1


class sumo_diloco_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("sync_every", ctypes.c_int),
                ("fragments", ctypes.c_int),
                ("split", ctypes.c_int),
                ("fragment_of", ctypes.POINTER(ctypes.c_int)),
                ("delay", ctypes.c_int),
                ("merge_alpha", ctypes.c_double),
                ("outer", ctypes.c_int),
                ("lr", ctypes.c_double),
                ("momentum", ctypes.c_double),
                ("combine", ctypes.c_int),
                ("compression", ctypes.c_int),
                ("block_size", ctypes.c_size_t),
                ("acga", ctypes.POINTER(sumo_acga_options)),
                ("inner_period", ctypes.c_int),
                ("memory_efficient", ctypes.c_int),
                ("base", ctypes.c_int),
                ("gossip_peers", ctypes.c_int),
                ("gossip_staleness", ctypes.c_int),
                ("gossip_per_node", ctypes.c_int)]


# -- sumo_ext.h: a transport the binding supplies (torch/_pg_transport.py) -----------------------
# The types of sumo_transport_ops' operations. ERROR_MESSAGE returns an address, not a char *:
# ctypes would hand C a pointer into a Python bytes object freed on return.
SENDRECV = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_int64)
ALLGATHER = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_int64)
BARRIER = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_int64)
ABORT = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DESTROY = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p)
ERROR_MESSAGE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
CARRIES = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_char_p)


class sumo_transport_ops(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("name", ctypes.c_char_p),
                ("sendrecv", SENDRECV),
                ("allgather", ALLGATHER),
                ("barrier", BARRIER),
                ("abort", ABORT),
                ("destroy", DESTROY),
                ("error_message", ERROR_MESSAGE),
                ("carries", CARRIES)]


class sumo_transport_desc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("node_local_size", ctypes.c_int),
                ("ops", ctypes.POINTER(sumo_transport_ops)),
                ("ctx", ctypes.c_void_p)]


# -- sumo_ext.h: one collective as a struct, with the stream its kernels run on --------------
# sumo_collective_kind
SUMO_COLLECTIVE_ALLREDUCE = 1
SUMO_COLLECTIVE_BROADCAST = 2
SUMO_COLLECTIVE_ALLGATHER = 3
SUMO_COLLECTIVE_REDUCE_SCATTER = 4
SUMO_COLLECTIVE_BARRIER = 5


class sumo_collective(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("kind", ctypes.c_int),
                ("sendbuf", ctypes.c_void_p),
                ("recvbuf", ctypes.c_void_p),
                ("count", ctypes.c_size_t),
                ("dtype", ctypes.c_int),
                ("op", ctypes.c_uint32),
                ("root", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


# -- sumo_shm.h ----------------------------------------------------------------------------------
# The types of sumo_store's operations.
# sumo_rank_fn (sumo_threads_run): fn(comm, rank, arg)
RANK_FN = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)

STORE_SET = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.c_size_t)
STORE_GET = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_size_t), ctypes.c_int64)
STORE_REMOVE = ctypes.CFUNCTYPE(sumo_result, ctypes.c_void_p, ctypes.c_char_p)


class sumo_store(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("ctx", ctypes.c_void_p),
                ("set", STORE_SET),
                ("get", STORE_GET),
                ("set_once", STORE_SET),
                ("remove", STORE_REMOVE)]


class sumo_shm_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("stage_bytes", ctypes.c_size_t),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


# sumo.h's two-level communicator.
class sumo_hier_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("any", ctypes.c_void_p)]


# -- sumo_tcp.h ----------------------------------------------------------------------------------
class sumo_tcp_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("address", ctypes.c_char_p),
                ("route_host", ctypes.c_char_p),
                ("node_local_size", ctypes.c_int),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t),
                ("alive_prefix", ctypes.c_char_p),
                ("alive_ranks", ctypes.POINTER(ctypes.c_int)),
                ("alive_s", ctypes.c_double)]


# -- sumo_elastic.h ------------------------------------------------------------------------------
class sumo_shrink_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("value", ctypes.c_uint64),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


class sumo_shrink_info(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("value", ctypes.c_uint64),
                ("old_ranks", ctypes.POINTER(ctypes.c_int))]


class sumo_agree_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("value", ctypes.c_uint64),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("timeout_s", ctypes.c_double),
                ("alive_prefix", ctypes.c_char_p),
                ("alive_s", ctypes.c_double),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


class sumo_commit_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("made", ctypes.c_int),
                ("timeout_s", ctypes.c_double),
                ("alive_prefix", ctypes.c_char_p),
                ("alive_ranks", ctypes.POINTER(ctypes.c_int)),
                ("alive_s", ctypes.c_double),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


# sumo_elastic_transport, and sumo_elastic's options (sumo_elastic.h)
SUMO_ELASTIC_TCP = 0
SUMO_ELASTIC_SHM = 1


class sumo_elastic_making(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("alive_prefix", ctypes.c_char_p),
                ("alive_ranks", ctypes.POINTER(ctypes.c_int)),
                ("alive_s", ctypes.c_double)]


# sumo_result (*)(void *ctx, const sumo_elastic_making *, sumo_comm **, char *, size_t)
# (the error buffer as a plain pointer: a callback writes into it, which c_char_p's copy
# would not let it)
ELASTIC_MAKE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(sumo_elastic_making),
                                ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                ctypes.c_size_t)


class sumo_elastic_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("transport", ctypes.c_int),
                ("address", ctypes.c_char_p),
                ("route_host", ctypes.c_char_p),
                ("make", ELASTIC_MAKE),
                ("make_ctx", ctypes.c_void_p),
                ("liveness_s", ctypes.c_double),
                ("timeout_s", ctypes.c_double),
                ("join_wait_s", ctypes.c_double),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


class sumo_heart_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("store", ctypes.POINTER(sumo_store)),
                ("key_prefix", ctypes.c_char_p),
                ("rank", ctypes.c_int),
                ("period_s", ctypes.c_double),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


# -- sumo_bootstrap.h ----------------------------------------------------------------------------
SUMO_LAUNCHER_NONE = 0
SUMO_LAUNCHER_OPEN_MPI = 1
SUMO_LAUNCHER_PMI = 2
SUMO_LAUNCHER_PMIX = 3
SUMO_LAUNCHER_SRUN = 4
SUMO_LAUNCHER_TORCHRUN = 5
SUMO_LAUNCHER_ENV = 6
SUMO_LAUNCHER_STORE = 7
SUMO_LAUNCHER_UNSUPPORTED = 8
# The arrays' lengths (#defines, which sumo_enum_value does not know: the struct's size checks
# them).
_BOOTSTRAP_HOST_BYTES = 256
_BOOTSTRAP_ID_BYTES = 128
_BOOTSTRAP_STORE_BYTES = 512


class sumo_bootstrap_options(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("envp", ctypes.POINTER(ctypes.c_char_p)),
                ("store", ctypes.c_char_p),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


class sumo_bootstrap(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("launcher", ctypes.c_int),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("local_rank", ctypes.c_int),
                ("local_size", ctypes.c_int),
                ("nodes", ctypes.c_int),
                ("slurm_step", ctypes.c_int),
                ("host", ctypes.c_char * _BOOTSTRAP_HOST_BYTES),
                ("port", ctypes.c_int),
                ("run_id", ctypes.c_char * _BOOTSTRAP_ID_BYTES),
                ("store", ctypes.c_char * _BOOTSTRAP_STORE_BYTES)]


# -- the check -----------------------------------------------------------------------------------

def _mirrored():
    """(constants, structs) this module restates: every SUMO_ integer, every Structure."""
    names = globals()
    constants = {k: v for k, v in names.items()
                 if k.startswith("SUMO_") and isinstance(v, int)}
    structs = [v for v in names.values() if isinstance(v, type)
               and issubclass(v, ctypes.Structure) and v.__module__ == __name__]
    return constants, structs


def check(lib):
    """Raises ImportError unless `lib` is the library this mirror describes: its major.minor,
    then every struct's size and every constant's value, each compared by its C name."""
    where = lib._name
    needed = ("sumo_version", "sumo_struct_size", "sumo_enum_value")
    missing = [f for f in needed if not hasattr(lib, f)]
    if missing:
        raise ImportError("sumo: %s predates %s; this binding needs libsumo %d.%d with them "
                          "(rebuild with `make`)" % ((where, ", ".join(missing)) + SUMO_VERSION))
    v = [ctypes.c_int() for _ in range(3)]
    lib.sumo_version(*[ctypes.byref(x) for x in v])
    have = tuple(x.value for x in v)
    if have[:2] != SUMO_VERSION:
        raise ImportError("sumo: %s is libsumo %d.%d.%d, this binding was made for %d.%d "
                          "(rebuild with `make`, or point SUMO_LIBRARY at a matching build)"
                          % ((where,) + have + SUMO_VERSION))
    constants, structs = _mirrored()
    differ = []
    n = ctypes.c_size_t()
    for s in structs:
        name = s.__name__.encode()
        if lib.sumo_struct_size(name, ctypes.byref(n)) != SUMO_SUCCESS:
            differ.append("%s is not a struct it knows" % s.__name__)
        elif n.value != ctypes.sizeof(s):
            differ.append("%s is %d bytes there, %d here" % (s.__name__, n.value, ctypes.sizeof(s)))
    value = ctypes.c_int64()
    for name, ours in sorted(constants.items()):
        if lib.sumo_enum_value(name.encode(), ctypes.byref(value)) != SUMO_SUCCESS:
            differ.append("%s is not a constant it knows" % name)
        elif value.value != ours:
            differ.append("%s is %d there, %d here" % (name, value.value, ours))
    if differ:
        raise ImportError("sumo: %s does not match this binding's mirror of its headers "
                          "(python/sumo/_abi.py): %s (rebuild with `make`, or point "
                          "SUMO_LIBRARY at a matching build)" % (where, "; ".join(differ)))
