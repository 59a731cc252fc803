"""ctypes binding of libsumo: the library handle, function signatures, status -> exception.

The C API is flat (opaque handles, pointers, counts and a status code per call), so ctypes
covers it without a compiled extension, and every foreign call releases the GIL: a thread
blocked in sumo_request_wait does not stop the training loop.
"""
import ctypes
import os

SUCCESS = 0
IN_PROGRESS = 8

# sumo_dtype
FLOAT32, FLOAT64, FLOAT16, BFLOAT16 = 0, 1, 2, 3

# sumo_aggregation
AGGREGATE_SUM, AGGREGATE_AVERAGE, AGGREGATE_ADASUM, AGGREGATE_ACGA = 0, 1, 2, 3

_c_comm_p = ctypes.c_void_p
_c_req_p = ctypes.c_void_p


class SumoError(RuntimeError):
    """A sumo call failed. `code` is the sumo_result, `name` its enumerator, and the message
    holds sumo_strerror's sentence and the communicator's detail (which rank, which tensor)."""

    def __init__(self, code, name, message):
        super().__init__(message)
        self.code = code
        self.name = name


class AdasumOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("tensor_counts", ctypes.POINTER(ctypes.c_size_t)),
                ("ntensors", ctypes.c_size_t),
                ("hierarchical", ctypes.c_int),
                ("group_size", ctypes.c_int)]


class AcgaOptions(ctypes.Structure):
    _fields_ = [("beta", ctypes.c_double),
                ("per_tensor", ctypes.c_int),
                ("reference_permutation", ctypes.c_int),
                ("negative_guard", ctypes.c_int),
                ("rescale", ctypes.c_int),
                ("eps", ctypes.c_double)]


class AggregatorOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("method", ctypes.c_int),
                ("tensor_counts", ctypes.POINTER(ctypes.c_size_t)),
                ("ntensors", ctypes.c_size_t),
                ("adasum_hierarchical", ctypes.c_int),
                ("adasum_group_size", ctypes.c_int),
                ("acga", AcgaOptions)]


class ShmOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("rank", ctypes.c_int),
                ("size", ctypes.c_int),
                ("store", ctypes.c_void_p),
                ("key_prefix", ctypes.c_char_p),
                ("stage_bytes", ctypes.c_size_t),
                ("error", ctypes.c_char_p),
                ("error_bytes", ctypes.c_size_t)]


class DiLoCoOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("sync_every", ctypes.c_int),
                ("fragments", ctypes.c_int),
                ("fragment_of", ctypes.POINTER(ctypes.c_int)),
                ("delay", ctypes.c_int),
                ("merge_alpha", ctypes.c_double),
                ("outer", ctypes.c_int),
                ("lr", ctypes.c_double),
                ("momentum", ctypes.c_double),
                ("combine", ctypes.c_int),
                ("compression", ctypes.c_int),
                ("block_size", ctypes.c_size_t),
                ("acga", ctypes.POINTER(AcgaOptions))]


class CommStats(ctypes.Structure):
    _fields_ = [("rounds", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64)]


def _candidates():
    # An explicit path first, then the build folder of the checkout this package sits in
    # (python/sumo -> build/), then the dynamic linker's search path (an installed copy).
    env = os.environ.get("SUMO_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libsumo.so.0")
    yield "libsumo.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            # RTLD_GLOBAL: Open MPI loads its components with dlopen, and they resolve
            # libmpi's symbols through the global namespace.
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise ImportError("sumo: cannot load libsumo.so.0 (build it with `make`, or set "
                      "SUMO_LIBRARY):\n  " + "\n  ".join(errors))


lib = _load()

_R = ctypes.c_int  # sumo_result
_SIGS = {
    "sumo_version": (_R, [ctypes.POINTER(ctypes.c_int)] * 3),
    "sumo_struct_size": (_R, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_strerror": (ctypes.c_char_p, [_R]),
    "sumo_result_name": (ctypes.c_char_p, [_R]),
    "sumo_comm_create_threads": (_R, [ctypes.c_int, ctypes.POINTER(_c_comm_p)]),
    "sumo_comm_destroy": (_R, [_c_comm_p]),
    "sumo_comm_rank": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_comm_size": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_comm_transport": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_char_p)]),
    "sumo_comm_set_timeout": (_R, [_c_comm_p, ctypes.c_double]),
    "sumo_comm_get_timeout": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_double)]),
    "sumo_comm_error_message": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_char_p)]),
    "sumo_op_create_adasum": (_R, [_c_comm_p, ctypes.POINTER(AdasumOptions),
                                   ctypes.POINTER(ctypes.c_uint32)]),
    "sumo_op_destroy": (_R, [_c_comm_p, ctypes.c_uint32]),
    "sumo_allreduce": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_uint32, _c_comm_p]),
    "sumo_allreduce_start": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int, ctypes.c_uint32, _c_comm_p,
                                  ctypes.POINTER(_c_req_p)]),
    "sumo_request_wait": (_R, [_c_req_p]),
    "sumo_request_test": (_R, [_c_req_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_allgather": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            _c_comm_p]),
    "sumo_broadcast": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_int, _c_comm_p]),
    "sumo_barrier": (_R, [_c_comm_p]),
    "sumo_broadcast_start": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.c_int, _c_comm_p, ctypes.POINTER(_c_req_p)]),
    "sumo_allgather_start": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  _c_comm_p, ctypes.POINTER(_c_req_p)]),
    "sumo_reduce_scatter": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                 ctypes.c_uint32, _c_comm_p]),
    "sumo_reduce_scatter_start": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int, ctypes.c_uint32, _c_comm_p,
                                       ctypes.POINTER(_c_req_p)]),
    "sumo_mem_alloc": (_R, [_c_comm_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_mem_free": (_R, [_c_comm_p, ctypes.c_void_p]),
    "sumo_aggregator_options_default": (_R, [ctypes.c_int, ctypes.POINTER(AggregatorOptions)]),
    "sumo_aggregator_create": (_R, [_c_comm_p, ctypes.POINTER(AggregatorOptions),
                                    ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_aggregator_destroy": (_R, [ctypes.c_void_p]),
    "sumo_aggregator_apply": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int]),
    "sumo_aggregator_apply_into": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_int]),
    "sumo_aggregator_state_size": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_aggregator_state_save": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_aggregator_state_load": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_slowmo_create": (_R, [_c_comm_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_slowmo_destroy": (_R, [ctypes.c_void_p]),
    "sumo_slowmo_begin": (_R, [ctypes.c_void_p, ctypes.c_void_p]),
    "sumo_slowmo_end": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double,
                             ctypes.POINTER(ctypes.c_int)]),
    "sumo_slowmo_due": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_slowmo_state_size": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_slowmo_state_save": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_slowmo_state_load": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_diloco_options_preset": (_R, [ctypes.c_int, ctypes.POINTER(DiLoCoOptions)]),
    "sumo_diloco_create": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(DiLoCoOptions),
                                ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_diloco_destroy": (_R, [ctypes.c_void_p]),
    "sumo_diloco_begin": (_R, [ctypes.c_void_p, ctypes.c_void_p]),
    "sumo_diloco_end": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double,
                             ctypes.POINTER(ctypes.c_int)]),
    "sumo_diloco_due": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                             ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "sumo_diloco_fragment": (_R, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t),
                                  ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_diloco_fragment_runs": (_R, [ctypes.c_void_p, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t]),
    "sumo_diloco_synchronized": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_diloco_state_size": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_diloco_state_save": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_diloco_state_load": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_diloco_stats": (_R, [ctypes.c_void_p, ctypes.POINTER(CommStats)]),
    "sumo_diloco_extra_memory": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_delta_compute": (_R, [_c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_int]),
    "sumo_delta_apply": (_R, [_c_comm_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int]),
    "sumo_aggregator_apply_start": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_size_t, ctypes.c_int,
                                         ctypes.POINTER(_c_req_p)]),
    "sumo_comm_fail": (_R, [_c_comm_p, ctypes.c_int, ctypes.c_char_p]),
    "sumo_comm_abort": (_R, [_c_comm_p, ctypes.c_char_p]),
    "sumo_env_check": (_R, [ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_setting": (_R, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
    "sumo_comm_create_transport": (_R, [ctypes.c_void_p, ctypes.POINTER(_c_comm_p)]),
    "sumo_comm_create_shm": (_R, [ctypes.c_void_p, ctypes.POINTER(_c_comm_p)]),
    # Present only in a library built with MPI.
    "sumo_mpi_world_create": (_R, [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_c_comm_p)]),
    "sumo_mpi_world_local": (_R, [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "sumo_mpi_world_finalize": (_R, [_c_comm_p, ctypes.c_int]),
    "sumo_mpi_world_abort": (_R, [ctypes.c_int]),
}

for _name, (_res, _args) in _SIGS.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _res
        _fn.argtypes = _args

HAVE_MPI = hasattr(lib, "sumo_mpi_world_create")

# The library's version this binding was written for: its structs and enums are mirrored by
# hand above, so a library of another major.minor may read them differently.
ABI = (0, 2)


def _check_abi():
    if not hasattr(lib, "sumo_version"):
        raise ImportError("sumo: %s predates sumo_version(); this binding needs libsumo %d.%d "
                          "(rebuild with `make`)" % (lib._name, ABI[0], ABI[1]))
    v = [ctypes.c_int() for _ in range(3)]
    lib.sumo_version(*[ctypes.byref(x) for x in v])
    have = tuple(x.value for x in v)
    if have[:2] != ABI:
        raise ImportError("sumo: %s is libsumo %d.%d.%d, this binding was made for %d.%d "
                          "(rebuild with `make`, or point SUMO_LIBRARY at a matching build)"
                          % ((lib._name,) + have + ABI))
    for struct in (AdasumOptions, AcgaOptions, AggregatorOptions, ShmOptions, DiLoCoOptions,
                   CommStats):
        name = "sumo_" + {"AdasumOptions": "adasum_options", "AcgaOptions": "acga_options",
                          "AggregatorOptions": "aggregator_options",
                          "ShmOptions": "shm_options", "DiLoCoOptions": "diloco_options",
                          "CommStats": "comm_stats"}[struct.__name__]
        n = ctypes.c_size_t()
        if lib.sumo_struct_size(name.encode(), ctypes.byref(n)) != SUCCESS \
                or n.value != ctypes.sizeof(struct):
            raise ImportError("sumo: %s lays out %s in %d bytes, this binding in %d"
                              % (lib._name, name, n.value, ctypes.sizeof(struct)))


_check_abi()


def result_name(code):
    return lib.sumo_result_name(code).decode()


def error(code, comm=None, what=None):
    """The exception for status `code`, with the communicator's detail when there is one."""
    text = lib.sumo_strerror(code).decode()
    detail = ""
    if comm:
        msg = ctypes.c_char_p()
        if lib.sumo_comm_error_message(comm, ctypes.byref(msg)) == SUCCESS and msg.value:
            detail = msg.value.decode(errors="replace")
    parts = [p for p in (what, "%s: %s" % (result_name(code), text), detail) if p]
    return SumoError(code, result_name(code), " - ".join(parts))


def check(code, comm=None, what=None):
    if code != SUCCESS:
        raise error(code, comm, what)
