#!/usr/bin/env bash
# dev/gpu/find_libs.sh [--out FILE] [--optional BINARY]... BINARY...: the shared libraries the GPU binaries
# need, found wherever this machine has them, for dev/gpu_check.sh's "libraries" stage.
#
# Looks for libcublasLt.so.13, libnccl.so.2 and libcuda.so.1 (GPU_LIBS_PROBES), and for every library that
# `ldd` says a BINARY cannot find, in this order:
#   1. the loader: what ldd already resolves (the loader cache, LD_LIBRARY_PATH), and `ldconfig -p`;
#   2. the CUDA toolkit: lib64, lib and targets/x86_64-linux/lib of $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and
#      /usr/local/cuda-* (GPU_LIBS_TOOLKITS replaces that list), and the driver's /usr/local/nvidia/lib64;
#   3. the Python environment (GPU_CHECK_PYTHON, default python3: the one with PyTorch on the GPU machine): its
#      nvidia-* packages' lib folders (nvidia/cu13/lib for CUDA 13's cuBLAS, nvidia/nccl/lib, ...: every
#      folder of the `nvidia` namespace package, found without importing torch) and torch/lib.
# The first folder that has the file wins; a folder outside the loader's own is put in front of
# LD_LIBRARY_PATH. Then `ldd` of every binary is logged with that LD_LIBRARY_PATH, and the last line is the
# verdict: "libraries: ..." when every BINARY finds everything it links, else one line naming each missing
# library, who needs it and where it was looked for (exit 1). An --optional binary (train_gpt_cuda_nccl) is
# logged but fails nothing: the verdict says it is not used when a library of it is missing.
# --out FILE gets shell assignments for the caller to source: LD_LIBRARY_PATH (exported), GPU_LIBS_FOUND and
# GPU_LIBS_MISSING (the libraries, space-separated), GPU_LIBS_OPTIONAL_OK (the optional binaries that start).
set -uo pipefail
case ${LD_PRELOAD:-} in *libstdbuf.so) unset LD_PRELOAD ;; esac  # the stage runner's line buffering: not a library of the binaries

out="" required=() optional=()
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --optional) optional+=("$2"); shift 2 ;;
        *) required+=("$1"); shift ;;
    esac
done
PROBES=${GPU_LIBS_PROBES-libcublasLt.so.13 libnccl.so.2 libcuda.so.1}
PY=${GPU_CHECK_PYTHON:-python3}
if [ -n "${GPU_LIBS_TOOLKITS+set}" ]; then
    read -r -a toolkits <<< "$GPU_LIBS_TOOLKITS"
else
    toolkits=()
    [ -n "${CUDA_HOME:-}" ] && toolkits+=("$CUDA_HOME")
    [ -n "${CUDA_PATH:-}" ] && toolkits+=("$CUDA_PATH")
    for t in /usr/local/cuda /usr/local/cuda-*; do
        case " ${toolkits[*]} " in *" $t "*) ;; *) toolkits+=("$t") ;; esac
    done
fi
DRIVER_DIRS=${GPU_LIBS_DRIVER_DIRS-/usr/local/nvidia/lib64 /usr/local/nvidia/lib}

ldconfig_cmd() {
    if command -v ldconfig > /dev/null; then timeout 10 ldconfig -p
    elif [ -x /sbin/ldconfig ]; then timeout 10 /sbin/ldconfig -p
    fi
}
# the folders of each source, one per line
toolkit_dirs() {  # each folder once (/usr/local/cuda is a link to /usr/local/cuda-13.0, say)
    toolkit_dirs_all 2> /dev/null | while IFS= read -r d; do readlink -f "$d"; done | awk '!seen[$0]++'
}
toolkit_dirs_all() {
    local t d
    for t in "${toolkits[@]}"; do
        for d in "$t/lib64" "$t/lib" "$t/targets/x86_64-linux/lib"; do [ -d "$d" ] && echo "$d"; done
    done
    for d in $DRIVER_DIRS; do [ -d "$d" ] && echo "$d"; done
}

python_dirs() {
    command -v "$PY" > /dev/null || return 0
    local d sub
    timeout 20 "$PY" -c '
import importlib.util, os
try:
    import nvidia  # a namespace package: every nvidia-* wheel (nvidia/cu13, nvidia/nccl, ...) adds to it
    for p in nvidia.__path__: print(p)
except Exception:
    pass
spec = importlib.util.find_spec("torch")  # torch/lib, without importing torch
if spec is not None and spec.origin: print(os.path.join(os.path.dirname(spec.origin), "lib"))
' 2> /dev/null | while IFS= read -r d; do
        [ -d "$d" ] || continue
        for sub in "$d"/*/lib "$d"/*/lib64 "$d"; do [ -d "$sub" ] && echo "$sub"; done
    done
}

# what each binary links and cannot find as things stand (ldd once per binary)
declare -A ldd_of=() needed_by=()  # binary -> its ldd; library -> the binaries that need it and do not find it
for b in "${required[@]}" "${optional[@]}"; do
    ldd_of[$b]=$(ldd "$b" 2> /dev/null)
    while read -r lib; do
        needed_by[$lib]="${needed_by[$lib]:-}${needed_by[$lib]:+ }$(basename "$b")"
    done < <(echo "${ldd_of[$b]}" | awk '$2 == "=>" && $3 == "not" { print $1 }')
done
want=()
for lib in $PROBES "${!needed_by[@]}"; do
    case " ${want[*]} " in *" $lib "*) ;; *) want+=("$lib") ;; esac
done

cache=$(ldconfig_cmd 2> /dev/null)
tk_dirs=$(toolkit_dirs)
py_dirs=$(python_dirs)
echo "search: the loader (ldd, then ldconfig -p: $(echo "$cache" | grep -c '=>') entries), the toolkit (${toolkits[*]:-none}; $DRIVER_DIRS),"
echo "        $PY's packages ($(echo "$py_dirs" | grep -c .) folders)"
echo "toolkit folders: $(echo $tk_dirs)"
echo "python folders:  $(echo $py_dirs)"
echo

found=() missing=() add_dirs=()
declare -A where_of=()
found_short=()  # "library (where from)", for the verdict
for lib in "${want[@]}"; do
    where="" how="" short=""
    # resolved by the loader already (ldd of a binary that links it)
    for b in "${required[@]}" "${optional[@]}"; do
        where=$(echo "${ldd_of[$b]}" | awk -v l="$lib" '$1 == l && $2 == "=>" && $3 ~ /^\// { print $3; exit }')
        [ -n "$where" ] && { how="the loader (ldd)"; short=loader; break; }
    done
    if [ -z "$where" ]; then
        where=$(echo "$cache" | awk -v l="$lib" '$1 == l { for (i = 1; i <= NF; i++) if ($i == "=>") { print $(i + 1); exit } }')
        [ -n "$where" ] && { how="the loader cache (ldconfig -p)"; short="loader cache"; }
    fi
    if [ -z "$where" ]; then
        while IFS= read -r d; do
            [ -n "$d" ] && [ -e "$d/$lib" ] && { where="$d/$lib"; how="the toolkit"; short=toolkit; add_dirs+=("$d"); break; }
        done <<< "$tk_dirs"
    fi
    if [ -z "$where" ]; then
        while IFS= read -r d; do
            [ -n "$d" ] && [ -e "$d/$lib" ] && { where="$d/$lib"; how="$PY's packages"; short="$PY's packages"; add_dirs+=("$d"); break; }
        done <<< "$py_dirs"
    fi
    if [ -n "$where" ]; then
        echo "$lib: $where (from $how)"
        found+=("$lib")
        where_of[$lib]=$where
        found_short+=("$lib ($short)")
    else
        echo "$lib: NOT FOUND${needed_by[$lib]:+ (needed by ${needed_by[$lib]})}$([ "$lib" = libcuda.so.1 ] && echo " (the driver's: without it the CUDA runtime finds no GPU)")"
        missing+=("$lib")
    fi
done

# the new LD_LIBRARY_PATH: the folders found, in front of what was there, each once
ld_path=""
for d in "${add_dirs[@]}" $(echo "${LD_LIBRARY_PATH:-}" | tr ':' ' '); do
    case ":$ld_path:" in *":$d:"*) ;; *) ld_path="${ld_path:+$ld_path:}$d" ;; esac
done
export LD_LIBRARY_PATH=$ld_path
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# ldd of every binary with it: the truth of what will load
declare -A lost_by=()  # library -> the required binaries that still do not find it
optional_ok=() optional_bad=() absent=()
for b in "${required[@]}" "${optional[@]}"; do
    echo
    echo "== ldd $b"
    if [ ! -e "$b" ]; then
        echo "(no such file)"
        is_optional=0
        for o in "${optional[@]}"; do [ "$o" = "$b" ] && is_optional=1; done
        if [ $is_optional = 1 ]; then optional_bad+=("$(basename "$b") (no such file)"); else absent+=("$b"); fi
        continue
    else
        ldd "$b" 2>&1
        lost=$(ldd "$b" 2> /dev/null | awk '$2 == "=>" && $3 == "not" { print $1 }' | tr '\n' ' ')
        lost=${lost% }
    fi
    is_optional=0
    for o in "${optional[@]}"; do [ "$o" = "$b" ] && is_optional=1; done
    if [ $is_optional = 1 ]; then
        if [ -z "$lost" ]; then optional_ok+=("$b"); else optional_bad+=("$(basename "$b") (${lost// /, } missing)"); fi
    else
        for lib in $lost; do lost_by[$lib]="${lost_by[$lib]:-}${lost_by[$lib]:+ }$(basename "$b")"; done
    fi
done
echo

if [ -n "$out" ]; then
    {
        if [ -n "$LD_LIBRARY_PATH" ]; then printf 'export LD_LIBRARY_PATH=%q\n' "$LD_LIBRARY_PATH"; else echo 'unset LD_LIBRARY_PATH'; fi
        printf 'GPU_LIBS_FOUND=%q\n' "${found[*]}"
        printf 'GPU_LIBS_MISSING=%q\n' "${missing[*]}"
        printf 'GPU_LIBS_OPTIONAL_OK=%q\n' "${optional_ok[*]}"
    } > "$out"
fi

where_looked="not in the loader cache, the toolkit (${toolkits[*]:-none}: lib64, lib), the driver's folders, nor $PY's nvidia packages"
[ -z "$py_dirs" ] && where_looked="$where_looked (it has none)"
notes=""
[ ${#missing[@]} -gt 0 ] && notes="; not found: ${missing[*]}"
[ ${#optional_bad[@]} -gt 0 ] && notes="$notes; not used: ${optional_bad[*]}"
if [ ${#lost_by[@]} -gt 0 ] || [ ${#absent[@]} -gt 0 ]; then
    # one line: each library still missing, the binaries that need it, where it was looked for
    line=""
    for lib in $(printf '%s\n' "${!lost_by[@]}" | sort); do
        item="$lib (needed by ${lost_by[$lib]})"
        [ -n "${where_of[$lib]:-}" ] && item="$item, found at ${where_of[$lib]} but not loadable there"
        line="${line:+$line; }$item"
    done
    [ ${#absent[@]} -gt 0 ] && line="${line:+$line; }no such binary: ${absent[*]}"
    echo "MISSING $line${lost_by[*]:+: $where_looked}"
    exit 1
fi
echo "libraries: every binary finds what it links (${#required[@]} binaries); found: $(IFS=,; echo "${found_short[*]:-none}" | sed 's/,/, /g')$notes; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-unset}"
