# Installs kforge for `find_package(kforge)` (see CMakeLists.txt). Headers
# keep their source layout under include/kforge/ (model/spec.h,
# runtime/client.h, kforge/v1/spec.pb.h, ...), which is how kforge's own
# headers include each other, so one include directory serves them all.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KFORGE_ENGINE_TARGETS kforge_runtime kforge_module_loader kforge_client kforge_client_settings kforge_bundle kforge_model kforge_base
  kforge_proto kforge_grpc_proto)
set(kforge_include ${CMAKE_INSTALL_INCLUDEDIR}/kforge)
foreach(target ${KFORGE_ENGINE_TARGETS})
  target_include_directories(${target} INTERFACE $<INSTALL_INTERFACE:${kforge_include}>)
endforeach()

install(TARGETS kforge RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${KFORGE_ENGINE_TARGETS} EXPORT kforgeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(dir base model bundle runtime)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${kforge_include}/${dir}
    FILES_MATCHING PATTERN "*.h")
endforeach()
# model/decode_plan.h and runtime/ headers include the parameter blocks the
# kernels use (params.h); the KV layouts and the tiling rule beside it are
# the rest of the template tree's plain-C++ part (no CUDA, no template text).
install(FILES ${PROJECT_SOURCE_DIR}/templates/kforge/sparse_mla/common/params.h
  ${PROJECT_SOURCE_DIR}/templates/kforge/sparse_mla/common/kv_layout.h
  ${PROJECT_SOURCE_DIR}/templates/kforge/sparse_mla/common/tiling.h
  DESTINATION ${kforge_include}/templates/kforge/sparse_mla/common)
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/kforge/v1/ DESTINATION ${kforge_include}/kforge/v1
  FILES_MATCHING PATTERN "*.pb.h")
install(EXPORT kforgeTargets NAMESPACE kforge:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kforge)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kforgeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kforgeConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kforge)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kforgeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kforgeConfig.cmake ${PROJECT_BINARY_DIR}/kforgeConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kforge)
