# Finds the libraries dsrt links and collects them in DSRT_DEP_LIBRARIES and
# DSRT_DEP_INCLUDE_DIRS. Every one is a Debian package that
# scripts/install-deps.sh installs; a missing one stops the configure with the
# package to install.
find_package(Threads REQUIRED)

function(dsrt_find_lib var lib header package)
  find_library(${var}_LIBRARY NAMES ${lib})
  find_path(${var}_INCLUDE_DIR NAMES ${header})
  if(NOT ${var}_LIBRARY OR NOT ${var}_INCLUDE_DIR)
    message(FATAL_ERROR "dsrt needs ${lib} (${header}): install the Debian package ${package}, "
                        "or run scripts/install-deps.sh")
  endif()
  set(${var}_LIBRARY ${${var}_LIBRARY} PARENT_SCOPE)
  set(${var}_INCLUDE_DIR ${${var}_INCLUDE_DIR} PARENT_SCOPE)
endfunction()

dsrt_find_lib(TURBOJPEG turbojpeg turbojpeg.h libturbojpeg0-dev)
dsrt_find_lib(JPEG jpeg jpeglib.h libjpeg62-turbo-dev)
dsrt_find_lib(SPNG spng spng.h libspng-dev)
dsrt_find_lib(URING uring liburing.h liburing-dev)
dsrt_find_lib(HWLOC hwloc hwloc.h libhwloc-dev)
dsrt_find_lib(DNNL dnnl oneapi/dnnl/dnnl.h libdnnl-dev)
dsrt_find_lib(ZLIB z zlib.h zlib1g-dev)

set(DSRT_DEP_LIBRARIES
  ${TURBOJPEG_LIBRARY} ${JPEG_LIBRARY} ${SPNG_LIBRARY} ${URING_LIBRARY} ${HWLOC_LIBRARY} ${DNNL_LIBRARY}
  ${ZLIB_LIBRARY} Threads::Threads m)
set(DSRT_DEP_INCLUDE_DIRS
  ${TURBOJPEG_INCLUDE_DIR} ${JPEG_INCLUDE_DIR} ${SPNG_INCLUDE_DIR} ${URING_INCLUDE_DIR} ${HWLOC_INCLUDE_DIR}
  ${DNNL_INCLUDE_DIR} ${ZLIB_INCLUDE_DIR})
# For dsrt.pc: the same libraries as -l flags.
set(DSRT_PC_LIBS_PRIVATE "-lturbojpeg -ljpeg -lspng -luring -lhwloc -ldnnl -lz -lpthread -lm")

# MPI (Open MPI: libopenmpi-dev) for the communicators. DSRT_WITH_MPI is
# AUTO (default: with MPI when found), ON (a missing MPI is an error) or OFF.
# Without it the communicators refuse to open and say why.
set(DSRT_WITH_MPI AUTO CACHE STRING "MPI communicators for data-parallel training (AUTO, ON, OFF)")
set_property(CACHE DSRT_WITH_MPI PROPERTY STRINGS AUTO ON OFF)
set(DSRT_HAVE_MPI 0)
if(NOT DSRT_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(DSRT_HAVE_MPI 1)
    list(APPEND DSRT_DEP_LIBRARIES ${MPI_C_LIBRARIES})
    list(APPEND DSRT_DEP_INCLUDE_DIRS ${MPI_C_INCLUDE_DIRS})
    foreach(lib ${MPI_C_LIBRARIES})
      get_filename_component(dir "${lib}" DIRECTORY)
      get_filename_component(name "${lib}" NAME_WE)
      string(REGEX REPLACE "^lib" "" name "${name}")
      string(APPEND DSRT_PC_LIBS_PRIVATE " -L${dir} -l${name}")
    endforeach()
    message(STATUS "dsrt: MPI ${MPI_C_VERSION}: ${MPI_C_LIBRARIES} (launcher ${MPIEXEC_EXECUTABLE})")
  elseif(DSRT_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "dsrt: MPI not found: install libopenmpi-dev and openmpi-bin "
                        "(scripts/install-deps.sh), or configure with -DDSRT_WITH_MPI=OFF")
  else()
    message(WARNING "dsrt: MPI not found (install libopenmpi-dev): building without "
                    "communicators (-DDSRT_WITH_MPI=OFF silences this)")
  endif()
endif()

set(DSRT_HAVE_CUDNN 0)
set(DSRT_HAVE_NCCL 0)
if(DSRT_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)
  if(NOT TARGET CUDA::cublas)
    message(FATAL_ERROR "dsrt: the CUDA toolkit in ${CUDAToolkit_LIBRARY_DIR} has no cuBLAS: "
                        "install its cuBLAS (libcublas), or configure with -DDSRT_WITH_CUDA=OFF")
  endif()
  list(APPEND DSRT_DEP_LIBRARIES CUDA::cudart CUDA::cublas)
  list(APPEND DSRT_DEP_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
  # The folder that really holds libcudart (lib64 on most installs).
  get_filename_component(_dsrt_cudart_dir "${CUDA_cudart_LIBRARY}" DIRECTORY)
  get_filename_component(_dsrt_cublas_dir "${CUDA_cublas_LIBRARY}" DIRECTORY)
  set(_dsrt_cuda_dirs "-L${_dsrt_cudart_dir}")
  if(NOT _dsrt_cublas_dir STREQUAL _dsrt_cudart_dir)
    string(APPEND _dsrt_cuda_dirs " -L${_dsrt_cublas_dir}")
  endif()
  # The kernels' host code comes from the C++ compiler (nvcc's host pass):
  # static links need its runtime too.
  set(DSRT_PC_LIBS_PRIVATE
      "${DSRT_PC_LIBS_PRIVATE} ${_dsrt_cuda_dirs} -lcublas -lcudart -lstdc++")
  include(dsrtFindGpuLibs)
endif()
