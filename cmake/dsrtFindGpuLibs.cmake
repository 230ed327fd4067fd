# Finds cuDNN 9 and NCCL 2 for a CUDA build. Each is looked for under its
# <NAME>_ROOT (CMake variable or environment variable: an install prefix, or
# the nvidia/cudnn and nvidia/nccl folders of the nvidia-cudnn-cu13 and
# nvidia-nccl-cu13 Python packages, whose libraries carry only the versioned
# name libcudnn.so.9 / libnccl.so.2), then on CMAKE_PREFIX_PATH and the
# system paths, then in the CUDA toolkit's folders. Each folder is searched
# for both names before the next (NAMES_PER_DIR), so that a root given wins.
#
# DSRT_WITH_CUDNN and DSRT_WITH_NCCL are AUTO (default), ON or OFF. AUTO turns
# off, with a warning naming what to install, only what needs the missing
# library: without cuDNN the GPU nn backend (the kernels still build), without
# NCCL the GPU collectives. ON makes a missing library a configure error.
# Sets DSRT_HAVE_CUDNN / DSRT_HAVE_NCCL (0 or 1), which the sources see as
# macros of the same names, and CUDNN_LIBRARY / NCCL_LIBRARY, and adds the
# include folders to DSRT_DEP_INCLUDE_DIRS. Only the modules link them.

# dsrt_find_gpu_lib(VAR name soname header major_macro min_major what_to_install)
function(dsrt_find_gpu_lib var name soname header major_macro min_major install)
  set(mode "${DSRT_WITH_${var}}")
  set(DSRT_HAVE_${var} 0 PARENT_SCOPE)
  if(mode STREQUAL "OFF")
    return()
  endif()
  if(NOT mode STREQUAL "AUTO" AND NOT mode STREQUAL "ON")
    message(FATAL_ERROR "DSRT_WITH_${var} must be AUTO, ON or OFF, not '${mode}'")
  endif()
  set(roots ${${var}_ROOT} $ENV{${var}_ROOT})
  get_filename_component(cuda_root "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
  find_path(${var}_INCLUDE_DIR NAMES ${header}
    HINTS ${roots} PATH_SUFFIXES include
    PATHS ${CUDAToolkit_INCLUDE_DIRS} ${cuda_root}/include)
  find_library(${var}_LIBRARY NAMES ${name} ${soname} NAMES_PER_DIR
    HINTS ${roots} PATH_SUFFIXES lib lib64
    PATHS ${CUDAToolkit_LIBRARY_DIR} ${cuda_root}/lib ${cuda_root}/lib64)
  set(problem "")
  if(NOT ${var}_INCLUDE_DIR OR NOT ${var}_LIBRARY)
    set(problem "not found")
  else()
    file(STRINGS "${${var}_INCLUDE_DIR}/${header}" line REGEX "#define ${major_macro} +[0-9]+")
    if(NOT line AND header STREQUAL "cudnn.h")
      file(STRINGS "${${var}_INCLUDE_DIR}/cudnn_version.h" line
           REGEX "#define ${major_macro} +[0-9]+")
    endif()
    string(REGEX MATCH "[0-9]+" major "${line}")
    if(NOT major)
      set(problem "not found: ${${var}_INCLUDE_DIR}/${header} has no ${major_macro}")
    elseif(major LESS min_major)
      set(problem "not found: ${${var}_INCLUDE_DIR} holds version ${major}")
    endif()
  endif()
  if(problem)
    string(CONCAT msg "${name} ${min_major} ${problem} (${header}, lib${name}.so or ${soname}): "
           "install ${install}, or give its folder with -D${var}_ROOT=... or CMAKE_PREFIX_PATH")
    if(mode STREQUAL "ON")
      message(FATAL_ERROR "dsrt: ${msg}")
    endif()
    message(WARNING "dsrt: ${msg}; building without it (-DDSRT_WITH_${var}=OFF silences this)")
    unset(${var}_INCLUDE_DIR CACHE)
    unset(${var}_LIBRARY CACHE)
    return()
  endif()
  message(STATUS "dsrt: ${name} ${major}: ${${var}_LIBRARY}")
  set(DSRT_HAVE_${var} 1 PARENT_SCOPE)
  set(DSRT_DEP_INCLUDE_DIRS ${DSRT_DEP_INCLUDE_DIRS} ${${var}_INCLUDE_DIR} PARENT_SCOPE)
endfunction()

dsrt_find_gpu_lib(CUDNN cudnn libcudnn.so.9 cudnn.h CUDNN_MAJOR 9
  "cuDNN 9 for CUDA 13 (Debian/Ubuntu package libcudnn9-dev-cuda-13, or pip install nvidia-cudnn-cu13)")
dsrt_find_gpu_lib(NCCL nccl libnccl.so.2 nccl.h NCCL_MAJOR 2
  "NCCL 2 for CUDA 13 (package libnccl-dev, or pip install nvidia-nccl-cu13)")
