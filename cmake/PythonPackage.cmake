# KFORGE_PYTHON_PACKAGE: the build python/pyproject.toml's backend
# (scikit-build-core) runs for the wheel. Only the layers the C ABI library
# binds (base, model, bundle over the messages, the client settings, the
# kernel module loader) and the Python message modules; the install tree is
# the package as it goes into the wheel:
#   kforge/*.py                      python/kforge's sources
#   kforge/v1/*_pb2.py, _version.py  what proto/ writes into this build
#   kforge/_native/libkforge_capi.so the C ABI (RPATH $ORIGIN)
# The wheel is then repaired (scripts/build_wheel.sh: auditwheel) so that
# the library's shared dependencies travel inside it.
# The module loader (runtime/kernel_module.h) needs the CUDA Driver API's
# headers, cuda.h and cudaTypedefs.h, to build; nothing CUDA is linked (the
# driver is dlopen()ed when a module loads), so the wheel neither needs nor
# carries a CUDA library. From the toolkit at KFORGE_CUDA_ROOT (or
# $KFORGE_CUDA_ROOT, else /usr/local/cuda) where it has them, else from the
# nvidia-cuda-runtime-cu12 package that python/pyproject.toml's
# [build-system] requires, in the Python that runs this build. Setting
# CUDA_INCLUDE_DIR picks another directory.
if(NOT KFORGE_CUDA_ROOT)
  if(DEFINED ENV{KFORGE_CUDA_ROOT})
    set(KFORGE_CUDA_ROOT "$ENV{KFORGE_CUDA_ROOT}")
  else()
    set(KFORGE_CUDA_ROOT "/usr/local/cuda")
  endif()
endif()
# The build directory is kept between wheel builds, but the package's
# headers live in pip's build environment, a new temporary one each time.
if(CUDA_INCLUDE_DIR AND NOT EXISTS "${CUDA_INCLUDE_DIR}/cudaTypedefs.h")
  unset(CUDA_INCLUDE_DIR CACHE)
endif()
set(kforge_pypi_cuda_include "")
if(NOT EXISTS "${KFORGE_CUDA_ROOT}/include/cudaTypedefs.h")
  if(NOT Python_EXECUTABLE)
    find_package(Python COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util, os; s = importlib.util.find_spec('nvidia.cuda_runtime'); print(os.path.join(list(s.submodule_search_locations)[0], 'include') if s else '')"
    OUTPUT_VARIABLE kforge_pypi_cuda_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(CUDA_INCLUDE_DIR cudaTypedefs.h
  PATHS "${KFORGE_CUDA_ROOT}/include" ${kforge_pypi_cuda_include} NO_DEFAULT_PATH)
if(NOT CUDA_INCLUDE_DIR)
  message(FATAL_ERROR "the CUDA Driver API headers (cuda.h, cudaTypedefs.h) are in neither "
    "${KFORGE_CUDA_ROOT}/include nor an installed nvidia-cuda-runtime-cu12 package "
    "(pip install nvidia-cuda-runtime-cu12, or set KFORGE_CUDA_ROOT to a CUDA toolkit)")
endif()
message(STATUS "kforge: CUDA Driver API headers from ${CUDA_INCLUDE_DIR}")

add_subdirectory(proto)
add_subdirectory(base)
add_subdirectory(model)
add_subdirectory(bundle)
add_subdirectory(runtime)  # its client settings and module loader libraries only
add_subdirectory(capi)
install(TARGETS kforge_capi LIBRARY DESTINATION kforge/_native)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/kforge/ DESTINATION kforge
  FILES_MATCHING PATTERN "*.py"
  # What a development build wrote into the source tree, if any: the
  # package takes this build's own (proto/CMakeLists.txt, py_out).
  PATTERN "__pycache__" EXCLUDE PATTERN "_native" EXCLUDE PATTERN "v1" EXCLUDE
  PATTERN "_version.py" EXCLUDE)
install(DIRECTORY ${PROJECT_BINARY_DIR}/python/kforge/ DESTINATION kforge
  FILES_MATCHING PATTERN "*.py")
