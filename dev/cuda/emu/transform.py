#!/usr/bin/env python3
# transform.py SRC DST: rewrites the CUDA sources of a snapshot (SRC) into g++-compilable emulator sources
# (DST, same tree; files without CUDA constructs are copied):
#   kernel<<<g, b, s, st>>>(args)                 -> emu_launch_("kernel", kernel, emu_cfg(g, b, s, st), args)
#   extern __shared__ T name[];                   -> T* name = (T*)emu_dyn_smem();
#   __shared__ T a[..], b[..];                    -> static T a[..], b[..]; plus NaN poisoning per block
#   __global__ void __launch_bounds__(N) f(...) { -> the body starts with emu_check_launch_bounds(N);
#   attention.cuh's inline-asm helpers (cp.async, ldmatrix, mma.sync) -> the emulator's versions
import os
import re
import sys


def body_replace(s, name, newbody):
    """Replaces the body of the __forceinline__ function `name` (its definition, not a call)."""
    i = s.find(name + '(')
    while i >= 0 and '__forceinline__' not in s[s.rfind('\n', 0, i):i]:
        i = s.find(name + '(', i + 1)
    assert i >= 0, name
    j = s.find('{', i)
    depth, k = 0, j
    while True:
        if s[k] == '{':
            depth += 1
        elif s[k] == '}':
            depth -= 1
            if depth == 0:
                break
        k += 1
    return s[:j] + '{ ' + newbody + ' }' + s[k + 1:]


def launches(s):
    out, pos = [], 0
    for m in re.finditer(r'(\b\w+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(', s, re.S):
        out.append(s[pos:m.start()])
        kernel, cfg = m.group(1), m.group(2)
        name = re.sub(r'<.*', '', kernel)
        no_args = s[m.end():].lstrip().startswith(')')
        out.append('emu_launch_("%s", %s, emu_cfg(%s)%s' % (name, kernel, cfg, '' if no_args else ', '))
        pos = m.end()
    out.append(s[pos:])
    return ''.join(out)


def shared(s):
    s = re.sub(r'extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;',
               r'\1* \2 = (\1*)emu_dyn_smem();', s)

    def static_shared(m):
        typ, decls = m.group(1), m.group(2)
        names = [re.match(r'\s*(\w+)', d).group(1) for d in decls.split(',')]
        return 'static %s %s; %s' % (typ, decls, ' '.join('emu_shared_poison(&%s, sizeof %s);' % (n, n) for n in names))
    return re.sub(r'__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+)\s+([^;]+);', static_shared, s)


def launch_bounds(s):
    out, pos = [], 0
    for m in re.finditer(r'__launch_bounds__\(([^()]*(?:\([^()]*\))?[^()]*)\)', s):
        j = s.find('{', m.end())
        out.append(s[pos:m.start()])
        out.append(s[m.end():j + 1])
        out.append(' emu_check_launch_bounds(%s);' % m.group(1).split(',')[0])
        pos = j + 1
    out.append(s[pos:])
    return ''.join(out)


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: transform.py SRC DST')
    src, dst = sys.argv[1], sys.argv[2]
    for root, _, files in os.walk(src):
        for f in files:
            # the emulator's own headers (this directory, in the snapshot) are used as they are
            if not re.search(r'\.(cuh|cu|h|cpp)$', f) or f in ('cuda_runtime.h', 'cublasLt.h', 'cuda_bf16.h'):
                continue
            path = os.path.join(root, f)
            s = open(path).read()
            if '__CUDACC__' in s or '<<<' in s or '__global__' in s:
                s = launch_bounds(shared(launches(s)))
            if f == 'attention.cuh':
                s = body_replace(s, 'attn_cp_async_16', 'emu_cp_async_16(smem, gmem);')
                s = body_replace(s, 'attn_cp_async_commit', 'emu_cp_async_commit();')
                s = body_replace(s, 'attn_cp_async_wait', 'emu_cp_async_wait(N);')
                s = body_replace(s, 'attn_ldmatrix_x4', 'emu_ldmatrix_x4(r, smem, false);')
                s = body_replace(s, 'attn_ldmatrix_x4_trans', 'emu_ldmatrix_x4(r, smem, true);')
                s = body_replace(s, 'attn_mma', 'emu_mma(c, a, b0, b1);')
            rel = os.path.relpath(path, src)
            # inline PTX cannot run on the CPU: a new asm block needs an emulator version above
            if re.search(r'\basm\b', s) and f.endswith(('.cuh', '.cu')) and '__CUDACC__' in s:
                sys.exit('transform.py: inline asm left in %s (add its emulator version)' % rel)
            out = os.path.join(dst, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            open(out, 'w').write(s)


main()
