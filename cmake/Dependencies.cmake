# The libraries every kforge build links, the Python package's wheel
# included (KFORGE_PYTHON_PACKAGE): protobuf and abseil (messages, status),
# libelf (cubin ELF files, on the server and in engines, which must not link
# a compiler), libcrypto (SHA-256 for cache keys and bundle files, Ed25519
# for signed bundles). A missing one fails the configure with the Debian
# packages that bring it, which scripts/install_deps.sh installs.
set(_kforge_missing "")
find_package(absl QUIET)
if(NOT absl_FOUND)
  list(APPEND _kforge_missing libabsl-dev)
endif()
find_package(Protobuf QUIET)
if(NOT Protobuf_FOUND OR NOT TARGET protobuf::protoc)
  list(APPEND _kforge_missing libprotobuf-dev protobuf-compiler)
endif()
find_library(LIBELF elf)
find_path(LIBELF_INCLUDE_DIR gelf.h)
if(NOT LIBELF OR NOT LIBELF_INCLUDE_DIR)
  list(APPEND _kforge_missing libelf-dev)
endif()
find_package(OpenSSL QUIET)
if(NOT OpenSSL_FOUND)
  list(APPEND _kforge_missing libssl-dev)
endif()
if(_kforge_missing)
  list(JOIN _kforge_missing " " _kforge_missing)
  message(FATAL_ERROR "kforge needs development files that this machine lacks: "
    "${_kforge_missing} (Debian/Ubuntu packages). scripts/install_deps.sh installs "
    "them, with everything else the build needs (apt-get, as root or with sudo).")
endif()
find_package(Threads REQUIRED)
