# Finds the libraries dsrt links, library by library:
#   DSRT_DEP_LIBRARIES        libdsrt (the data library): image, I/O, topology
#   DSRT_TRAIN_DEP_LIBRARIES  libdsrt_train: oneDNN (and zlib for model files)
#   DSRT_MPI_LIBRARIES        the module dsrt_mpi (Open MPI)
#   DSRT_CUDA_LIBRARIES       the module dsrt_cuda (CUDA runtime, cuBLAS, cuDNN)
#   DSRT_NCCL_LIBRARIES       the module dsrt_nccl (NCCL, CUDA runtime)
# and every include folder in DSRT_DEP_INCLUDE_DIRS; DSRT_PC_LIBS_PRIVATE and
# DSRT_TRAIN_PC_LIBS_PRIVATE are the same libraries as flags for dsrt.pc and
# dsrt-train.pc (the modules' libraries are in neither: nothing links them
# but the modules). Every one is a Debian package that
# scripts/install-deps.sh installs; a missing one stops the configure with
# the package to install.
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
# WebP: libwebp's pkg-config file (libwebp-dev) says where it lies; the
# library and header are then found as the others are (also under
# CMAKE_PREFIX_PATH, where a prefix unpacked elsewhere keeps its .pc file's
# /usr).
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(WEBP_PC QUIET libwebp)
  find_library(WEBP_LIBRARY NAMES webp HINTS ${WEBP_PC_LIBRARY_DIRS})
  find_path(WEBP_INCLUDE_DIR NAMES webp/decode.h HINTS ${WEBP_PC_INCLUDE_DIRS})
endif()
dsrt_find_lib(WEBP webp webp/decode.h libwebp-dev)
# Object storage (s3://, https://): libcurl's multi interface, and OpenSSL's
# libcrypto for the SHA-256 of AWS Signature Version 4.
dsrt_find_lib(CURL curl curl/curl.h libcurl4-openssl-dev)
dsrt_find_lib(CRYPTO crypto openssl/evp.h libssl-dev)

set(DSRT_DEP_LIBRARIES
  ${TURBOJPEG_LIBRARY} ${JPEG_LIBRARY} ${SPNG_LIBRARY} ${WEBP_LIBRARY} ${URING_LIBRARY}
  ${HWLOC_LIBRARY} ${ZLIB_LIBRARY} ${CURL_LIBRARY} ${CRYPTO_LIBRARY} Threads::Threads ${CMAKE_DL_LIBS} m)
set(DSRT_TRAIN_DEP_LIBRARIES ${DNNL_LIBRARY} ${ZLIB_LIBRARY} m)
set(DSRT_DEP_INCLUDE_DIRS
  ${TURBOJPEG_INCLUDE_DIR} ${JPEG_INCLUDE_DIR} ${SPNG_INCLUDE_DIR} ${WEBP_INCLUDE_DIR} ${URING_INCLUDE_DIR} ${HWLOC_INCLUDE_DIR}
  ${DNNL_INCLUDE_DIR} ${ZLIB_INCLUDE_DIR} ${CURL_INCLUDE_DIR} ${CRYPTO_INCLUDE_DIR})
# For dsrt.pc and dsrt-train.pc: the same libraries as -l flags.
set(DSRT_PC_LIBS_PRIVATE "-lturbojpeg -ljpeg -lspng -lwebp -luring -lhwloc -lz -lcurl -lcrypto -lpthread -ldl -lm")
set(DSRT_TRAIN_PC_LIBS_PRIVATE "-ldnnl -lz -lm")
set(DSRT_MPI_LIBRARIES "")
set(DSRT_CUDA_LIBRARIES "")
set(DSRT_NCCL_LIBRARIES "")

# MPI (Open MPI: libopenmpi-dev) for the communicators. DSRT_WITH_MPI is
# AUTO (default: with MPI when found), ON (a missing MPI is an error) or OFF.
# Without it the communicators refuse to open and say why. Only the module
# dsrt_mpi links MPI.
set(DSRT_WITH_MPI AUTO CACHE STRING "MPI communicators for data-parallel training (AUTO, ON, OFF)")
set_property(CACHE DSRT_WITH_MPI PROPERTY STRINGS AUTO ON OFF)
set(DSRT_HAVE_MPI 0)
if(NOT DSRT_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(DSRT_HAVE_MPI 1)
    set(DSRT_MPI_LIBRARIES ${MPI_C_LIBRARIES})
    list(APPEND DSRT_DEP_INCLUDE_DIRS ${MPI_C_INCLUDE_DIRS})
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
  set(DSRT_CUDA_LIBRARIES CUDA::cudart CUDA::cublas)
  list(APPEND DSRT_DEP_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
  include(dsrtFindGpuLibs)
  if(DSRT_HAVE_CUDNN)
    list(APPEND DSRT_CUDA_LIBRARIES ${CUDNN_LIBRARY})
  endif()
  if(DSRT_HAVE_NCCL)
    set(DSRT_NCCL_LIBRARIES ${NCCL_LIBRARY} CUDA::cudart)
  endif()
endif()
