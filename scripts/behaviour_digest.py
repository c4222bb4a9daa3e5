#!/usr/bin/env python3
"""What a refactor must not change, as one file to diff.

Compiles a wide set of modules (both presets x TP 1/2/4/8 x bf16 / fp8_ds_mla
x sm_80 / sm_90a / sm_100a / sm_120a, the other KV formats, the extra cache,
a 99 KB cap on sm_90a, and the DSA indexers) with `kforge compile`, then
writes one line per kernel entry with the sha256 of its machine code (the
cubin's .text.<entry> section: equal bytes mean equal SASS) and its
registers, shared memory and launch bounds from the manifest, and one line
per module with the digest of the launch plans the C++ model library makes
for a grid of runtime shapes (tests/launch_plan_dump: arch, SM count,
forced splits, batch 1..160, s_q 1..4; over 10,000 cases in all).

    scripts/behaviour_digest.py BUILD_DIR OUT_FILE [-j N]

Compare two trees by running it in each and diffing the outputs. Module
names, entry names and plan parameter bytes are compared as they are;
cache keys and template digests (which any template edit changes) are not.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

PRESETS = ("deepseek-v3.2", "glm-5")
ARCHS = ("sm_80", "sm_90a", "sm_100a", "sm_120a")
SM_COUNTS = {"sm_80": (108,), "sm_90a": (132, 78), "sm_100a": (148,), "sm_120a": (188, 48)}


def spec_json(heads, dtype, rope, scale_format=None, topk=2048, extra=None):
    spec = {
        "num_q_heads": heads, "kv_lora_rank": 512,
        "rope_dim": rope, "topk": topk, "kv_cache_dtype": dtype, "page_block_size": 64,
        "softmax_scale": 0.0625, "return_lse": True,
    }
    if scale_format:
        spec["kv_scale_format"] = scale_format
    if extra:
        spec["extra_kv"] = extra
    return spec


def jobs():
    """(label, compile arguments, spec or None)."""
    out = []
    for preset in PRESETS:
        for arch in ARCHS:
            for tp in (1, 2, 4, 8):
                for kv in ("bf16", "fp8_ds_mla"):
                    out.append((f"{preset}-tp{tp}-{kv}-{arch}",
                                ["--preset", preset, "--tp", str(tp), "--kv-dtype", kv,
                                 "--arch", arch], None))
            out.append((f"{preset}-indexer-{arch}",
                        ["--preset", preset, "--kind", "dsa-indexer", "--arch", arch], None))
        out.append((f"{preset}-tp1-fp8-sm90a-99k",
                    ["--preset", preset, "--kv-dtype", "fp8_ds_mla", "--arch", "sm_90a",
                     "--max-smem-per-block", "101376"], None))
    for heads in (16, 64, 128):
        for dtype, rope in (("KV_CACHE_DTYPE_FP8_DS_MLA_V4", 0),
                            ("KV_CACHE_DTYPE_MXFP8_DS_MLA_V41", 0),
                            ("KV_CACHE_DTYPE_NVFP4_DS_MLA", 64)):
            for arch in ("sm_90a", "sm_120a"):
                out.append((f"h{heads}-{dtype[15:].lower()}-{arch}", ["--arch", arch],
                            spec_json(heads, dtype, rope, topk=512)))
    extra = {"kv_cache_dtype": "KV_CACHE_DTYPE_BF16", "topk": 128, "page_block_size": 64}
    for heads in (16, 64):
        out.append((f"h{heads}-v4-extra-sm90a", ["--arch", "sm_90a"],
                    spec_json(heads, "KV_CACHE_DTYPE_FP8_DS_MLA_V4", 0, topk=512, extra=extra)))
    return out


def text_sections(path):
    """{entry: (sha256 of .text.<entry>, size)} from an ELF64 cubin."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]
    result = {}
    for name_idx, _type, _flags, _addr, off, size, *_ in headers:
        end = data.index(b"\0", names_off + name_idx)
        name = data[names_off + name_idx:end].decode()
        if name.startswith(".text."):
            result[name[6:]] = (hashlib.sha256(data[off:off + size]).hexdigest()[:16], size)
    return result


def module_text_sections(out_dir, module):
    """text_sections over every cubin image of a module `kforge compile`
    wrote to out_dir: <module>.cubin, then <module>.cubin.<i>, as many as
    its description's cubin_info names (<module>.json)."""
    artifact = json.load(open(os.path.join(out_dir, module + ".json")))
    kernels = artifact.get("cubin_info", {}).get("kernels", [])
    images = 1 + max((int(k.get("image", 0)) for k in kernels), default=0)
    sections = {}
    for i in range(images):
        image = f"{module}.cubin" if i == 0 else f"{module}.cubin.{i}"
        sections.update(text_sections(os.path.join(out_dir, image)))
    return sections


def plan_cases(arch):
    lines = []
    for sms in SM_COUNTS[arch]:
        for forced in (0, 3):
            for batch in list(range(1, 65)) + [80, 96, 112, 128, 160]:
                for s_q in (1, 2, 3, 4):
                    lines.append(f"{arch} {sms} {forced} {batch} {s_q}\n")
    return "".join(lines)


def one(build, label, args, spec, tmp):
    out_dir = os.path.join(tmp, label)
    cmd = [os.path.join(build, "cli", "kforge"), "compile", *args, "-o", out_dir]
    if spec is not None:
        spec_path = os.path.join(tmp, label + ".json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        cmd += ["--spec", spec_path]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return [f"{label}\tcompile-error\t{run.stderr.strip().splitlines()[-1:]}"]
    lines = []
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".json"):
            continue
        module = name[:-5]
        artifact = json.load(open(os.path.join(out_dir, name)))
        kernels = {k["name"]: k for k in artifact.get("cubin_info", {}).get("kernels", [])}
        for entry, (digest, size) in sorted(module_text_sections(out_dir, module).items()):
            k = kernels.get(entry, {})
            stats = ",".join(f"{f}={k.get(f, 0)}" for f in (
                "registers", "static_smem_bytes", "local_bytes", "max_threads"))
            lines.append(f"{label}\t{module}\t{entry}\t{digest}\t{size}\t{stats}")
        if "dsa-indexer" in args:
            continue
        # `kforge manifest` takes the compile arguments but --max-smem-per-block.
        margs = [x for x in cmd[2:] if x not in ("-o", out_dir)]
        if "--max-smem-per-block" in margs:
            continue
        manifest = subprocess.run([cmd[0], "manifest", *margs],
                                  capture_output=True, text=True, check=True).stdout
        manifest_path = os.path.join(out_dir, module + ".manifest.json")
        with open(manifest_path, "w") as f:
            f.write(manifest)
        arch = args[args.index("--arch") + 1]
        dump = subprocess.run(
            [os.path.join(build, "tests", "launch_plan_dump"), manifest_path],
            input=plan_cases(arch), capture_output=True, text=True, check=True)
        # The cache key moves with any template edit; the plan must not.
        text = re.sub(r'"key":"[0-9a-f]*"', "", dump.stdout)
        n = text.count("\n")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        lines.append(f"{label}\t{module}\tplans\t{digest}\t{n}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    lines = []
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(a.j) as pool:
        futures = [pool.submit(one, build, label, args, spec, tmp)
                   for label, args, spec in jobs()]
        for f in futures:
            lines.extend(f.result())
    plans = sum(int(l.split("\t")[4]) // 2 for l in lines if l.split("\t")[2:3] == ["plans"])
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    entries = sum(1 for l in lines if l.split("\t")[2:3] != ["plans"])
    print(f"{len(jobs())} modules, {entries} entries, {plans} plan cases -> {a.out}")
    return 1 if any("compile-error" in l for l in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
