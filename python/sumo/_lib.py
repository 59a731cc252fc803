"""ctypes binding of libsumo: the library handle, function signatures, status -> exception.
The structs and constants the signatures name are _abi's, which checks them against the
library loaded here before anything is called.

The C API is flat (opaque handles, pointers, counts and a status code per call), so ctypes
covers it without a compiled extension, and every foreign call releases the GIL: a thread
blocked in sumo_request_wait does not stop the training loop.
"""
import ctypes
import os

from . import _abi
from ._abi import (SUMO_SUCCESS, sumo_adasum_options, sumo_aggregator_options,
                   sumo_agree_options, sumo_bootstrap, sumo_bootstrap_options, sumo_collective,
                   sumo_comm_stats, sumo_diloco_options, sumo_heart_options, sumo_hier_options,
                   sumo_shrink_info, sumo_shrink_options)

_c_comm_p = ctypes.c_void_p
_c_req_p = ctypes.c_void_p


class SumoError(RuntimeError):
    """A sumo call failed. `code` is the sumo_result, `name` its enumerator, and the message
    holds sumo_strerror's sentence and the communicator's detail (which rank, which tensor)."""

    def __init__(self, code, name, message):
        super().__init__(message)
        self.code = code
        self.name = name


def _candidates():
    """(path, where it comes from): the copy `pip install .` put in the package (sumo/_libs),
    an explicit path, the build folder of the checkout this package sits in (python/sumo ->
    build/: the checkout itself, or an editable install), the dynamic linker's search path
    (`make install`)."""
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "_libs", "libsumo.so.0"), "the package's own"
    env = os.environ.get("SUMO_LIBRARY")
    if env:
        yield env, "SUMO_LIBRARY"
    yield os.path.join(here, "..", "..", "build", "libsumo.so.0"), "the checkout's build/"
    yield "libsumo.so.0", "the system's (the dynamic linker's path)"


def _load():
    errors = []
    for path, source in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append("%s (%s): not there" % (path, source))
            continue
        try:
            # libsumo_mpi (mpi() below) binds to this copy: the dynamic linker matches its
            # dependency on libsumo.so.0 with the soname of the library already loaded.
            return ctypes.CDLL(path), source
        except OSError as e:
            errors.append("%s (%s): %s" % (path, source, e))
    raise ImportError("sumo: cannot load libsumo.so.0 (`pip install .` from sumo's checkout "
                      "builds it into the package; or build it with `make`, or set "
                      "SUMO_LIBRARY):\n  " + "\n  ".join(errors))


# SOURCE: which of _candidates() it is, for the build report (python -m sumo).
lib, SOURCE = _load()

_R = _abi.sumo_result
_SIGS = {
    "sumo_version": (_R, [ctypes.POINTER(ctypes.c_int)] * 3),
    "sumo_kernel_isa": (_R, [ctypes.POINTER(ctypes.c_char_p)]),
    "sumo_struct_size": (_R, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_enum_value": (_R, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
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
    "sumo_op_create_adasum": (_R, [_c_comm_p, ctypes.POINTER(sumo_adasum_options),
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
    "sumo_join": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_comm_get_stats": (_R, [_c_comm_p, ctypes.POINTER(sumo_comm_stats)]),
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
    "sumo_aggregator_options_default": (_R, [ctypes.c_int,
                                             ctypes.POINTER(sumo_aggregator_options)]),
    "sumo_aggregator_create": (_R, [_c_comm_p, ctypes.POINTER(sumo_aggregator_options),
                                    ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_aggregator_destroy": (_R, [ctypes.c_void_p]),
    "sumo_aggregator_apply": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int]),
    "sumo_aggregator_apply_into": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_int]),
    "sumo_aggregator_state_size": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]),
    "sumo_aggregator_state_save": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_aggregator_state_load": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_diloco_options_default": (_R, [ctypes.c_int, ctypes.POINTER(sumo_diloco_options)]),
    "sumo_diloco_create": (_R, [_c_comm_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(sumo_diloco_options),
                                ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_diloco_destroy": (_R, [ctypes.c_void_p]),
    # sumo_gossip.h, with the default options (NULL) only: the DDP gossip hook's rounds.
    "sumo_gossip_create": (_R, [_c_comm_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_gossip_destroy": (_R, [ctypes.c_void_p]),
    "sumo_gossip_round": (_R, [ctypes.c_void_p, ctypes.c_void_p]),
    "sumo_gossip_weight": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]),
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
    "sumo_diloco_stats": (_R, [ctypes.c_void_p, ctypes.POINTER(sumo_comm_stats)]),
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
    "sumo_comm_create_tcp": (_R, [ctypes.c_void_p, ctypes.POINTER(_c_comm_p)]),
    "sumo_hier_options_default": (_R, [ctypes.POINTER(sumo_hier_options)]),
    "sumo_comm_create_hier": (_R, [_c_comm_p, _c_comm_p, ctypes.POINTER(sumo_hier_options),
                                   ctypes.POINTER(_c_comm_p)]),
    "sumo_comm_hier_add_across": (_R, [_c_comm_p, _c_comm_p]),
    "sumo_store_create_dir": (_R, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_store_destroy_dir": (_R, [ctypes.c_void_p, ctypes.c_int]),
    "sumo_shrink_options_default": (_R, [ctypes.POINTER(sumo_shrink_options)]),
    "sumo_comm_shrink": (_R, [_c_comm_p, ctypes.POINTER(sumo_shrink_options),
                              ctypes.POINTER(_c_comm_p), ctypes.POINTER(sumo_shrink_info)]),
    "sumo_agree_options_default": (_R, [ctypes.POINTER(sumo_agree_options)]),
    "sumo_store_agree": (_R, [ctypes.POINTER(sumo_agree_options),
                              ctypes.POINTER(sumo_shrink_info)]),
    "sumo_commit_options_default": (_R, [ctypes.POINTER(_abi.sumo_commit_options)]),
    "sumo_store_commit": (_R, [ctypes.POINTER(_abi.sumo_commit_options)]),
    "sumo_ticket_take": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p,
                              ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_tickets_count": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p, ctypes.c_int,
                                ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_ticket_place": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p, ctypes.c_int,
                               ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_ticket_wait": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p, ctypes.c_int,
                              ctypes.c_double, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                              ctypes.c_size_t]),
    "sumo_tickets_close": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p,
                                ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_elastic_options_default": (_R, [ctypes.POINTER(_abi.sumo_elastic_options)]),
    "sumo_elastic_create": (_R, [ctypes.POINTER(_abi.sumo_elastic_options),
                                 ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_elastic_join": (_R, [ctypes.POINTER(_abi.sumo_elastic_options),
                               ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_elastic_comm": (_R, [ctypes.c_void_p, ctypes.POINTER(_c_comm_p)]),
    "sumo_elastic_generation": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_elastic_commit": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_elastic_shrink": (_R, [ctypes.c_void_p, ctypes.c_uint64,
                                 ctypes.POINTER(sumo_shrink_info)]),
    "sumo_elastic_grow": (_R, [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "sumo_elastic_close": (_R, [ctypes.c_void_p]),
    "sumo_elastic_error_message": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]),
    "sumo_elastic_destroy": (_R, [ctypes.c_void_p]),
    "sumo_heart_options_default": (_R, [ctypes.POINTER(sumo_heart_options)]),
    "sumo_heart_start": (_R, [ctypes.POINTER(sumo_heart_options),
                              ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_heart_beat": (_R, [ctypes.c_void_p]),
    "sumo_heart_move": (_R, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]),
    "sumo_heart_error": (_R, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_heart_stop": (_R, [ctypes.c_void_p]),
    "sumo_heart_watch_create": (_R, [ctypes.POINTER(_abi.sumo_store), ctypes.c_char_p,
                                     ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_double,
                                     ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_heart_watch_look": (_R, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]),
    "sumo_heart_watch_destroy": (_R, [ctypes.c_void_p]),
    "sumo_comm_set_param": (_R, [_c_comm_p, ctypes.c_int, ctypes.c_int]),
    "sumo_threads_run": (_R, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.POINTER(_abi.sumo_result)]),
    "sumo_bootstrap_options_default": (_R, [ctypes.POINTER(sumo_bootstrap_options)]),
    "sumo_bootstrap_detect": (_R, [ctypes.POINTER(sumo_bootstrap_options),
                                   ctypes.POINTER(sumo_bootstrap)]),
    "sumo_launcher_name": (ctypes.c_char_p, [ctypes.c_int]),
    "sumo_hostlist_get": (_R, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                               ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                               ctypes.c_char_p, ctypes.c_size_t]),
    "sumo_collective_run": (_R, [_c_comm_p, ctypes.POINTER(sumo_collective)]),
    "sumo_collective_start": (_R, [_c_comm_p, ctypes.POINTER(sumo_collective),
                                   ctypes.POINTER(_c_req_p)]),
}
# libsumo_mpi's (mpi() below).
_MPI_SIGS = {
    "sumo_mpi_world_create": (_R, [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_c_comm_p)]),
    "sumo_mpi_world_local": (_R, [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "sumo_mpi_world_finalize": (_R, [_c_comm_p, ctypes.c_int]),
    "sumo_mpi_world_abort": (_R, [ctypes.c_int]),
}
# libsumo_cuda's (cuda() below; include/sumo_cuda.h).
_CUDA_SIGS = {
    "sumo_cuda_device_count": (_R, [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                    ctypes.c_size_t]),
    "sumo_cuda_kernels_create": (_R, [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]),
    "sumo_cuda_kernels_destroy": (_R, [ctypes.c_void_p]),
    "sumo_comm_add_cuda": (_R, [_c_comm_p, ctypes.c_void_p]),
    "sumo_cuda_allreduce": (_R, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_int, ctypes.c_uint32, _c_comm_p, ctypes.c_void_p]),
    "sumo_nccl_unique_id": (_R, [ctypes.c_void_p, ctypes.c_size_t]),
    "sumo_comm_create_nccl_rank": (_R, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.POINTER(_c_comm_p)]),
}

for _name, (_res, _args) in _SIGS.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _res
        _fn.argtypes = _args

_abi.check(lib)


def _path():
    """The file the dynamic linker loaded as libsumo (lib._name may be a bare soname)."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    info = DlInfo()
    dladdr = getattr(ctypes.CDLL(None), "dladdr", None)  # in libc from glibc 2.34, else libdl
    if dladdr is not None:
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        if dladdr(ctypes.cast(lib.sumo_version, ctypes.c_void_p), ctypes.byref(info)) \
                and info.dli_fname:
            return os.path.normpath(os.fsdecode(info.dli_fname))
    return lib._name


PATH = _path()
# The plugins beside it: the package's _libs/, the build folder or the installed lib/.
MPI_LIBRARY = os.path.join(os.path.dirname(PATH), "libsumo_mpi.so.%d" % _abi.SUMO_VERSION[0])
CUDA_LIBRARY = os.path.join(os.path.dirname(PATH), "libsumo_cuda.so")


# The MPI transport is a library of its own beside libsumo, loaded only when a launch asks for
# MPI: a process started by torchrun never loads Open MPI. It binds libsumo's internals under
# the node SUMO_PRIVATE_<version>, so the dynamic linker refuses one of another version than
# the libsumo checked above.
HAVE_MPI = os.path.exists(MPI_LIBRARY)
_mpi = None


def mpi():
    """libsumo_mpi, loaded on the first call."""
    global _mpi
    if _mpi is None:
        try:
            # RTLD_GLOBAL: Open MPI loads its components with dlopen, and they resolve
            # libmpi's symbols through the global namespace.
            handle = ctypes.CDLL(MPI_LIBRARY, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise RuntimeError("sumo: cannot load the MPI transport beside %s (rebuild with "
                               "`make`): %s" % (lib._name, e)) from None
        for name, (res, args) in _MPI_SIGS.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = res, args
        _mpi = handle
    return _mpi


# libsumo_cuda (include/sumo_cuda.h) beside libsumo, loaded when a CUDA tensor or the NCCL
# transport first needs it: a CPU-only program never loads it (nor the CUDA runtime).
_cuda = None


def cuda():
    """libsumo_cuda, loaded on the first call; RuntimeError saying why when it cannot be
    (not built: no nvcc when libsumo was made; or it does not load)."""
    global _cuda
    if _cuda is None:
        if not os.path.exists(CUDA_LIBRARY):
            raise RuntimeError("libsumo_cuda is not built beside %s (make builds it where nvcc "
                               "is found)" % PATH)
        try:
            handle = ctypes.CDLL(CUDA_LIBRARY)
        except OSError as e:
            raise RuntimeError("cannot load %s: %s" % (CUDA_LIBRARY, e)) from None
        for name, (res, args) in _CUDA_SIGS.items():
            fn = getattr(handle, name)
            fn.restype, fn.argtypes = res, args
        _cuda = handle
    return _cuda


def cuda_devices():
    """(count, why): the CUDA devices libsumo_cuda can use, and its sentence about them (the
    reason where there are none)."""
    n = ctypes.c_int()
    why = ctypes.create_string_buffer(256)
    code = cuda().sumo_cuda_device_count(ctypes.byref(n), why, len(why))
    if code != SUMO_SUCCESS:
        return 0, "sumo_cuda_device_count failed (%s)" % result_name(code)
    return n.value, why.value.decode(errors="replace")


def version():
    """The loaded library's version, "major.minor.patch"."""
    v = [ctypes.c_int() for _ in range(3)]
    lib.sumo_version(*[ctypes.byref(x) for x in v])
    return "%d.%d.%d" % tuple(x.value for x in v)


def result_name(code):
    return lib.sumo_result_name(code).decode()


def error(code, comm=None, what=None):
    """The exception for status `code`, with the communicator's detail when there is one."""
    text = lib.sumo_strerror(code).decode()
    detail = ""
    if comm:
        msg = ctypes.c_char_p()
        if lib.sumo_comm_error_message(comm, ctypes.byref(msg)) == SUMO_SUCCESS and msg.value:
            detail = msg.value.decode(errors="replace")
    parts = [p for p in (what, "%s: %s" % (result_name(code), text), detail) if p]
    return SumoError(code, result_name(code), " - ".join(parts))


def check(code, comm=None, what=None):
    if code != SUMO_SUCCESS:
        raise error(code, comm, what)


class Launch:
    """The launch sumo_bootstrap_detect read (include/sumo_bootstrap.h): `launcher` (a
    SUMO_LAUNCHER_ value) and `name` (its name for messages), rank, size, local_rank,
    local_size and nodes (-1 where the launcher does not say), slurm_step, host and port (where
    rank 0 listens; "" and 0 where it does not say), run_id, store; `code` SUMO_SUCCESS, else
    the refusal's (SUMO_ERR_INVALID_USAGE: a launcher sumo does not join;
    SUMO_ERR_INVALID_ARGUMENT: a variable missing or malformed) with its sentence in
    `message`."""

    def __init__(self, code, b, message):
        self.code, self.message = code, message
        self.launcher = b.launcher
        self.name = lib.sumo_launcher_name(b.launcher).decode()
        for field in ("rank", "size", "local_rank", "local_size", "nodes"):
            setattr(self, field, getattr(b, field))
        self.slurm_step = bool(b.slurm_step)
        self.host = b.host.decode(errors="replace")
        self.port = b.port
        self.run_id = b.run_id.decode(errors="replace")
        self.store = b.store.decode(errors="replace")

    def __repr__(self):
        return "Launch(%s, rank %d of %d, code %d%s)" % (
            self.name, self.rank, self.size, self.code, ": " + self.message if self.code else "")


def bootstrap(environ=None, store=None, rank=0, size=0):
    """Who started this process, read by libsumo from environ (a mapping; None: os.environ)
    and, when given, a store's address with this process's rank and size: a Launch. The
    binding keeps no list of launcher variables of its own."""
    environ = os.environ if environ is None else environ
    entries = [("%s=%s" % (k, v)).encode("utf-8", "surrogateescape") for k, v in environ.items()]
    envp = (ctypes.c_char_p * (len(entries) + 1))(*entries, None)
    opts = sumo_bootstrap_options()
    lib.sumo_bootstrap_options_default(ctypes.byref(opts))
    message = ctypes.create_string_buffer(512)
    opts.envp = ctypes.cast(envp, ctypes.POINTER(ctypes.c_char_p))
    opts.store = store.encode() if store is not None else None
    opts.rank, opts.size = rank, size
    opts.error, opts.error_bytes = ctypes.cast(message, ctypes.c_char_p), len(message)
    out = sumo_bootstrap()
    code = lib.sumo_bootstrap_detect(ctypes.byref(opts), ctypes.byref(out))
    return Launch(code, out, message.value.decode(errors="replace"))


def expand_hostlist(text):
    """Slurm's hostlist syntax expanded by libsumo, in order ("node[01-03,07],gpu5" -> node01,
    node02, node03, node07, gpu5); ValueError with libsumo's sentence for a malformed list."""
    host = ctypes.create_string_buffer(256)
    why = ctypes.create_string_buffer(256)
    count = ctypes.c_size_t()
    hosts = []
    i = 0
    while True:
        code = lib.sumo_hostlist_get(text.encode(), i, host, len(host), ctypes.byref(count),
                                     why, len(why))
        if code != SUMO_SUCCESS:
            raise ValueError(why.value.decode(errors="replace"))
        hosts.append(host.value.decode())
        i += 1
        if i >= count.value:
            return hosts
