"""Bundles: directories of prebuilt kernels and manifests used with no server.

The layout is runtime/bundle.h's (format version 1):

  DIR/kforge-bundle.json     {"format": "kforge-bundle", "format_version": 1}
  DIR/kernels/<key>.kfa      one binary KernelArtifact per kernel
  DIR/manifests/<name>.json  one Manifest (protobuf JSON, sm_count 0) per
                             (spec, arch), named by its first-choice variant
  DIR/checksums.sha256       "<sha256 hex>  <relative path>" per kernel and
                             manifest file, sorted by path

Bundle reads one (`kforge prebuild` writes them); LocalCopy is the same
layout kept by a Client as it fetches, so that kernels survive a restart and
manifests a server outage.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import threading

from kforge._proto import pb
from kforge.errors import KforgeBadAnswer, KforgeError, KforgeNotFound
from kforge.source import KernelSource, check_artifact, check_manifest
from kforge.spec import canonical_arch, selector, selector_spec

FORMAT = "kforge-bundle"
FORMAT_VERSION = 1
MARKER_FILE = "kforge-bundle.json"
CHECKSUMS_FILE = "checksums.sha256"
KERNELS_DIR = "kernels"
MANIFESTS_DIR = "manifests"

_log = logging.getLogger("kforge")


def _check_stem(field, name):
    """Keys and module names become file names: refuse anything that could
    reach outside the directory ("../x", "a/b"), as the C++ side does."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or "") or name.startswith("."):
        raise KforgeBadAnswer(f"{field}: got {name!r}, a bundle file name must be non-empty "
                              "letters, digits, '_', '-', '.'")
    return name


def kernel_path(key):
    return f"{KERNELS_DIR}/{_check_stem('variant key', key)}.kfa"


def first_choice(manifest):
    """The variant the manifest ranks first."""
    return manifest.variants[manifest.choice_order[0] if manifest.choice_order else 0]


def manifest_path(manifest):
    return f"{MANIFESTS_DIR}/{_check_stem('module_name', first_choice(manifest).module_name)}.json"


def manifest_to_json(manifest):
    """runtime/bundle.cc's ManifestJson options: proto field names, every
    field printed (sm_count 0 included), indented, newline at the end."""
    json_format = pb().json_format
    try:
        text = json_format.MessageToJson(manifest, preserving_proto_field_name=True,
                                         including_default_value_fields=True, indent=1)
    except TypeError:  # protobuf >= 5.26 renamed the option
        text = json_format.MessageToJson(manifest, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True, indent=1)
    return text + "\n"


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def write_file_atomic(path, data):
    """Writes to a temporary name and renames it, so a reader sees the whole
    old file or the whole new one."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_marker(directory):
    """Raises KforgeError unless `directory` holds a bundle this client reads."""
    path = os.path.join(directory, MARKER_FILE)
    try:
        with open(path, "rb") as f:
            marker = json.loads(f.read())
    except FileNotFoundError:
        raise KforgeError(f"{directory}: not a kforge bundle ({MARKER_FILE} is missing); "
                          "write one with `kforge prebuild`") from None
    except (OSError, ValueError) as e:
        raise KforgeError(f"{path}: unreadable bundle marker ({e})") from None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        raise KforgeError(f"{path}: expected {{\"format\": \"{FORMAT}\", ...}}, got {marker!r}")
    if marker.get("format_version") != FORMAT_VERSION:
        raise KforgeError(f"{path}: bundle format_version {marker.get('format_version')!r}; "
                          f"this client reads version {FORMAT_VERSION}")


def parse_checksums(text, path):
    """{relative path: sha256 hex} from sha256sum's format."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition(" ")
        name = name[1:] if name.startswith((" ", "*")) else name
        if not sep or len(digest) != 64 or not name:
            raise KforgeBadAnswer(f"{path}:{number}: expected '<sha256 hex>  <path>', "
                                  f"got {line!r}")
        sums[name] = digest.lower()
    return sums


def read_checksums(directory):
    path = os.path.join(directory, CHECKSUMS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return parse_checksums(f.read(), path)
    except FileNotFoundError:
        raise KforgeBadAnswer(f"{path} is missing; the bundle is incomplete "
                              "(a `kforge prebuild` that did not finish?)") from None


def format_checksums(sums):
    return "".join(f"{sums[name]}  {name}\n" for name in sorted(sums))


def read_verified(directory, rel, sums):
    """The bytes of DIR/rel after checking them against checksums.sha256."""
    path = os.path.join(directory, rel)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise KforgeNotFound(f"{path} is missing from the bundle") from None
    want = sums.get(rel)
    if want is None:
        raise KforgeBadAnswer(f"{path} is not listed in {CHECKSUMS_FILE}")
    got = sha256_hex(data)
    if got != want:
        raise KforgeBadAnswer(f"{path}: sha256 {got} does not match {want} in "
                              f"{CHECKSUMS_FILE} (damaged or changed; rebuild the bundle "
                              "with `kforge prebuild`)")
    return data


def parse_kernel(data, path):
    artifact = pb().artifact_pb2.KernelArtifact()
    try:
        artifact.ParseFromString(data)
    except Exception as e:  # DecodeError; the exact type varies by protobuf backend
        raise KforgeBadAnswer(f"{path}: not a KernelArtifact ({e})") from None
    return artifact


def parse_manifest(data, path):
    manifest = pb().service_pb2.Manifest()
    try:
        # Unknown fields are skipped as in binary parsing; incompatible
        # changes bump the bundle format version instead.
        pb().json_format.Parse(data.decode("utf-8"), manifest, ignore_unknown_fields=True)
    except Exception as e:  # ParseError, UnicodeDecodeError
        raise KforgeBadAnswer(f"{path}: not a Manifest in protobuf JSON ({e})") from None
    return manifest


def find_manifest(manifests, spec, arch):
    """The manifest for `spec` on `arch`: one whose first choice is `spec`,
    else one with any variant equal to it (an MTP spec in a bundle
    prebuilt for plain decode); None when there is none."""
    same_arch = [m for m in manifests if canonical_arch(m.arch) == canonical_arch(arch)]
    for m in same_arch:
        if m.variants and first_choice(m).spec == spec:
            return m
    for m in same_arch:
        if any(v.spec == spec for v in m.variants):
            return m
    return None


class Bundle(KernelSource):
    """Reads manifests and kernels from a bundle directory, no server.

    Opening checks the marker and reads and verifies every manifest; kernels
    are read on demand, checked against checksums.sha256 and their variant,
    and kept in memory. Every error names the file."""

    def __init__(self, directory):
        self.dir = os.fspath(directory)
        read_marker(self.dir)
        self._sums = read_checksums(self.dir)
        self.manifests = [parse_manifest(read_verified(self.dir, rel, self._sums),
                                         os.path.join(self.dir, rel))
                          for rel in self._listed(MANIFESTS_DIR, ".json")]
        self._kernels = {}
        self._lock = threading.Lock()

    def _listed(self, sub, suffix):
        try:
            names = sorted(os.listdir(os.path.join(self.dir, sub)))
        except FileNotFoundError:
            return []
        return [f"{sub}/{n}" for n in names if n.endswith(suffix)]

    def __repr__(self):
        return f"Bundle({self.dir!r})"

    def get_manifest(self, preset=None, tp=None, spec=None, arch=None):
        if arch is None:
            raise ValueError("arch= is required (e.g. arch='sm_90a')")
        wanted = selector_spec(selector(preset=preset, tp=tp, spec=spec))
        manifest = find_manifest(self.manifests, wanted, arch)
        if manifest is None:
            held = "\n  ".join(first_choice(m).module_name for m in self.manifests if m.variants)
            asked = f"preset {preset} tp {tp or 1}" if preset is not None else "the spec"
            raise KforgeNotFound(
                f"bundle {self.dir} has no manifest for {asked} on {canonical_arch(arch)} "
                f"(heads {wanted.num_q_heads}, s_q {wanted.s_q}, topk {wanted.topk}, page "
                f"size {wanted.page_block_size}, scale {wanted.softmax_scale:g}, lse "
                f"{wanted.return_lse}); it holds:\n  {held or '(no manifests)'}")
        check_manifest(manifest, arch, f"bundle {self.dir}")
        return manifest

    def get_kernel(self, variant, arch):
        key = (variant.key, canonical_arch(arch))
        with self._lock:
            artifact = self._kernels.get(key)
        if artifact is None:
            rel = kernel_path(variant.key)
            path = os.path.join(self.dir, rel)
            artifact = parse_kernel(read_verified(self.dir, rel, self._sums), path)
            check_artifact(variant, arch, artifact, f"bundle file {path}")
            with self._lock:
                self._kernels[key] = artifact
        return artifact


class LocalCopy:
    """A Client's copy of what it fetched, in the bundle layout (readable
    with Bundle). Each write, and the checksums.sha256 update after it,
    happens under an flock on the directory itself, the lock the C++
    BundleWriter takes, so several processes (Python or C++) may share one
    directory.
    Damaged or unlisted files read as absent: they are fetched again."""

    def __init__(self, directory):
        self.dir = os.fspath(directory)
        for sub in (KERNELS_DIR, MANIFESTS_DIR):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        marker = os.path.join(self.dir, MARKER_FILE)
        with self._locked():
            if not os.path.exists(marker):
                body = json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION})
                write_file_atomic(marker, body.encode() + b"\n")
            read_marker(self.dir)
            if not os.path.exists(os.path.join(self.dir, CHECKSUMS_FILE)):
                write_file_atomic(os.path.join(self.dir, CHECKSUMS_FILE), b"")

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the lock

    def _sums(self):
        try:
            return read_checksums(self.dir)
        except KforgeBadAnswer:
            return {}

    def _add(self, rel, data):
        with self._locked():
            write_file_atomic(os.path.join(self.dir, rel), data)
            sums = self._sums()
            sums[rel] = sha256_hex(data)
            write_file_atomic(os.path.join(self.dir, CHECKSUMS_FILE),
                              format_checksums(sums).encode())

    def add_kernel(self, artifact):
        self._add(kernel_path(artifact.key), artifact.SerializeToString(deterministic=True))

    def add_manifest(self, manifest):
        if manifest.sm_count != 0:
            raise ValueError("a bundle manifest leaves the split count symbolic (sm_count 0)")
        self._add(manifest_path(manifest), manifest_to_json(manifest).encode())

    def kernel(self, variant, arch):
        """The stored kernel of `variant`, or None when absent or damaged."""
        rel = kernel_path(variant.key)
        path = os.path.join(self.dir, rel)
        try:
            artifact = parse_kernel(read_verified(self.dir, rel, self._sums()), path)
            check_artifact(variant, arch, artifact, f"local copy {path}")
            return artifact
        except KforgeNotFound:
            return None
        except KforgeError as e:
            _log.warning("kforge: ignoring the local copy of %s: %s", variant.module_name, e)
            return None

    def manifest(self, sel, arch):
        """The stored manifest for a selector on `arch`, or None."""
        sums = self._sums()
        manifests = []
        for rel in sorted(r for r in sums if r.startswith(MANIFESTS_DIR + "/")):
            try:
                manifests.append(parse_manifest(read_verified(self.dir, rel, sums), rel))
            except KforgeError as e:
                _log.warning("kforge: ignoring local copy %s: %s", rel, e)
        return find_manifest(manifests, selector_spec(sel), arch)
