"""Run inside a fresh container after `pip install kforge-*.whl`: the
installed wheel, configured only by environment, imports, plans a decode,
reads a signed bundle and talks to a `kforge serve` over TLS with a token;
loading a kernel there (no CUDA driver) is a clear KforgeError.
Prints one line per check; any failure raises.

Environment (set by scripts/test_wheel.sh): KFORGE_SERVER, KFORGE_TLS_CA,
KFORGE_TOKEN_FILE (the client's own variables) and WHEEL_CHECK_BUNDLE,
WHEEL_CHECK_TRUST (what it sets as KFORGE_BUNDLE and KFORGE_TRUST for the
bundle part), WHEEL_CHECK_ARCH."""

import os
import subprocess
import sys
import sysconfig

import kforge

arch = os.environ["WHEEL_CHECK_ARCH"]
site = sysconfig.get_paths()["purelib"]
assert kforge.__file__.startswith(site), f"kforge imported from {kforge.__file__}, not {site}"
print(f"import: kforge {kforge.__version__} from {os.path.dirname(kforge.__file__)}")

# The native library resolves every dependency inside the wheel or to a
# library every manylinux system has (the policy's list: glibc's, libstdc++,
# libgcc_s, libz), whatever the image has installed.
lib = os.path.join(os.path.dirname(kforge.__file__), "_native", "libkforge_capi.so")
ldd = subprocess.run(["ldd", lib], check=True, capture_output=True, text=True).stdout
manylinux_system = ("linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6",
                    "libdl.so.2", "libpthread.so.0", "librt.so.1", "libstdc++.so.6",
                    "libgcc_s.so.1", "libz.so.1")
for line in ldd.splitlines():
    assert "not found" not in line, f"ldd {lib}: {line.strip()}"
    name = os.path.basename(line.split()[0])
    target = line.split("=>")[-1].split("(")[0].strip()
    if name not in manylinux_system:
        assert target.startswith(site), f"{name} resolved outside the wheel: {target}"
print(f"native library: {len(ldd.splitlines())} libraries, all in the wheel or manylinux's")

# Plan a decode: preset spec, manifest rules and launch math through the C ABI.
spec = kforge.spec_from_preset("glm-5", 8)
assert spec.num_q_heads == 8, spec

# A server over TLS with a bearer token, configured by KFORGE_* alone.
source = kforge.default_source()
manifest = source.get_manifest(preset="glm-5", tp=8, arch=arch)
kernel = source.get_kernel(manifest.variants[0], arch)
assert kernel.cubin[:4] == b"\x7fELF", "the served cubin is not an ELF file"
shape = kforge.Shape(batch=4, s_q=1, num_q_heads=8, topk=2048, page_block_size=64)
sel = kforge.select(manifest, kforge.Device(arch, 132), shape)
assert sel.grid[0] >= 1 and sel.block_threads > 0, sel
print(f"server {os.environ['KFORGE_SERVER']} (TLS, token from KFORGE_TOKEN_FILE): manifest "
      f"{len(manifest.variants)} variant(s), cubin {len(kernel.cubin)} B; select: {sel}")

# Loading the kernel needs the CUDA driver, which this container lacks: the
# native library opens it only now (it never links it) and says so.
from kforge import _module  # noqa: E402
assert not [n for n in os.listdir(os.path.dirname(lib)) if "libcuda" in n], "libcuda in the wheel"
try:
    _module.KernelModule(kernel, _module.SPARSE_MLA_PARAMS, 0)
    sys.exit("a kernel module loaded without a CUDA driver")
except kforge.KforgeError as e:
    no_driver = str(e)
assert "loading kforge kernels needs the CUDA driver" in no_driver, no_driver
print(f"kernel load without a driver: {no_driver}")

# Without the token the same server refuses: the token really came from the
# environment.
token_file = os.environ.pop("KFORGE_TOKEN_FILE")
try:
    with kforge.Client(os.environ["KFORGE_SERVER"], tls_ca=os.environ["KFORGE_TLS_CA"],
                       max_attempts=1) as client:
        client.get_manifest(preset="glm-5", tp=8, arch=arch)
    sys.exit("the server answered a client without a token")
except kforge.KforgeRpcError as e:
    assert e.code_name == "UNAUTHENTICATED", e
finally:
    os.environ["KFORGE_TOKEN_FILE"] = token_file
print("server without the token: UNAUTHENTICATED")

# A signed bundle, checked against its signer's public key, also from the
# environment alone (KFORGE_BUNDLE + KFORGE_TRUST, as an engine with no
# server runs).
for name in ("KFORGE_SERVER", "KFORGE_TLS_CA", "KFORGE_TOKEN_FILE"):
    os.environ.pop(name)
os.environ["KFORGE_BUNDLE"] = os.environ["WHEEL_CHECK_BUNDLE"]
os.environ["KFORGE_TRUST"] = os.environ["WHEEL_CHECK_TRUST"]
kforge.ops._default_source = None
bundle = kforge.default_source()
assert isinstance(bundle, kforge.Bundle), bundle
manifest = bundle.get_manifest(preset="glm-5", tp=8, arch=arch)
assert len(bundle.get_kernel(manifest.variants[0], arch).cubin) > 1000
print(f"signed bundle (KFORGE_BUNDLE, KFORGE_TRUST): verified, {len(manifest.variants)} variant(s)")
print("check_installed: passed")
