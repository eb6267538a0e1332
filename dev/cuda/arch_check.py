#!/usr/bin/env python3
"""arch_check.py: the CUDA backend's device code compiled for every GPU architecture it supports, without a GPU.

    python3 dev/cuda/arch_check.py [--nvcc NVCC] [--out DIR] ARCH ...     e.g. 80 86 89 90 100 120

For each architecture (compute capability without the dot), nvcc compiles train_gpt.cu's device code (every
kernel of the trainer, the evaluators and the chat tools: they all come in through train_gpt.cu) to a cubin
for that architecture, with ptxas's resource report (-Xptxas -v) and the PTX kept (--keep). Checks, per
architecture:
  * it compiles, warnings as errors (ptxas's too);
  * every kernel declares __launch_bounds__ (a .maxntid in its PTX): without it ptxas may give a kernel more
    registers than a block of its size can have (64K registers per block on sm_80 to sm_120), and the launch
    fails at run time, on some architectures only;
  * no kernel's static shared memory is above the 48 KB a block gets without the opt-in.
Then a table: kernels, the most registers of one kernel, the kernels that spill (a performance note, not a
failure) and the compile time. Dynamic shared memory is the run-time side: attention_kernel_plan chooses it
for the GPU present, and the emulator's device profiles test that (dev/cuda/emu/README.md).
Ends with "N passed, N failed"; exit code 1 on any failure. Standard library only.
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_arch(nvcc, arch, out):
    """Compiles train_gpt.cu for sm_ARCH; returns (ok, ptxas log, PTX text, seconds)."""
    keep = os.path.join(out, 'sm_%s' % arch)
    os.makedirs(keep, exist_ok=True)
    cmd = [nvcc, '-O3', '-std=c++17', '-arch=sm_%s' % arch, '-cubin', '-Xptxas', '-v', '-Werror', 'all-warnings',
           '--keep', '--keep-dir', keep, '-Xcompiler', '-fopenmp', os.path.join(REPO, 'train_gpt.cu'),
           '-o', os.path.join(keep, 'train_gpt.cubin')]
    t0 = time.time()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.time() - t0
    ptx_files = [f for f in os.listdir(keep) if f.endswith('.ptx')]
    ptx = open(os.path.join(keep, ptx_files[0])).read() if len(ptx_files) == 1 else ''
    return r.returncode == 0, r.stdout + r.stderr, ptx, seconds


def parse_ptxas(log):
    """{kernel: {'regs', 'spill', 'smem'}} from ptxas -v (functions that are not kernels included: harmless)."""
    kernels, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            kernels[current] = {'regs': 0, 'spill': 0, 'smem': 0}
            continue
        if current is None:
            continue
        m = re.search(r'(\d+) bytes spill stores, (\d+) bytes spill loads', line)
        if m:
            kernels[current]['spill'] = int(m.group(1)) + int(m.group(2))
        m = re.search(r'Used (\d+) registers', line)
        if m:
            kernels[current]['regs'] = int(m.group(1))
            m2 = re.search(r'(\d+) bytes smem', line)
            kernels[current]['smem'] = int(m2.group(1)) if m2 else 0
    return kernels


def entries_without_bounds(ptx):
    """The kernels (.entry) whose PTX has neither .maxntid nor .reqntid."""
    missing = []
    for m in re.finditer(r'\.entry\s+(\S+?)\s*\((.*?)\)\s*(.*?)\{', ptx, re.S):
        if '.maxntid' not in m.group(3) and '.reqntid' not in m.group(3):
            missing.append(m.group(1))
    return missing


def demangle(names):
    try:
        return subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')[:len(names)]
    except OSError:
        return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('archs', nargs='+', help='compute capabilities without the dot: 80 86 89 90 100 120')
    ap.add_argument('--nvcc', default='nvcc')
    ap.add_argument('--out', default=os.path.join(REPO, 'build', 'arch'), help='where the cubins and PTX go (default build/arch)')
    a = ap.parse_args()
    for arch in a.archs:
        if not re.fullmatch(r'[1-9][0-9]{1,2}', arch):
            sys.exit('arch_check.py: error: architecture %r is not a compute capability without the dot (e.g. 86)' % arch)
    passed = failed = 0
    rows = []

    def check(ok, what, detail=''):
        nonlocal passed, failed
        print('%s  %s%s' % ('PASS' if ok else 'FAIL', what, (': ' + detail) if detail else ''), flush=True)
        passed, failed = passed + ok, failed + (not ok)

    # the architectures compile side by side, one per core (each nvcc is one process); they are read in order
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        compiled = list(pool.map(lambda arch: compile_arch(a.nvcc, arch, a.out), a.archs))
    for arch, (ok, log, ptx, seconds) in zip(a.archs, compiled):
        check(ok, 'sm_%s: train_gpt.cu device code compiles' % arch, '' if ok else '\n' + log[-4000:])
        if not ok:
            continue
        kernels = parse_ptxas(log)
        entries = re.findall(r'\.entry\s+(\S+?)\s*\(', ptx)
        missing = entries_without_bounds(ptx)
        check(bool(entries) and not missing, 'sm_%s: all %d kernels declare __launch_bounds__' % (arch, len(entries)),
              ', '.join(demangle(missing)) if missing else ('' if entries else 'no kernel found in the PTX'))
        big = [k for k in entries if kernels.get(k, {}).get('smem', 0) > 48 * 1024]
        check(not big, 'sm_%s: static shared memory of every kernel within 48 KB' % arch, ', '.join(demangle(big)))
        in_entries = [kernels[k] | {'name': k} for k in entries if k in kernels]
        top = max(in_entries, key=lambda k: k['regs']) if in_entries else {'regs': 0, 'name': '-'}
        spilling = [k for k in in_entries if k['spill'] > 0]
        rows.append((arch, len(entries), top['regs'], demangle([top['name']])[0].split('(')[0], len(spilling),
                     sum(k['spill'] for k in spilling), seconds))
    print('\n%-6s %8s %9s  %-44s %9s %12s %7s' % ('arch', 'kernels', 'max regs', 'kernel with the most', 'spilling', 'spill bytes', 'time'))
    for r in rows:
        print('sm_%-3s %8d %9d  %-44s %9d %12d %6.0fs' % r)
    print('arch_check: %d passed, %d failed' % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
