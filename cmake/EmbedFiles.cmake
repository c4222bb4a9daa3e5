# kforge_embed_files(OUT_CC NAMESPACE ROOT FILES...)
# Generates a C++ source holding every file as a byte array together with its
# path relative to ROOT, so the NVRTC stage needs no headers on disk at run
# time. Rebuilt whenever an embedded file changes.
function(kforge_embed_files out_cc root)
  set(files ${ARGN})
  add_custom_command(
    OUTPUT ${out_cc}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out_cc} -DROOT=${root} "-DFILES=${files}"
            -P ${PROJECT_SOURCE_DIR}/cmake/embed_files_script.cmake
    DEPENDS ${files} ${PROJECT_SOURCE_DIR}/cmake/embed_files_script.cmake
    COMMENT "Embedding template headers"
    VERBATIM)
endfunction()
