"""setuptools reads the package's metadata from pyproject.toml; this file
only refuses, with the reason, to package kforge before the build has
written the files it installs with it (a clean clone has neither)."""

import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
BUILT = ("kforge/v1/spec_pb2.py", "kforge/v1/service_pb2.py", "kforge/v1/artifact_pb2.py",
         "kforge/_native/libkforge_capi.so", "kforge/_version.py")

missing = [p for p in BUILT if not os.path.isfile(os.path.join(HERE, p))]
if missing:
    sys.exit(f"kforge's Python package installs what the kforge build writes into python/ "
             f"({', '.join(missing)} missing): run scripts/build.sh first (or cmake --build "
             f"BUILD --target kforge_capi kforge_python_proto)")
setup()
