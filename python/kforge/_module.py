"""One kernel module loaded for the current CUDA context, whatever its
family: the cubin loaded with the Driver API and every entry the artifact
lists (KernelArtifact.entries) resolved by name, each first checked to take
the parameter block the caller passes for its role. Sparse MLA (ops.py)
and the DSA indexer (dsa_indexer.py) load through it; what is their own is
which entry they launch with which grid.

The driver calls go through ctypes on libcuda (present wherever a GPU
driver is), so loading needs no Python package. This is the Python twin of
the C++ loader (runtime/kernel_module.h) rather than a binding of it: the
C ABI library is built for the wheel without the CUDA toolkit
(cmake/PythonPackage.cmake builds base, model, bundle and capi only), and
the C++ loader needs the toolkit's headers (cuda.h, cudaTypedefs.h) to
build. The checks themselves (CheckArtifactForVariant) are the C++ ones,
through the C ABI, before anything is loaded.
"""

import ctypes

from kforge import _capi
from kforge.errors import KforgeError

# The host structs each entry role takes (kforge_sizeof names).
SPARSE_MLA_PARAMS = {"ENTRY_ROLE_ATTENTION": "DecodeParams", "ENTRY_ROLE_COMBINE": "CombineParams"}
DSA_INDEXER_PARAMS = {"ENTRY_ROLE_INDEXER_LOGITS": "LogitsParams",
                      "ENTRY_ROLE_INDEXER_TOPK": "TopkParams"}


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): an id, padding to 8 bytes, a 64-byte
    value union (programmaticStreamSerializationAllowed is its first int)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


class Driver:
    """The few CUDA driver calls kforge's Python side makes."""

    ATTR_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ATTR_NON_PORTABLE_CLUSTER = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    LAUNCH_PROGRAMMATIC = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise KforgeError(f"loading kforge kernels needs the CUDA driver ({e})") from e
        vp, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        pvp = ctypes.POINTER(ctypes.c_void_p)
        lib = self.lib
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
        lib.cuLibraryLoadData.argtypes = [pvp, ctypes.c_char_p, vp, vp, u, vp, vp, u]
        lib.cuLibraryUnload.argtypes = [vp]
        lib.cuLibraryGetKernel.argtypes = [pvp, vp, ctypes.c_char_p]
        lib.cuKernelSetAttribute.argtypes = [i, i, vp, i]
        lib.cuKernelGetFunction.argtypes = [pvp, vp]
        lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(i), vp,
                                                     ctypes.POINTER(LaunchConfig)]
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), vp, vp, vp]
        lib.cuGetErrorName.argtypes = [i, ctypes.POINTER(ctypes.c_char_p)]

    def check(self, err, what):
        if err != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(err, ctypes.byref(name))
            raise KforgeError(f"{what} failed: {(name.value or b'?').decode()} ({err})")

    def launch(self, f, grid, block, smem, stream, params, what, programmatic=False):
        """cuLaunchKernel of `f` (a CUfunction or CUkernel handle) with one
        by-value parameter block, or with programmatic stream serialization
        cuLaunchKernelEx (the kernel is scheduled while the one before it in
        the stream finishes; it waits for it in ptx::WaitForPriorGrids)."""
        block_bytes = ctypes.create_string_buffer(params, len(params))
        args = (ctypes.c_void_p * 1)(ctypes.addressof(block_bytes))  # one by-value struct
        if not programmatic:
            self.check(self.lib.cuLaunchKernel(f, grid[0], grid[1], grid[2], block, 1, 1, smem,
                                               ctypes.c_void_p(stream), args, None), what)
            return
        attr = LaunchAttribute(id=self.LAUNCH_PROGRAMMATIC, value=1)
        config = LaunchConfig(grid[0], grid[1], grid[2], block, 1, 1, smem,
                              ctypes.c_void_p(stream), ctypes.pointer(attr), 1)
        self.check(self.lib.cuLaunchKernelEx(ctypes.byref(config), f, args, None),
                   what.replace("cuLaunchKernel(", "cuLaunchKernelEx(", 1))


_driver_instance = None


def driver():
    """The process's Driver (KforgeError without a CUDA driver)."""
    global _driver_instance
    if _driver_instance is None:
        _driver_instance = Driver()
    return _driver_instance


def entries_of(artifact):
    """[(name, role name, params_bytes)] of a KernelArtifact message or of
    its JSON description (a dict, as `kforge compile` writes it)."""
    if isinstance(artifact, dict):
        return [(e.get("name", ""), e.get("role", "ENTRY_ROLE_UNSPECIFIED"),
                 int(e.get("params_bytes", 0))) for e in artifact.get("entries", [])]
    from kforge._proto import pb
    role_name = pb().artifact_pb2.EntryRole.Name
    return [(e.name, role_name(e.role), e.params_bytes) for e in artifact.entries]


def check_entry_params(module_name, entries, expected):
    """Raises KforgeError unless the module lists entries and each has a
    role in `expected` ({role name: kforge_sizeof struct name}) whose host
    struct is the block it takes: a module of another family, or one built
    from other templates, is refused before anything is loaded."""
    if not entries:
        raise KforgeError(f"{module_name}: the artifact lists no entries (kforge artifacts list "
                          "them from format 3): rebuild it with this kforge")
    lib = _capi.lib()
    for name, role, params_bytes in entries:
        struct = expected.get(role)
        if struct is None:
            raise KforgeError(f"{name} in {module_name} has role {role}, which this runtime "
                              "does not launch: not a module of this kernel family")
        want = lib.kforge_sizeof(struct.encode())
        if params_bytes != want:
            raise KforgeError(f"{name} in {module_name} takes {params_bytes} parameter bytes "
                              f"but this runtime passes sizeof({struct}) = {want}: kernel and "
                              "runtime were built from different templates")


class KernelModule:
    """A cubin loaded as a context-independent CUlibrary with every listed
    entry resolved; functions() binds them to the current context."""

    def __init__(self, module_name, cubin, entries, expected, device_index):
        check_entry_params(module_name, entries, expected)
        cu = self._cu = driver()
        self.name = module_name
        # The driver may read the image lazily (CUDA_MODULE_LOADING=LAZY):
        # keep it alive as long as the library.
        self._image = bytes(cubin)
        library = ctypes.c_void_p()
        cu.check(cu.lib.cuLibraryLoadData(ctypes.byref(library), self._image, None, None, 0,
                                          None, None, 0), f"cuLibraryLoadData({module_name})")
        self._library = library
        device = ctypes.c_int()
        cu.check(cu.lib.cuDeviceGet(ctypes.byref(device), device_index),
                 f"cuDeviceGet({device_index})")
        self._device = device.value
        self.kernels = {}
        for name, _, _ in entries:
            kernel = ctypes.c_void_p()
            cu.check(cu.lib.cuLibraryGetKernel(ctypes.byref(kernel), library, name.encode()),
                     f"cuLibraryGetKernel({module_name}, {name})")
            self.kernels[name] = kernel.value

    def __del__(self):
        library = getattr(self, "_library", None)
        if library is not None and library.value:
            self._cu.lib.cuLibraryUnload(library)

    def kernel(self, entry):
        """The CUkernel handle of a listed entry."""
        try:
            return self.kernels[entry]
        except KeyError:
            raise KforgeError(f"{self.name} has no entry named {entry!r} among the artifact's "
                              "entries") from None

    def set_max_dynamic_smem(self, entry, nbytes):
        """Opts `entry` into nbytes of dynamic shared memory on the device
        (a kernel needs it above 48 KB)."""
        self._cu.check(self._cu.lib.cuKernelSetAttribute(
            Driver.ATTR_MAX_DYNAMIC_SMEM, int(nbytes), self.kernel(entry), self._device),
            f"cuKernelSetAttribute({self.name}, {entry}, max dynamic smem {nbytes})")

    def allow_non_portable_cluster(self, entry):
        """Whether the device lets `entry` launch clusters past the portable
        8 CTAs (its size is compiled in)."""
        return self._cu.lib.cuKernelSetAttribute(Driver.ATTR_NON_PORTABLE_CLUSTER, 1,
                                                 self.kernel(entry), self._device) == 0

    def function(self, entry):
        """`entry` as a CUfunction (an int handle) of the current context."""
        f = ctypes.c_void_p()
        self._cu.check(self._cu.lib.cuKernelGetFunction(ctypes.byref(f), self.kernel(entry)),
                       f"cuKernelGetFunction({self.name}, {entry})")
        return f.value

    def max_active_clusters(self, entry, grid_x, grid_y, block_threads, smem):
        """cuOccupancyMaxActiveClusters for one cluster of `entry` (grid
        (grid_x, grid_y, 1)); 0 where the driver cannot say."""
        config = LaunchConfig(grid_x, grid_y, 1, block_threads, 1, 1, smem, None, None, 0)
        clusters = ctypes.c_int()
        err = self._cu.lib.cuOccupancyMaxActiveClusters(ctypes.byref(clusters),
                                                        self.function(entry),
                                                        ctypes.byref(config))
        return clusters.value if err == 0 else 0
