"""One kernel module loaded on one GPU, whatever its family, through the C
ABI (kforge_module_* in capi/kforge_capi.h): the library's module loader is
runtime/kernel_module.h, the one the C++ runtimes load with, so a module
is checked, loaded and launched by the same code from C++ and from Python.
Sparse MLA (ops.py) and the DSA indexer (dsa_indexer.py) load through it;
what is their own is which entry they launch with which grid.

Before anything is loaded, every entry the artifact lists
(KernelArtifact.entries) is checked to take the parameter block the caller
passes for its role (a module of another family, or one built from other
templates, is refused). The library loads the CUDA driver (libcuda.so.1)
only then, at run time: `import kforge` and everything but loading kernels
work on a machine without one, where loading raises a KforgeError that
says the driver is needed.

The cubin is loaded as a context-independent CUlibrary; launches go on the
stream they are given (PyTorch's cudaStream_t as an int), in that stream's
context, so a launch on a capturing stream is captured into the graph.
"""

import ctypes

from kforge import _capi
from kforge._proto import pb
from kforge.errors import KforgeError

# The host structs each entry role takes (kforge_sizeof names).
SPARSE_MLA_PARAMS = {"ENTRY_ROLE_ATTENTION": "DecodeParams", "ENTRY_ROLE_COMBINE": "CombineParams"}
DSA_INDEXER_PARAMS = {"ENTRY_ROLE_INDEXER_LOGITS": "LogitsParams",
                      "ENTRY_ROLE_INDEXER_TOPK": "TopkParams"}

NEEDS_DRIVER = "loading kforge kernels needs the CUDA driver"


def driver():
    """The CUDA driver's version (12040 = 12.4), loading it on first use;
    KforgeError without a usable driver (none installed, too old, no
    device)."""
    version = ctypes.c_int32(0)
    try:
        _capi.call("cuda_driver_version", ctypes.byref(version))
    except KforgeError as e:
        raise KforgeError(f"{NEEDS_DRIVER} ({e})") from None
    return version.value


def image_count(kernels):
    """How many cubin images a module has, from its cubin_info kernels
    (dicts or KernelResources messages, each naming its image). The files
    are read until the first missing one (read_images), and the C++ check
    (_capi.check_artifact) bounds the count and checks every image."""
    try:
        last = max((int(k.get("image", 0)) if isinstance(k, dict) else k.image
                    for k in kernels), default=0)
    except (AttributeError, TypeError, ValueError) as e:
        raise KforgeError(f"cubin_info: an image that is not a number ({e})") from None
    if last < 0:
        raise KforgeError(f"cubin_info names image {last}")
    return last + 1


def read_images(cubin_path, count):
    """A module's cubin images as `kforge compile` writes them: the .cubin
    given (image 0), then <it>.<i> beside it for i = 1..count-1."""
    images = []
    for i in range(count):  # a hostile count stops at the first missing file
        path = cubin_path if i == 0 else f"{cubin_path}.{i}"
        try:
            with open(path, "rb") as f:
                images.append(f.read())
        except OSError as e:
            raise KforgeError(f"{path}: cubin image {len(images)} of {count} ({e})") from None
    return images


def images_of(artifact):
    """A KernelArtifact's cubin images, in order (cubin, more_cubins)."""
    return [bytes(artifact.cubin)] + [bytes(c) for c in artifact.more_cubins]


def as_images(images):
    """A module's cubin images as a list of bytes, image 0 first, from such
    a list or from one bytes (a one-image module)."""
    if isinstance(images, (bytes, bytearray, memoryview)):
        return [bytes(images)]
    return [bytes(i) for i in images]


def put_images(artifact, images):
    """`artifact` (a KernelArtifact) with its cubin and more_cubins set from
    its images (as_images)."""
    images = as_images(images)
    artifact.cubin = images[0]
    del artifact.more_cubins[:]
    artifact.more_cubins.extend(images[1:])
    return artifact


def artifact_of(description, images):
    """A KernelArtifact message of a module's JSON description (a dict, as
    `kforge compile` writes it beside the cubin) and its cubin images
    (as_images)."""
    return put_images(pb().json_format.ParseDict(description, pb().artifact_pb2.KernelArtifact(),
                                                 ignore_unknown_fields=True), images)


def _expected(expected):
    """{role name: struct name} as a KforgeEntryParams array."""
    role = pb().artifact_pb2.EntryRole.Value
    items = [_capi.EntryParams(role(name), 0, 0, struct.encode())
             for name, struct in expected.items()]
    return (_capi.EntryParams * len(items))(*items), len(items)


class KernelModule(_capi._Handle):
    """A loaded module (kforge_module_load) on the device of ordinal
    device_index. Entries are named by the artifact's entry names; entry()
    gives the index launch() takes."""

    def __init__(self, artifact, expected, device_index):
        """artifact: a KernelArtifact message with its cubin; expected:
        {role name: struct name} (SPARSE_MLA_PARAMS, DSA_INDEXER_PARAMS).
        Raises KforgeError (KforgeBadAnswer for a damaged artifact,
        KforgeInvalidArgument for bad arguments) naming the module."""
        self.name = artifact.module_name
        params, count = _expected(expected)
        super().__init__("module_load", "module_close", *_capi.serialized(artifact), params,
                         count, int(device_index))
        self._entries = {}
        self._launch_fn = self._lib.kforge_module_launch

    def entry(self, name):
        """(index, parameter block bytes) of the listed entry `name`."""
        found = self._entries.get(name)
        if found is None:
            index, nbytes = ctypes.c_int32(-1), ctypes.c_uint64(0)
            _capi.call("module_entry", self.handle, name.encode(), ctypes.byref(index),
                       ctypes.byref(nbytes))
            found = self._entries[name] = (index.value, nbytes.value)
        return found

    def load_into_current_context(self):
        """Loads every entry into the current context (the one torch made
        current), so that a first launch there, e.g. inside a CUDA graph
        capture, does not load it lazily."""
        _capi.call("module_load_into_current_context", self.handle)

    def set_max_dynamic_smem(self, entry, nbytes):
        """Opts `entry` into nbytes of dynamic shared memory on the device
        (a kernel needs it above 48 KB)."""
        _capi.call("module_set_max_dynamic_smem", self.handle, self.entry(entry)[0], int(nbytes))

    def allow_non_portable_cluster(self, entry):
        """Whether the device lets `entry` launch clusters past the portable
        8 CTAs (its size is compiled in)."""
        index = self.entry(entry)[0]
        try:
            _capi.call("module_allow_non_portable_cluster", self.handle, index)
        except KforgeError:
            return False
        return True

    def max_active_clusters(self, entry, grid_x, grid_y, block_threads, smem):
        """cuOccupancyMaxActiveClusters for one cluster of `entry` (grid
        (grid_x, grid_y, 1)) in the current context; 0 where the driver
        cannot say."""
        clusters = ctypes.c_int32(0)
        _capi.call("module_max_active_clusters", self.handle, self.entry(entry)[0], int(grid_x),
                   int(grid_y), 1, int(block_threads), int(smem), ctypes.byref(clusters))
        return clusters.value

    def launch(self, index, params, size, grid_x, grid_y, grid_z, block, smem, stream,
               programmatic=False):
        """Enqueues entry `index` (entry()'s) with one by-value parameter
        block (`params`: bytes, a ctypes buffer or an address; `size` its
        bytes) on `stream` (a cudaStream_t / CUstream as an int; 0: the
        default stream); with programmatic stream serialization where
        `programmatic` (the kernel is scheduled while the one before it in
        the stream finishes; it waits for it in ptx::WaitForPriorGrids).
        The block is copied before this returns."""
        error = ctypes.c_void_p()
        code = self._launch_fn(self.handle, index, params, size, grid_x, grid_y, grid_z, block,
                               smem, stream, 1 if programmatic else 0, ctypes.byref(error))
        if code:
            _capi.raise_for(code, _capi._take_string(error) or
                            f"kforge_module_launch failed with status code {code}")
