"""`python -m sumo`: a build report to paste into a bug. The library's version and the
package's, where the library was loaded from and why there, the instruction set of its
kernels, the transports built (threads and shared memory always; MPI, and which, where
libsumo_mpi is there; CUDA and NCCL where libsumo_cuda is), Python and torch."""
import ctypes
import os
import platform
import sys

from . import _lib


def _package_version():
    try:
        from importlib import metadata
        return metadata.version("sumo")
    except Exception:  # not installed (the checkout on sys.path), or Python < 3.8
        return None


def _mapped(fragment):
    """The files of this process whose name holds `fragment` (what the dynamic linker loaded)."""
    found = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
                if fragment in os.path.basename(path) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _mpi():
    if not _lib.HAVE_MPI:
        return "not built (no mpicc when the library was made)"
    try:
        handle = _lib.mpi()
    except RuntimeError as e:
        return "built, does not load: %s" % e
    # MPI_Get_library_version may be called before MPI_Init. The longest
    # MPI_MAX_LIBRARY_VERSION_STRING is MPICH's, 8192.
    text = ctypes.create_string_buffer(8192)
    n = ctypes.c_int()
    name = "unknown MPI"
    fn = getattr(handle, "MPI_Get_library_version", None)
    if fn is not None and fn(text, ctypes.byref(n)) == 0:
        # "Open MPI v4.1.4, package: ...", "MPICH Version: 4.0.2 ...": its first clause.
        name = text.value.decode(errors="replace").strip().splitlines()[0].split(",")[0]
    libs = _mapped("libmpi")
    return "%s (%s%s)" % (name, _lib.MPI_LIBRARY, ", over " + libs[0] if libs else "")


def _cuda():
    if not os.path.exists(_lib.CUDA_LIBRARY):
        return "not built (no nvcc when the library was made)", None
    try:
        cuda = ctypes.CDLL(_lib.CUDA_LIBRARY)
    except OSError as e:
        return "built, does not load: %s" % e, None
    count = ctypes.c_int()
    message = ctypes.create_string_buffer(512)
    fn = cuda.sumo_cuda_device_count
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]
    if fn(ctypes.byref(count), message, len(message)) != 0:
        devices = "device count failed"
    elif count.value:
        devices = "%d device(s)" % count.value
    else:
        devices = "no device: %s" % message.value.decode(errors="replace")
    # NCCL is loaded at run time, as libsumo_cuda loads it (SUMO_NCCL_LIBRARY, else
    # libnccl.so.2 on the dynamic linker's path).
    path = os.environ.get("SUMO_NCCL_LIBRARY") or "libnccl.so.2"
    try:
        nccl = ctypes.CDLL(path)
        v = ctypes.c_int()
        nccl.ncclGetVersion(ctypes.byref(v))
        code = v.value
        nccl_text = "%d.%d.%d (%s)" % (code // 10000, code // 100 % 100, code % 100,
                                       (_mapped("libnccl") or [path])[0])
    except (OSError, AttributeError) as e:
        nccl_text = "not found (%s: %s)" % (path, str(e).split(":")[-1].strip())
    return "%s, %s" % (_lib.CUDA_LIBRARY, devices), nccl_text


def _torch():
    try:
        import torch
    except Exception as e:  # not installed, or broken: the report says which
        return "not importable (%s)" % (str(e).splitlines()[0] if str(e) else type(e).__name__)
    return "%s (%s)" % (torch.__version__, os.path.dirname(torch.__file__))


def report():
    """The report's lines, as `python -m sumo` prints them."""
    isa = ctypes.c_char_p()
    if getattr(_lib.lib, "sumo_kernel_isa", None) is None:
        kernels = "unknown (the library predates sumo_kernel_isa)"
    elif _lib.lib.sumo_kernel_isa(ctypes.byref(isa)) == 0:
        kernels = isa.value.decode()
    else:  # SUMO_KERNEL_ISA refused: the kernels run the widest set, and the report says why
        why = ctypes.create_string_buffer(256)
        _lib.lib.sumo_env_check(why, ctypes.sizeof(why))
        kernels = "%s (%s)" % (isa.value.decode() if isa.value else "unknown",
                               why.value.decode())
    package = _package_version()
    # torch before NCCL: a libnccl.so.2 loaded first (CUDA's) would stand in for torch's own.
    torch = _torch()
    cuda, nccl = _cuda()
    lines = [
        ("sumo", "%s (package %s)" % (_lib.version(), package or "not installed: run from a checkout")),
        ("library", "%s (%s)" % (os.path.realpath(_lib.PATH), _lib.SOURCE)),
        ("binding", os.path.dirname(os.path.abspath(__file__))),
        ("kernels", kernels),
        ("transports", "threads, shm (processes of one node), MPI: %s" % _mpi()),
        ("CUDA", cuda),
    ]
    if nccl is not None:
        lines.append(("NCCL", nccl))
    lines += [
        ("python", "%s (%s)" % (platform.python_version(), sys.executable)),
        ("torch", torch),
        ("platform", "%s, %s" % (platform.platform(), platform.machine())),
    ]
    return ["%-11s %s" % (k + ":", v) for k, v in lines]


if __name__ == "__main__":
    print("\n".join(report()))
