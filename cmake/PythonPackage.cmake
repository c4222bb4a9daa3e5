# KFORGE_PYTHON_PACKAGE: the build python/pyproject.toml's backend
# (scikit-build-core) runs for the wheel. Only the layers the C ABI library
# binds (base, model, bundle over the messages, the client settings) and the Python message
# modules; the install tree is the package as it goes into the wheel:
#   kforge/*.py                      python/kforge's sources
#   kforge/v1/*_pb2.py, _version.py  what proto/ writes into this build
#   kforge/_native/libkforge_capi.so the C ABI (RPATH $ORIGIN)
# The wheel is then repaired (scripts/build_wheel.sh: auditwheel) so that
# the library's shared dependencies travel inside it.
add_subdirectory(proto)
add_subdirectory(base)
add_subdirectory(model)
add_subdirectory(bundle)
add_subdirectory(runtime)  # its client settings library only
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
