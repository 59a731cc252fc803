"""The Python package's one build step: `make shared` (the project's own build) makes
libsumo.so, libsumo_mpi.so where mpicc is found and libsumo_cuda.so where nvcc is, and
build_py puts them in the package (sumo/_libs/), each under the name the others and the
binding load it by (libsumo.so.0, libsumo_mpi.so.0, libsumo_cuda.so: a wheel holds no
symbolic links). The package's version is the library's, from include/sumo.h.

An editable install (`pip install -e .`) runs the same make into the checkout's build/ and
copies nothing: the binding in python/sumo finds build/libsumo.so.0 itself, so a later `make`
is what it loads.

  SUMO_NO_MPI=1   leave libsumo_mpi out (make NO_MPI=1)
  SUMO_NO_CUDA=1  leave libsumo_cuda out (make NVCC=)
  MAKEFLAGS       passed to make as usual (default: -j with every core)
"""
import os
import re
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = "build"  # make's own default, so `pip install .` in a built checkout reuses its objects


def version():
    """SUMO_VERSION_MAJOR.MINOR.PATCH of include/sumo.h."""
    with open(os.path.join(ROOT, "include", "sumo.h")) as f:
        text = f.read()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define SUMO_VERSION_%s (\d+)" % part, text, re.M)
        if not m:
            raise RuntimeError("include/sumo.h defines no SUMO_VERSION_%s" % part)
        parts.append(m.group(1))
    return ".".join(parts)


def make_shared():
    """Runs `make shared`; returns the build folder."""
    cmd = ["make", "-C", ROOT, "--no-print-directory", "BUILD=" + BUILD]
    if "-j" not in os.environ.get("MAKEFLAGS", ""):
        cmd.append("-j%d" % (os.cpu_count() or 1))
    if os.environ.get("SUMO_NO_MPI", "0") not in ("", "0"):
        cmd.append("NO_MPI=1")
    if os.environ.get("SUMO_NO_CUDA", "0") not in ("", "0"):
        cmd.append("NVCC=")
    cmd.append("shared")
    print("sumo: " + " ".join(cmd), flush=True)
    subprocess.check_call(cmd)
    return os.path.join(ROOT, BUILD)


# (the file make writes, the name in the package); the first is required, the others are
# there when make found MPI or nvcc.
LIBRARIES = [("libsumo.so.0", "libsumo.so.0"), ("libsumo_mpi.so.0", "libsumo_mpi.so.0"),
             ("libsumo_cuda.so", "libsumo_cuda.so")]


class build_py_with_libraries(build_py):
    def run(self):
        super().run()
        built = make_shared()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, "sumo", "_libs")
        os.makedirs(target, exist_ok=True)
        for made, name in LIBRARIES:
            path = os.path.join(built, made)
            if os.path.exists(path):
                # copyfile follows the soname's link to the versioned file.
                shutil.copyfile(path, os.path.join(target, name))
                os.chmod(os.path.join(target, name), 0o755)
                self._libraries = getattr(self, "_libraries", []) + [os.path.join(target, name)]
            elif made == "libsumo.so.0":
                raise RuntimeError("make shared did not make %s" % path)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + getattr(self, "_libraries", [])


class BinaryDistribution(Distribution):
    """The wheel holds machine code: tagged for this platform and Python, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(version=version(), distclass=BinaryDistribution,
      cmdclass={"build_py": build_py_with_libraries},
      options={"build": {"build_base": os.path.join(BUILD, "python")}})
