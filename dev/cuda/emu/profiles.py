#!/usr/bin/env python3
"""profiles.py TRAIN_GPT [--table]: the emulated trainer's start-up on every device profile of the emulator
(EMU_DEVICE, cuda_runtime.h), with -n 0 (the model, the kernels and the memory plan; nothing allocated).

Checks, per profile:
  * the attention kernels' shared memory, and the dq kernel's K/V buffering: double-buffered (102 KB per block
    at head_dim 128) only where the card's opt-in limit allows it. The expected choice per card and the byte
    counts are written here from the CUDA programming guide's limits and the kernels' buffers, not taken from
    the program;
  * the default micro-batch (no -b) of -d 12 and -d 24 at head_dim 64 and 128, with XSA learnable on every layer
    (the largest plan, which the default is sized by): its printed memory plan is within 85% of the card's free
    memory and twice the rows is not (or it is already nanochat's 32); where even 1 row is above, a run (-n 1)
    stops with one error before allocating;
  * refusals, each one `error:` line and exit code 1, before anything is allocated: a card below compute
    capability 8.0 (T4); a binary without code for the card (EMU_BINARY_ARCH=90 on an RTX 4090); a kernel that
    needs more shared memory than the card offers (EMU_SMEM_OPTIN); -b 32 for -d 24 on a 24 GB card (-n 1);
    XSA_ATTN_BACKWARD past the variants;
  * the attention kernels' variants of 128 rows and keys, picked by XSA_ATTN_FORWARD and XSA_ATTN_BACKWARD, where
    the card holds them, and the first variants where it does not.
And that a binary built for sm_80 starts on an sm_89 card, and one built for 80 and 90 on a B200 (the PTX).
--table: also prints the README's table of default micro-batches and planned memory per card and depth.
Run from the source tree (the embedded data). Ends with "N passed, N failed"; exit 1 on a failure.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'test'))
import craft  # noqa: E402  (dev/test/craft.py: tokenizer and shard files)

# (profile key, card, dq double-buffered at head_dim 128): opt-in shared memory per block 227 KB (sm_90, sm_100),
# 163 KB (sm_80), 99 KB (sm_86, sm_89, sm_120)
CARDS = [('a100', 'A100 80GB', True), ('rtx3090', 'RTX 3090', False), ('rtx4090', 'RTX 4090', False), ('l40s', 'L40S', False),
         ('h100', 'H100 80GB', True), ('h200', 'H200', True), ('b200', 'B200', True), ('rtx5090', 'RTX 5090', False)]
# bytes of dynamic shared memory per block: (D + 8)-element bf16 rows of 64-row tiles: forward Q, K, V x2 (5 tiles);
# dq Q, dY, K, V x stages (4 or 6 tiles); dK/dV K, V and Q, dY x2 of BQ rows (64 at D 64, 32 at D 128) + lse, delta
SMEM = {64: {'forward': 5 * 64 * 72 * 2, 'dq2': 6 * 64 * 72 * 2, 'dkdv': (128 + 4 * 64) * 72 * 2 + 4 * 64 * 4},
        128: {'forward': 5 * 64 * 136 * 2, 'dq1': 4 * 64 * 136 * 2, 'dq2': 6 * 64 * 136 * 2, 'dkdv': (128 + 4 * 32) * 136 * 2 + 4 * 32 * 4}}
BASE = ['-n', '0', '--sample-every', '-1', '--core-every', '-1']  # + the data of ClimbMix's vocabulary (main)
MODELS = {'d12': ['-d', '12'], 'd24': ['-d', '24'], 'd12 hd128': ['-d', '12', '--head-dim', '128'], 'd24 hd128': ['-d', '24', '--head-dim', '128']}

passed = failed = 0


def check(ok, what, detail=''):
    global passed, failed
    print('%s  %s%s' % ('PASS' if ok else 'FAIL', what, (': ' + detail) if detail else ''), flush=True)
    passed, failed = passed + bool(ok), failed + (not ok)


def run(binary, args, **env):
    e = dict(os.environ, XSA_DATA_DIR='none', OMP_NUM_THREADS='1')
    for name in ('EMU_BINARY_ARCH', 'EMU_SMEM_OPTIN', 'XSA_ATTN_FORWARD', 'XSA_ATTN_BACKWARD'):  # (a caller's setting changes no verdict)
        e.pop(name, None)
    e.update(env)
    r = subprocess.run([binary] + args, capture_output=True, text=True, env=e, timeout=600)
    return r.returncode, r.stdout, r.stderr


def one_error(rc, out, err, *words):
    """exit 1, exactly one error: line on stderr, naming each of words"""
    lines = [l for l in (out + err).splitlines() if l.startswith('error:')]
    ok = rc == 1 and len(lines) == 1 and all(w in lines[0] for w in words)
    return ok, lines[0] if lines else 'exit %d, no error line: %s' % (rc, (out + err)[-300:])


def plan(out):
    """(rows, planned MiB, free MiB, kernel line) from a -n 0 start-up"""
    rows = re.search(r'batch: (\d+) rows per micro-batch', out)
    mem = re.search(r'total ([\d.]+) MiB \(free on the GPU: ([\d.]+) MiB\)', out)
    kern = re.search(r'^attention kernels .*$', out, re.M)
    return (int(rows.group(1)) if rows else None, float(mem.group(1)) if mem else None, float(mem.group(2)) if mem else None,
            kern.group(0) if kern else '')


def main():
    if len(sys.argv) < 2:
        sys.exit('usage: profiles.py TRAIN_GPT [--table]')
    binary, table = os.path.abspath(sys.argv[1]), '--table' in sys.argv[2:]
    # the study's vocabulary, 32768 (nanochat's tokenizer: 9 special tokens last, BOS the first of them), since
    # the logits are a large part of the plan: a tokenizer file of that size and two small shards
    tmp = tempfile.mkdtemp(prefix='xsa_profiles_')
    vocab, bos = 32768, 32759
    records = [(0, bytes([i])) for i in range(256)] + [(0, b'piece%d' % i) for i in range(256, bos)] + [(1, b'<|special%d|>' % i) for i in range(9)]
    craft.write(os.path.join(tmp, 'tokenizer.bin'), craft.tokenizer(records, bos, []))
    craft.write(os.path.join(tmp, 'train_000.bin'), craft.shard(craft.documents(bos, 400, length=300, vocab=vocab)))
    craft.write(os.path.join(tmp, 'val_000.bin'), craft.shard(craft.documents(bos, 100, length=300, vocab=vocab, seed=2)))
    BASE.extend(['--tokenizer', os.path.join(tmp, 'tokenizer.bin'), '-i', os.path.join(tmp, 'train_*.bin'), '-j', os.path.join(tmp, 'val_*.bin')])
    results = {}
    for key, card, double in CARDS:
        for model, margs in MODELS.items():
            D = 128 if 'hd128' in model else 64
            # -x learn: XSA on every layer, alpha learnable, the largest plan, which the default micro-batch is sized by
            # (so that a baseline and its XSA arms get the same rows)
            rc, out, err = run(binary, margs + BASE + ['-x', 'learn'], EMU_DEVICE=key)
            rows, mib, free, kern = plan(out)
            if rc != 0 or rows is None or mib is None:
                check(False, '%s %s: start-up with -n 0' % (card, model), (out + err)[-400:])
                continue
            s = SMEM[D]
            dq = s['dq2'] if (double or D == 64) else s['dq1']
            want = 'forward %d (64 rows), dq %d (64 rows, K/V %s), dK/dV %d (64 keys) bytes' % (s['forward'], dq, 'double-buffered' if dq == s['dq2'] else 'single-buffered', s['dkdv'])
            check(want in kern, '%s %s: attention kernels %s' % (card, model, want), '' if want in kern else kern or 'no kernel line')
            if mib > 0.85 * free:  # only where even one row does not fit: then a run stops before allocating
                ok = rows == 1
                if ok:
                    ok, line = one_error(*run(binary, margs + BASE[2:] + ['-n', '1', '-x', 'learn'], EMU_DEVICE=key), 'even -b 1 needs')
                check(ok, '%s %s: does not fit (plan %.0f MiB for 1 row, %.0f MiB free): a run is refused with one error' % (card, model, mib, free),
                      line if rows == 1 else 'the default is %d rows, above 85%% of free memory' % rows)
                results[(card, model)] = (0, mib)
                continue
            larger = True
            if rows < 32:
                rc2, out2, err2 = run(binary, margs + BASE + ['-x', 'learn', '-b', str(2 * rows)], EMU_DEVICE=key)
                larger = rc2 == 0 and re.search(r'^warning: %d rows per micro-batch need' % (2 * rows), out2, re.M) is not None
            check(larger, '%s %s: default micro-batch %d rows, plan %.0f MiB of %.0f MiB free' % (card, model, rows, mib, free),
                  '' if larger else '%d rows would fit too' % (2 * rows))
            results[(card, model)] = (rows, mib)

    ok, line = one_error(*run(binary, MODELS['d12'] + BASE, EMU_DEVICE='t4'), 'compute capability 7.5', '8.0')
    check(ok, 'T4 (sm_75): refused at start-up', line)
    ok, line = one_error(*run(binary, MODELS['d12'] + BASE, EMU_DEVICE='rtx4090', EMU_BINARY_ARCH='90'), 'no GPU code', 'CUDA_ARCH=89')
    check(ok, 'RTX 4090, a binary built for sm_90 only: refused with the rebuild command', line)
    rc, out, err = run(binary, MODELS['d12'] + BASE, EMU_DEVICE='rtx4090', EMU_BINARY_ARCH='80')
    check(rc == 0, 'RTX 4090 (8.9), a binary built for sm_80: starts (same major version)', '' if rc == 0 else (out + err)[-300:])
    rc, out, err = run(binary, MODELS['d12'] + BASE, EMU_DEVICE='b200', EMU_BINARY_ARCH='80 90')
    check(rc == 0, 'B200 (10.0), a binary built for 80 and 90: starts (the PTX of 90)', '' if rc == 0 else (out + err)[-300:])
    ok, line = one_error(*run(binary, MODELS['d12 hd128'] + BASE, EMU_DEVICE='rtx4090', EMU_SMEM_OPTIN='65536'), 'forward',
                         str(SMEM[128]['forward']), '65536')
    check(ok, 'a card with 64 KB per block, head_dim 128: refused naming the kernel and the bytes', line)
    ok, line = one_error(*run(binary, MODELS['d24'] + ['-n', '1', '-b', '32', '--sample-every', '-1', '--core-every', '-1'],
                              EMU_DEVICE='rtx4090'), '32 rows per micro-batch need', 'fits')
    check(ok, 'RTX 4090, -d 24 -b 32: refused before allocating, with the -b that fits', line)
    # the kernels' variants picked for a run (XSA_ATTN_FORWARD, XSA_ATTN_BACKWARD: what gpu_check's timings compare)
    # at head_dim 128: those of 128 rows and keys where the card holds them (forward (128 + 4 x 64) rows, dq
    # (2 x 128 + 2 x 2 x 64), dK/dV (2 x 128 + 4 x 32) + lse and delta), the first ones where it does not (99 KB)
    big = {'forward': (128 + 4 * 64) * 136 * 2, 'dq': (2 * 128 + 4 * 64) * 136 * 2, 'dkdv': (2 * 128 + 4 * 32) * 136 * 2 + 4 * 32 * 4}
    for key, card, want in [('h200', 'H200', 'forward %d (128 rows), dq %d (128 rows, K/V double-buffered), dK/dV %d (128 keys) bytes' %
                             (big['forward'], big['dq'], big['dkdv'])),
                            ('rtx4090', 'RTX 4090', 'forward %d (64 rows), dq %d (64 rows, K/V single-buffered), dK/dV %d (64 keys) bytes' %
                             (SMEM[128]['forward'], SMEM[128]['dq1'], SMEM[128]['dkdv']))]:
        rc, out, err = run(binary, MODELS['d12 hd128'] + BASE, EMU_DEVICE=key, XSA_ATTN_FORWARD='2', XSA_ATTN_BACKWARD='3')
        kern = plan(out)[3]
        check(rc == 0 and want in kern, '%s, head_dim 128, XSA_ATTN_FORWARD=2 XSA_ATTN_BACKWARD=3: %s' % (card, want),
              '' if rc == 0 and want in kern else kern or (out + err)[-300:])
    ok, line = one_error(*run(binary, MODELS['d12'] + BASE, EMU_DEVICE='h200', XSA_ATTN_BACKWARD='4'), 'XSA_ATTN_BACKWARD=4', '0 to 3')
    check(ok, 'XSA_ATTN_BACKWARD=4: refused, naming the variants', line)

    if table:
        print('\n| card | ' + ' | '.join(MODELS) + ' |')
        print('|---|' + '---|' * len(MODELS))
        for key, card, _ in CARDS:
            cells = [('%d rows, %.1f GiB' % (results[(card, m)][0], results[(card, m)][1] / 1024) if results[(card, m)][0] else
                      'does not fit (%.1f GiB at 1 row)' % (results[(card, m)][1] / 1024)) if (card, m) in results else '-' for m in MODELS]
            print('| %s | %s |' % (card, ' | '.join(cells)))
    print('profiles: %d passed, %d failed' % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
