"""Builds the extensions dsrt._dsrt and dsrt._nn with this repository's CMake build.

setuptools drives the packaging (pyproject.toml); the extensions are built by
CMake (target dsrt_python: python/src/dsrt/, one file a type, with the data
library libdsrt linked in statically, and python/src/nn/, dsrt.Net, over the
shared libdsrt_train and libdsrt) for the interpreter running pip, and copied
where setuptools expects them, with the two shared libraries (dsrt._nn finds
them beside itself; it is loaded on first use of dsrt.Net) and the CUDA host
module (dsrt_cuda_host.so, built when the CUDA toolkit is found): a Pipeline
with gpu=N loads it for its pinned slots, and importing dsrt loads no CUDA or
oneDNN library. Extra CMake options come from $DSRT_CMAKE_ARGS (for example
"-DDSRT_WITH_CUDA=OFF").
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(dsrt VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        args = [
            "cmake", "-S", ROOT, "-B", build,
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DDSRT_BUILD_PYTHON=ON", "-DDSRT_BUILD_TESTS=OFF",
            "-DDSRT_BUILD_TOOLS=OFF", "-DDSRT_BUILD_EXAMPLES=OFF",
        ]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("DSRT_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        jobs = str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build, "--target", "dsrt_python", "-j", jobs])
        built = glob.glob(os.path.join(build, "python", "dsrt", "_dsrt*.so"))
        if len(built) != 1:
            raise RuntimeError(f"CMake built {built!r}, expected one _dsrt module")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)
        # Modules the extension loads on demand lie beside it.
        for module in glob.glob(os.path.join(build, "python", "dsrt", "dsrt_*.so")):
            shutil.copyfile(module, os.path.join(os.path.dirname(dest), os.path.basename(module)))
        # dsrt._nn (dsrt.Net, loaded on first use) and the shared libraries it
        # links, which its RUNPATH ($ORIGIN) finds beside it: libdsrt_train
        # (on the system's oneDNN) and libdsrt, by their sonames.
        nn = glob.glob(os.path.join(build, "python", "dsrt", "_nn*.so"))
        libs = [lib for name in ("libdsrt_train", "libdsrt")
                for lib in glob.glob(os.path.join(build, name + ".so.[0-9]*"))
                if re.fullmatch(r"lib[a-z_]+\.so\.[0-9]+", os.path.basename(lib))]
        if len(nn) != 1 or len(libs) != 2:
            raise RuntimeError(f"CMake built {nn + libs!r}, expected _nn and two libraries")
        for f in nn + libs:
            shutil.copyfile(f, os.path.join(os.path.dirname(dest), os.path.basename(f)))


setup(
    version=version(),
    ext_modules=[Extension("dsrt._dsrt", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
