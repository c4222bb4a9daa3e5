#!/usr/bin/env python3
"""Where a module's compile time goes, and what compiling its entries apart
would buy: NVRTC phases per program, CPU and wall seconds, and whether each
entry's machine code stays byte-identical.

For each module, `kforge compile --source` writes the instantiation unit
kforge compiles (and the cubin kforge made of it). This script then compiles
that unit through libnvrtc (ctypes) with kforge's options plus NVRTC's own
phase timer (`--time`):

  whole      the unit as kforge compiles it (its .text must equal kforge's)
  alone      one program per entry (the unit with the other extern "C"
             entries left out)
  by traits  one program per traits struct the entries instantiate (the
             sparse MLA throughput and small-batch tilings; an indexer has
             one), the combine on its own

  rdc + link (--rdc-link) the "by traits" programs compiled with
             -rdc=true on 2 threads at once (ctypes releases the GIL
             around NVRTC), their cubins linked into one image by
             nvJitLink: one cubin, entries compiled in parallel; prints
             the wall seconds to the linked cubin and, per entry, whether
             its .text is identical and how many SASS instructions it
             gained or lost (16 bytes each)

  alone where identical  (no compile of its own) each traits group as
             single entries where all of them kept their .text alone, else
             as the group: the best split this NVRTC allows with every
             entry's machine code unchanged

and prints, per program, the C++ front end, NVVM optimizer and PTX -> SASS
milliseconds, wall and CPU seconds (user + sys of this process), and per
split how many entries kept a byte-identical .text section, with the
makespan of the programs on 2 and 16 idle threads (longest first, each
program's CPU seconds; the module's "whole" figure is CPU seconds too).
Timings on a shared machine: read the CPU column. A timing is never a
test assertion.

    bench/compile_phases.py KFORGE_BINARY [--module "ARGS"]... [--all] [--rdc-link] [--out TABLE]

--module takes `kforge compile` arguments (without -o); the default is the
slowest preset module and three typical ones; --all takes the 36 preset
modules of bench/compile_times.sh. Needs libnvrtc (KFORGE_CUDA_ROOT or
/usr/local/cuda) and the templates/ folder beside this script.
"""
import argparse
import concurrent.futures
import ctypes
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from behaviour_digest import module_text_sections, text_sections  # noqa: E402
TEMPLATES = os.path.join(ROOT, "templates")
DEFAULT_MODULES = [
    "--preset deepseek-v3.2 --tp 1 --kv-dtype fp8_ds_mla --arch sm_90a",
    "--preset deepseek-v3.2 --tp 8 --kv-dtype bf16 --arch sm_90a",
    "--preset glm-5 --tp 8 --kv-dtype fp8_ds_mla --arch sm_120a",
    "--preset glm-5 --kind dsa-indexer --arch sm_90a",
]
# One `extern "C"` entry of a generated unit, its name and the traits
# struct its body instantiates (DecodeMain<Traits, ...>, Combine<Traits>).
ENTRY = re.compile(r'extern "C" __global__.*?\n(\w+)\(const [^)]*\) \{\n(.*?)\n\}\n', re.S)
TRAITS = re.compile(r"<(\w+)[,>]")


def all_modules():
    out = []
    for preset in ("deepseek-v3.2", "glm-5"):
        for arch in ("sm_90a", "sm_120a"):
            for tp in (1, 2, 4, 8):
                for kv in ("bf16", "fp8_ds_mla"):
                    out.append(f"--preset {preset} --tp {tp} --kv-dtype {kv} --arch {arch}")
            out.append(f"--preset {preset} --kind dsa-indexer --arch {arch}")
    return out


class Nvrtc:
    def __init__(self):
        root = os.environ.get("KFORGE_CUDA_ROOT", "/usr/local/cuda")
        self.lib = ctypes.CDLL(os.path.join(root, "lib64", "libnvrtc.so"))
        names, sources = [], []
        for dirpath, _, files in os.walk(TEMPLATES):
            for f in files:
                path = os.path.join(dirpath, f)
                names.append(os.path.relpath(path, TEMPLATES).encode())
                sources.append(open(path, "rb").read())
        n = len(names)
        self.names = (ctypes.c_char_p * n)(*names)
        self.sources = (ctypes.c_char_p * n)(*sources)
        self.count = n

    def compile(self, source, options, timing_file):
        """(cubin, {phase: ms}, wall s, cpu s) with kforge's options."""
        lib = self.lib
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"module.cu", self.count,
                                  self.sources, self.names) != 0:
            raise RuntimeError("nvrtcCreateProgram failed")
        # The options kforge gave NVRTC (the artifact records them), plus
        # the phase timer.
        opts = list(options) + [f"--time={timing_file}"]
        if os.path.exists(timing_file):
            os.remove(timing_file)
        c0, t0 = os.times(), time.monotonic()
        rc = lib.nvrtcCompileProgram(prog, len(opts),
                                     (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
        wall, c1 = time.monotonic() - t0, os.times()
        try:
            size = ctypes.c_size_t()
            if rc != 0:
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                raise RuntimeError(log.value.decode(errors="replace")[-4000:])
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, cubin)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
        phases = {}
        for line in open(timing_file).read().splitlines()[1:]:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3:
                phases[parts[1]] = phases.get(parts[1], 0) + float(parts[2])
        return cubin.raw, phases, wall, (c1.user - c0.user) + (c1.system - c0.system)


def link_cubins(cubins, arch):
    """One cubin of relocatable cubins (nvJitLink, -arch=ARCH)."""
    root = os.environ.get("KFORGE_CUDA_ROOT", "/usr/local/cuda")
    jl = ctypes.CDLL(os.path.join(root, "lib64", "libnvJitLink.so"))
    handle = ctypes.c_void_p()
    opts = [f"-arch={arch}".encode()]
    if jl.nvJitLinkCreate(ctypes.byref(handle), 1, (ctypes.c_char_p * 1)(*opts)) != 0:
        raise RuntimeError("nvJitLinkCreate failed")
    try:
        for i, cubin in enumerate(cubins):
            if jl.nvJitLinkAddData(handle, 1, cubin, ctypes.c_size_t(len(cubin)),
                                   f"p{i}.cubin".encode()) != 0:  # NVJITLINK_INPUT_CUBIN
                raise RuntimeError("nvJitLinkAddData failed")
        if jl.nvJitLinkComplete(handle) != 0:
            size = ctypes.c_size_t()
            jl.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            jl.nvJitLinkGetErrorLog(handle, log)
            raise RuntimeError(log.value.decode(errors="replace")[-2000:])
        size = ctypes.c_size_t()
        jl.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        jl.nvJitLinkGetLinkedCubin(handle, out)
        return out.raw
    finally:
        jl.nvJitLinkDestroy(ctypes.byref(handle))


def text_digests(cubin, tmp):
    """{entry: digest of its .text section} (behaviour_digest's reader)."""
    path = os.path.join(tmp, "program.cubin")
    with open(path, "wb") as f:
        f.write(cubin)
    return text_sections(path)


def only(source, keep):
    """The unit with every entry not in `keep` left out."""
    return ENTRY.sub(lambda m: m.group(0) if m.group(1) in keep else "", source)


def makespan(seconds, threads):
    """Longest-first over `threads` workers."""
    load = [0.0] * threads
    for s in sorted(seconds, reverse=True):
        load[load.index(min(load))] += s
    return max(load)


PHASES = (("CUDA C++ Frontend", "front end"), ("NVVM Optimizer", "NVVM"),
          ("PTX Translation", "ptxas"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kforge")
    parser.add_argument("--module", action="append", help="kforge compile arguments")
    parser.add_argument("--all", action="store_true", help="the 36 preset modules")
    parser.add_argument("--rdc-link", action="store_true",
                        help="also: the traits programs with -rdc=true on 2 threads, linked")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    modules = all_modules() if args.all else (args.module or DEFAULT_MODULES)
    nvrtc = Nvrtc()
    lines = [f"date {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {os.cpu_count()} cores, "
             f"load average {' '.join(open('/proc/loadavg').read().split()[:3])} at the start", "",
             "| module | program | entries | " + " | ".join(f"{p} (ms)" for _, p in PHASES) +
             " | wall (s) | CPU (s) | .text identical |",
             "|---|---|---:|" + "---:|" * (len(PHASES) + 3)]
    summary = []
    identical = {}
    with tempfile.TemporaryDirectory() as tmp:
        timing = os.path.join(tmp, "time.csv")
        for index, module in enumerate(modules):
            out = os.path.join(tmp, f"module{index}")
            subprocess.run([args.kforge, "compile", *shlex.split(module), "--source", "-o", out],
                           check=True, stdout=subprocess.DEVNULL)
            unit = next(f for f in os.listdir(out) if f.endswith(".cu"))
            stem = unit[:-3]
            source = open(os.path.join(out, unit)).read()
            kforge_text = module_text_sections(out, stem)  # every image kforge wrote
            options = json.load(open(os.path.join(out, stem + ".json")))["nvrtc_options"]
            entries = [(m.group(1), TRAITS.search(m.group(2)).group(1))
                       for m in ENTRY.finditer(source)]
            words = shlex.split(module)
            # "deepseek-v3.2 tp1 fp8_ds_mla sm_90a": the values, --tp's as tpN.
            label = " ".join(("tp" if flag == "--tp" else "") + value
                             for flag, value in zip(words, words[1:]) if flag.startswith("--"))

            def row(program, names, src, reference):
                cubin, phases, wall, cpu = nvrtc.compile(src, options, timing)
                text = text_digests(cubin, tmp)
                same = sum(text[n] == reference[n] for n in names)
                lines.append(f"| {label} | {program} | {len(names)} | " +
                             " | ".join(f"{phases.get(p, 0):.0f}" for p, _ in PHASES) +
                             f" | {wall:.2f} | {cpu:.2f} | {same}/{len(names)} |")
                # CPU seconds: what the program takes on an idle core.
                return text, cpu, same

            whole_text, whole_cpu, _ = row("whole", [e for e, _ in entries], source, kforge_text)
            if whole_text != kforge_text:
                sys.exit(f"{module}: the unit compiled here is not kforge's cubin (another NVRTC?)")
            splits = {
                "alone": [[e] for e, _ in entries],
                "by traits": [[e for e, t in entries if t == traits and "combine" not in e]
                              for traits in dict.fromkeys(t for _, t in entries)] +
                             [[e for e, _ in entries if "combine" in e]],
            }
            result = [f"{label}: whole {whole_cpu:.2f} s"]
            if args.rdc_link:
                programs = [names for names in splits["by traits"] if names]
                arch = next(o.split("=", 1)[1] for o in options
                            if o.startswith("--gpu-architecture="))

                def rdc(job):
                    i, names = job
                    return nvrtc.compile(only(source, set(names)), list(options) + ["-rdc=true"],
                                         os.path.join(tmp, f"rdc{i}.csv"))[0]
                c0, t0 = os.times(), time.monotonic()
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    linked = link_cubins(list(pool.map(rdc, enumerate(programs))), arch)
                wall, c1 = time.monotonic() - t0, os.times()
                cpu = (c1.user - c0.user) + (c1.system - c0.system)
                text = text_digests(linked, tmp)
                same = sum(text.get(e) == whole_text[e] for e, _ in entries)
                lines.append(f"| {label} | rdc + link, {len(programs)} programs on 2 threads | "
                             f"{len(entries)} | | | | {wall:.2f} | {cpu:.2f} | "
                             f"{same}/{len(entries)} |")
                delta = ", ".join(f"{e.replace('sparse_mla_decode_', '').replace('dsa_indexer_', '')} {(text[e][1] - whole_text[e][1]) // 16:+d}"
                                  for e, _ in entries if e in text)
                result.append(f"rdc + link {wall:.2f} s wall on 2 threads, {same}/{len(entries)} "
                              f"identical (SASS instructions gained: {delta})")
            measured = {}  # split -> [(entries, CPU s, identical)]
            for split, programs in splits.items():
                measured[split] = []
                for names in filter(None, programs):
                    name = names[0] if len(names) == 1 else "+".join(
                        n.rsplit("_", 1)[-1] for n in names)
                    _, cpu, kept = row(f"{split}: {name}", names, only(source, set(names)),
                                        whole_text)
                    measured[split].append((names, cpu, kept == len(names)))
            # Each traits group split into single entries where every one of
            # them kept its machine code, else compiled as the group.
            alone = {tuple(n): (w, ok) for n, w, ok in measured["alone"]}
            measured["alone where identical"] = []
            for names, cpu, ok in measured["by traits"]:
                if all(alone[(n,)][1] for n in names):
                    measured["alone where identical"] += [([n], *alone[(n,)]) for n in names]
                else:
                    measured["alone where identical"].append((names, cpu, ok))
            for split, programs in measured.items():
                seconds = [c for _, c, _ in programs]
                same = sum(len(n) for n, _, ok in programs if ok)
                identical.setdefault(split, [0, 0])
                identical[split][0] += same
                identical[split][1] += len(entries)
                result.append(f"{split} {same}/{len(entries)} identical, "
                              f"{makespan(seconds, 2):.2f} s on 2 threads, "
                              f"{makespan(seconds, 16):.2f} s on 16")
            summary.append("; ".join(result))
    lines += ["", *summary, ""]
    for split, (same, total) in identical.items():
        lines.append(f"{split}: {same} of {total} entries byte-identical to the whole module")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
