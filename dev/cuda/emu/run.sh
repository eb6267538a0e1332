#!/bin/bash
# dev/cuda/emu/run.sh [TARGET ...]: runs the CUDA code on the CPU emulator (README.md). Snapshots the
# working tree (tracked and untracked, not ignored) into a temporary directory, transforms and patches
# the copy, builds with g++ and runs the targets; exits non-zero if any check fails or the emulator,
# ASan or UBSan reports a hazard.
#   targets: selftest elementwise loss matmul optim attention test_xsa train train_ranks gpu_check, or all (default: selftest)
#   EMU_ASAN=1   build the targets with ASan+UBSan (the self-test always is)
#   EMU_KEEP=1   keep the temporary directory (sources, binaries, one log per target)
#   EMU_JOBS=N   targets run N at a time (default: one per core; each target is one process, its fibers on one thread)
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
in_git=0
git -C "$root" rev-parse --show-toplevel > /dev/null 2>&1 && in_git=1
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(selftest)
[ "${targets[*]}" = all ] && targets=(selftest elementwise loss matmul optim attention test_xsa train train_ranks profiles)
for t in "${targets[@]}"; do
    case $t in selftest|elementwise|loss|matmul|optim|attention|test_xsa|train|train_ranks|gpu_check|profiles) ;; *) echo "run.sh: unknown target $t"; exit 2 ;; esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/xsa_emu.XXXXXX")
if [ "${EMU_KEEP:-0}" = 1 ]; then echo "emu: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work/src" "$work/bin" "$work/logs"
if [ $in_git = 1 ]; then
    (cd "$root" && git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -x -C "$work/src" || exit 1
else  # an unpacked source tree: everything in it
    tar -C "$root" -cf - . | tar -x -C "$work/src" || exit 1
fi
emu=$work/src/dev/cuda/emu  # the snapshot's emulator: the run uses one consistent copy of everything
python3 "$emu/transform.py" "$work/src" "$work/gen" && python3 "$emu/patch.py" "$work/gen" || exit 1

sanitize="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
# -O1: the fibers' stacks stay small and ASan builds stay fast; OpenMP only in the cuBLASLt shim
build() {  # build NAME SOURCE (relative to the transformed tree) [flags]; once, when targets running at once share it
    local name=$1 src=$2
    shift 2
    exec {lock}> "$work/bin/$name.lock" && flock "$lock" || return 1
    if [ -x "$work/bin/$name" ]; then exec {lock}>&-; return 0; fi
    (cd "$work/gen" && g++ -std=c++17 -O1 -g -fopenmp -D__CUDACC__ -I"$emu" -I. -include cuda_runtime.h \
        -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-variable -Wno-deprecated-declarations \
        "$@" -x c++ "$src" -o "$work/bin/$name.tmp") > "$work/logs/build_$name.log" 2>&1 && mv "$work/bin/$name.tmp" "$work/bin/$name" ||
        { cat "$work/logs/build_$name.log"; exec {lock}>&-; return 1; }
    exec {lock}>&-
}
target_flags=""
[ "${EMU_ASAN:-0}" = 1 ] && target_flags=$sanitize
export ASAN_OPTIONS=detect_leaks=0 EMU_NOTIME=1

# the self-test: every hazard class must be reported, the positive cases must pass
selftest() {
    build selftest dev/cuda/emu/selftest.cu $sanitize || return 1
    local bad=0 c out why
    for c in oob misaligned host_ptr_arg host_deref block_1025 grid_y grid_0 smem_48k sync_early shfl_missing launch_bounds \
             shared_uninit read_before_sync capture_sync capture_malloc capture_malloc_async graph_stale memcpy_kind lt_attr_size lt_shape; do
        out=$("$work/bin/selftest" $c 2>&1)
        local rc=$?
        why=$(echo "$out" | grep -m1 -oE "EMULATOR: .{0,90}|AddressSanitizer: [a-z-]+|runtime error: .{0,60}")
        if [ $rc -ne 0 ] && [ -n "$why" ]; then echo "reported  $c: $why"; else echo "MISSED    $c (exit $rc)"; bad=1; fi
    done
    for c in ok graph; do
        if out=$("$work/bin/selftest" $c 2>&1); then echo "passes    $c"; else echo "FAILED    $c: $out"; bad=1; fi
    done
    return $bad
}

harness() {  # harness NAME ARGS...
    local name=$1
    shift
    build "$name" "dev/cuda/${name}_check.cu" $target_flags && "$work/bin/$name" "$@"
}

test_xsa() {
    build test_xsa test_xsa.cu $target_flags && (cd "$work/src" && "$work/bin/test_xsa")
}

# the emulated trainer with CUDA graphs on and off (losses bit-identical), and both against the CPU build;
# the graphs run resumed from its step-1 checkpoint: the same losses, and the checkpoint's cuBLASLt choices
# (matmul_choices, from --matmul-tune's timing in the first micro-step) taken again
train() {
    build train_gpt train_gpt.cu $target_flags || return 1
    (cd "$work/src" && g++ -O3 -march=native -std=c++17 -fopenmp -x c++ train_gpt.cu -o "$work/bin/train_gpt_cpu") || return 1
    local flags="-d 2 --dim 128 --heads 2 -t 128 -b 4 -B 1024 -n 2 --eval-every 2 --eval-tokens 1024 --sample-every -1 --core-every -1 -x 1 --save-every 1"
    local run
    for run in cpu graphs nographs; do
        local bin=$work/bin/train_gpt extra=""
        [ $run = cpu ] && bin=$work/bin/train_gpt_cpu
        [ $run = nographs ] && extra="--cuda-graphs 0"
        echo "== $run"
        (cd "$work/src" && "$bin" $flags $extra -o "$work/train_$run" | tee "$work/logs/train_$run.log") || return 1
    done
    echo "== resume"
    cp -r "$work/train_graphs" "$work/train_resume" && rm "$work/train_resume/ckpt_000002.safetensors" &&
        (cd "$work/src" && "$work/bin/train_gpt" $flags --resume "$work/train_resume" | tee "$work/logs/train_resume.log") || return 1
    python3 - "$work" <<'PY'
import json, re, struct, sys
work = sys.argv[1]
runs = {r: [json.loads(l) for l in open('%s/train_%s/metrics.jsonl' % (work, r))] for r in ('cpu', 'graphs', 'nographs', 'resume')}
def values(r, kind, key): return [m[key] for m in runs[r] if m['kind'] == kind]
ok = True
with open('%s/train_graphs/ckpt_000001.safetensors' % work, 'rb') as f:
    choices = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))['__metadata__'].get('matmul_choices', '')
tuned = re.search(r'cuBLASLt: (\d+) GEMM shapes tuned', open('%s/logs/train_graphs.log' % work).read())
taken = re.search(r'(\d+) taken from the checkpoint', open('%s/logs/train_resume.log' % work).read())
n_choices = len(choices.split())
ok = bool(tuned and taken) and n_choices > 0 and int(tuned.group(1)) == n_choices == int(taken.group(1))
print('cuBLASLt choices: %s tuned, %d in the checkpoint, %s taken on resume' % (tuned and tuned.group(1), n_choices, taken and taken.group(1)))
for key in ('loss', 'grad_norm'):
    same = values('resume', 'train', key) == values('graphs', 'train', key)
    ok = ok and same
    print('resumed train %s: %s' % (key, 'identical' if same else 'DIFFERENT'))
# the gradient norm sums bf16-computed gradients: a looser tolerance than the loss's
for kind, key, tol in (('train', 'loss', 1e-3), ('train', 'grad_norm', 2e-2), ('eval', 'val_bpb', 1e-3)):
    cpu, g, ng = values('cpu', kind, key), values('graphs', kind, key), values('nographs', kind, key)
    rel = max(abs(a - b) / abs(b) for a, b in zip(g, cpu)) if g and len(g) == len(cpu) else float('inf')
    same = g == ng and len(g) > 0
    ok = ok and same and rel <= tol
    print('%s %s: graphs %s, no graphs %s (%s), cpu %s: rel diff to cpu %.1e (<= %g)' %
          (kind, key, g, ng, 'identical' if same else 'DIFFERENT', cpu, rel, tol))
print('%d passed, %d failed' % (int(ok), int(not ok)))
sys.exit(0 if ok else 1)
PY
}

# --ranks 2 on the emulated CUDA backend (two forked processes, the emulator's NCCL: nccl.h here; the sharded
# optimizer and the gradient reduction overlapping the backward, the defaults) against --ranks 2 on the CPU
# backend: the same batches on each rank, so losses and val bpb agree to bf16 precision; and the multi-node
# path with neither: two "nodes" of one rank each (a launcher's RANK, WORLD_SIZE, LOCAL_RANK = 0,
# LOCAL_WORLD_SIZE = 1; NCCL's id through the rendezvous file; --shard-optimizer 0 --overlap-reduce 0) equal
# to the forked ranks bit for bit (the emulator's NCCL sums in rank order, so the sharded optimizer's
# reduces give the all-reduce's bits, and the buckets the whole buffer's)
profiles() {  # the device profiles: attention on a 99 KB card and both dq bufferings; start-up and plans on every card
    build train_gpt train_gpt.cu $target_flags && build attention dev/cuda/attention_check.cu $target_flags || return 1
    echo "== attention_check at head_dim 128 on an RTX 4090 (99 KB per block: dq single-buffered, against the CPU twins)"
    EMU_DEVICE=rtx4090 "$work/bin/attention" --no-timing --quiet --head-dim-128 || return 1
    # (on the default H200 profile the attention target checks the two bufferings bit for bit at every shape)
    (cd "$work/src" && python3 dev/cuda/emu/profiles.py "$work/bin/train_gpt" ${EMU_PROFILES_TABLE:+--table})
}

train_ranks() {
    build train_gpt_nccl train_gpt.cu -DXSA_NCCL $target_flags || return 1
    (cd "$work/src" && g++ -O3 -march=native -std=c++17 -fopenmp -x c++ train_gpt.cu -o "$work/bin/train_gpt_cpu") || return 1
    # no -b: each rank picks the default rows (4 on both backends here), and the ranks check that they agree
    local flags="-d 2 --dim 128 --heads 2 -t 128 -B 1024 -n 2 --eval-every 2 --eval-tokens 1024 --sample-every -1 --core-every -1 -x 1"
    (cd "$work/src" && "$work/bin/train_gpt_cpu" $flags --ranks 2 -o "$work/ranks_cpu") || return 1
    (cd "$work/src" && "$work/bin/train_gpt_nccl" $flags --ranks 2 -o "$work/ranks_cuda") || return 1
    local node r pids=()
    for r in 1 0; do  # rank 1 first: it waits for rank 0's rendezvous file
        (cd "$work/src" && RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 EMU_DEVICES=1 \
            "$work/bin/train_gpt_nccl" $flags --shard-optimizer 0 --overlap-reduce 0 --rendezvous "$work/rendezvous" -o "$work/ranks_nodes" > "$work/logs/node_$r.log" 2>&1) &
        pids+=($!)
    done
    for node in "${pids[@]}"; do wait "$node" || { cat "$work/logs/node_"*.log; return 1; }; done
    python3 - "$work" <<'PY'
import json, sys
runs = {r: [json.loads(l) for l in open('%s/ranks_%s/metrics.jsonl' % (sys.argv[1], r))] for r in ('cpu', 'cuda', 'nodes')}
ok = all(m['ranks'] == 2 for r in runs.values() for m in r if m['kind'] == 'run')
for kind, key in (('train', 'loss'), ('eval', 'val_bpb')):
    cpu, cuda, nodes = ([m[key] for m in runs[r] if m['kind'] == kind] for r in ('cpu', 'cuda', 'nodes'))
    rel = max(abs(a - b) / abs(b) for a, b in zip(cuda, cpu)) if cuda and len(cuda) == len(cpu) else float('inf')
    ok = ok and rel <= 1e-3 and nodes == cuda
    print('%s %s: emulated CUDA, 2 ranks %s; CPU, 2 ranks %s: rel diff %.1e (<= 1e-3); 2 nodes of 1 rank, replicated, not overlapped %s (%s)'
          % (kind, key, cuda, cpu, rel, nodes, 'identical' if nodes == cuda else 'DIFFERENT'))
print('%d passed, %d failed' % (int(ok), int(not ok)))
sys.exit(0 if ok else 1)
PY
}

# dev/gpu_check.sh's whole path on the emulated binaries, in its tiny configuration: every stage must have
# its row, run its command and end PASS or at its cap (the emulator is a million times slower than a GPU:
# the long stages hit their caps), none FAIL; the summary and the log archive must be there
gpu_check() {
    local h
    build train_gpt_cuda train_gpt.cu $target_flags && build test_xsa_cuda test_xsa.cu $target_flags &&
        build bench_fwdbwd_cuda dev/bench/bench_fwdbwd.cu $target_flags || return 1
    for h in attention matmul loss elementwise optim; do build "${h}_check" "dev/cuda/${h}_check.cu" $target_flags || return 1; done
    (cd "$work/src" && g++ -O3 -march=native -std=c++17 -fopenmp -x c++ train_gpt.cu -o train_gpt_cpu &&
        g++ -O3 -march=native -std=c++17 -fopenmp -Wno-unused-function -x c++ test_xsa.cu -o test_xsa_cpu) || return 1
    mkdir -p "$work/src/dev/cuda/bin" "$work/src/dev/bench"
    cp "$work/bin/train_gpt_cuda" "$work/bin/test_xsa_cuda" "$work/src/" && cp "$work/bin/"*_check "$work/src/dev/cuda/bin/" &&
        cp "$work/bin/bench_fwdbwd_cuda" "$work/src/dev/bench/" || return 1
    (cd "$work/src" && GPU_CHECK_NO_GPU_OK=1 GPU_CHECK_SKIP_BUILD=1 GPU_CHECK_TINY=1 BUDGET=${EMU_GPU_CHECK_BUDGET:-1500} \
        OUT="$work/gpu_check" bash dev/gpu_check.sh) || return 1
    python3 - "$work/gpu_check" <<'PY'
import os, sys, tarfile
out = sys.argv[1]
rows = {l.split('|')[1].strip(): l.split('|')[2].strip() for l in open(os.path.join(out, 'summary.md')) if l.startswith('| ') and not l.startswith('| stage')}
want = ['env', 'device', 'binaries', 'harness_attention', 'harness_matmul', 'harness_loss', 'harness_elementwise', 'harness_optim',
        'sanitizers', 'test_xsa_cuda', 'model_twin', 'train_d4_learn', 'bench_d24_base', 'bench_d24_xsa_fused', 'bench_d12_base',
        'bench_d12_xsa_fused', 'bench_d24_xsa_unfused', 'phases_d24_xsa', 'timing_attention', 'timing_matmul']
bad = [s for s in want if s not in rows or rows[s].startswith(('FAIL', 'SKIPPED: the'))]
for s in want:
    print('%-22s %s' % (s, rows.get(s, 'MISSING')[:110]))
archive = tarfile.open(os.path.join(out, 'gpu_check_logs.tar.gz')).getnames()
bad += [] if any(n.endswith('harness_attention.log') for n in archive) else ['the archive']
print('%d passed, %d failed' % (len(want) + 1 - len(bad), len(bad)))
sys.exit(1 if bad else 0)
PY
}

run_target() {
    case $1 in
    selftest) selftest ;;
    elementwise) harness elementwise --reps 1 --time 0 ;;
    loss | optim) harness "$1" 1 ;;
    matmul) harness matmul 1 && EMU_LT_NO_CANDIDATES=1 harness matmul 1 --fallback ;;  # cuBLASLt without a candidate: the fallback
    attention) harness attention --no-timing ;;
    test_xsa) test_xsa ;;
    train) train ;;
    train_ranks) train_ranks ;;
    gpu_check) gpu_check ;;
    profiles) profiles ;;
    esac
}

# the targets, EMU_JOBS at a time, each into its own log; then, in order, each one's verdict
run_logged() {
    local t=$1 start
    start=$(date +%s)
    run_target "$t" > "$work/logs/$t.log" 2>&1
    echo "$? $(($(date +%s) - start))" > "$work/logs/$t.rc"
}
jobs_max=${EMU_JOBS:-$(nproc 2>/dev/null || echo 1)}
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    echo "== emu: $t"
    run_logged "$t" &
done
wait
summary=()
failed=0
for t in "${targets[@]}"; do
    read -r rc secs < "$work/logs/$t.rc" || { rc=1; secs=0; }
    # the hazards the emulator or the sanitizers reported, and the check counts the target printed
    hazards=0  # the self-test's log lists the hazards it provoked on purpose
    [ "$t" != selftest ] && hazards=$(grep -cE "^EMULATOR: |AddressSanitizer|runtime error:" "$work/logs/$t.log")
    counts=$(grep -oE "[0-9]+ (checks|passed), [0-9]+ failed|(PASS|FAIL): [0-9]+ failed checks" "$work/logs/$t.log" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ "$hazards" -eq 0 ]; then verdict=PASS; else verdict=FAIL; failed=1; fi
    # on failure, the failed checks and the reports (the harnesses' closing table repeats rows: left out)
    [ $verdict = FAIL ] && grep -E "(^| )(FAIL|MISSED|FAILED)( |$)|NOT DETERMINISTIC|^EMULATOR: |AddressSanitizer|runtime error:|error:" \
        "$work/logs/$t.log" | grep -v "  FAIL$" | head -n 20
    [ "$t" = selftest ] && counts="$(grep -c '^reported' "$work/logs/$t.log") hazards reported, $(grep -c '^passes' "$work/logs/$t.log") clean cases passed"
    summary+=("$(printf '%-12s %s  %4ds  exit %d, %d hazards  %s' "$t" $verdict "$secs" "$rc" "$hazards" "$counts")")
done
kind=plain
[ -n "$target_flags" ] && kind=ASan+UBSan
what="the source tree"
[ $in_git = 1 ] && what="$(git -C "$root" rev-parse --short HEAD) + working tree"
echo "== emu summary ($kind build of $what)"
printf '%s\n' "${summary[@]}"
exit $failed
