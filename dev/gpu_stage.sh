# dev/gpu_stage.sh: the stage runner of dev/gpu_check.sh (sourced, not run). A GPU session gets one call
# of a few minutes, and only a few files come back from it, so:
#   * every stage runs under its own time cap, never past the script's whole budget (BUDGET seconds from
#     the moment this file is sourced, less a reserve for the summary and the archive): a stage that
#     hangs costs its cap, and the stages after it still run;
#   * after every stage the summary ($OUT/summary.md, a markdown table) is rewritten and every log is put
#     into one archive ($OUT/gpu_check_logs.tar.gz), so whatever ends the call, what ran so far is there.
#   * GPU_CHECK_ONLY='bench_* timing_*' (glob patterns over stage names, space-separated) runs only the stages
#     it matches, and those of GPU_STAGE_ALWAYS (set by the caller: the set-up every stage needs); the
#     summary's last line names the stages that did not pass, as the GPU_CHECK_ONLY of a rerun;
#   * a stage's output is line-buffered (stdbuf -oL -eL where there is stdbuf), so a stage killed at its cap
#     leaves every line it printed in its log.
# Use:
#   source dev/gpu_stage.sh
#   stage NAME CAP_SECONDS COMMAND [ARGS...]   # runs it, logs to $LOGS/NAME.log, records PASS/FAIL/TIMEOUT
#   note NAME TEXT                             # a row without a command (a skipped stage, a measured value)
#   gpu_stage_selected NAME...                 # true if one of them is selected
#   gpu_sample_start NAME; ...; gpu_sample_stop NAME   # nvidia-smi samples clocks, power and temperature every
#                                              # 0.5 s in between ($LOGS/NAME.csv); the stop writes a row NAME with
#                                              # their min/median/max
# The result column is PASS, FAIL (exit code), TIMEOUT (the cap) or SKIPPED, then the log's last line.
# stage returns the command's exit code, so a caller can act on it (125 when the stage is not selected,
# 124 when the budget is spent).

# shellcheck shell=bash
OUT=${OUT:-/tmp/gpu_check}
BUDGET=${BUDGET:-420}       # seconds for the whole call (the device tool's limit is 600; dev/gpu_check.sh says why 420)
RESERVE=${RESERVE:-15}      # kept back for the last summary and archive
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_logs.XXXXXX")}
mkdir -p "$OUT" "$LOGS"
GPU_STAGE_START=$(date +%s)
GPU_STAGE_ROWS=()
GPU_STAGE_TITLE=${GPU_STAGE_TITLE:-gpu_check}
GPU_STAGE_REDO=()   # the stages that did not pass, in order
GPU_CHECK_ONLY=${GPU_CHECK_ONLY:-}
GPU_STAGE_ALWAYS=${GPU_STAGE_ALWAYS:-}
# stdbuf preloads its library: an ASan build (the emulator's, EMU_ASAN=1) would refuse to start without
# verify_asan_link_order=0
GPU_STAGE_LINEBUF=()
command -v stdbuf > /dev/null &&
    GPU_STAGE_LINEBUF=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" stdbuf -oL -eL)

gpu_stage_elapsed() { echo $(( $(date +%s) - GPU_STAGE_START )); }

# the summary and the archive, as they stand
gpu_stage_flush() {
    {
        echo "# $GPU_STAGE_TITLE"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(gpu_stage_elapsed) s of a ${BUDGET} s budget; logs: gpu_check_logs.tar.gz"
        [ -n "$GPU_CHECK_ONLY" ] && echo && echo "only the stages matching GPU_CHECK_ONLY='$GPU_CHECK_ONLY'${GPU_STAGE_ALWAYS:+ (and the set-up: $GPU_STAGE_ALWAYS)}"
        echo
        echo "| stage | result | seconds | cap |"
        echo "|---|---|---|---|"
        printf '%s\n' "${GPU_STAGE_ROWS[@]}"
        local extra
        for extra in ${GPU_STAGE_EXTRA:-}; do  # the caller's tables, each a file, those that exist
            [ -f "$extra" ] && echo && cat "$extra"
        done
        echo
        if [ ${#GPU_STAGE_REDO[@]} -gt 0 ]; then
            echo "rerun what did not pass: GPU_CHECK_ONLY='${GPU_STAGE_REDO[*]}' bash dev/gpu_check.sh"
        else
            echo "every stage that ran passed"
        fi
    } > "$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
    cp "$OUT/summary.md" "$LOGS/summary.md"
    tar -czf "$OUT/gpu_check_logs.tar.gz.tmp" -C "$LOGS" . 2>/dev/null && mv "$OUT/gpu_check_logs.tar.gz.tmp" "$OUT/gpu_check_logs.tar.gz"
}

# one row: name, result, seconds, cap ("|" in the text would break the table)
gpu_stage_row() {
    local text=${2//|//}
    GPU_STAGE_ROWS+=("| $1 | ${text:0:300} | $3 | $4 |")
    echo "== $1: $2 ($3 s)"
    gpu_stage_flush
}

note() { gpu_stage_row "$1" "$2" - -; }

# true if any NAME is selected: no GPU_CHECK_ONLY, or a pattern of it (or of GPU_STAGE_ALWAYS) matches
gpu_stage_selected() {
    [ -z "$GPU_CHECK_ONLY" ] && return 0
    local name pattern patterns
    read -r -a patterns <<< "$GPU_CHECK_ONLY $GPU_STAGE_ALWAYS"  # split, not expanded against the files here
    for name in "$@"; do
        for pattern in "${patterns[@]}"; do
            # shellcheck disable=SC2053  # a glob on purpose
            [[ $name == $pattern ]] && return 0
        done
    done
    return 1
}

stage() {
    local name=$1 cap=$2
    shift 2
    if ! gpu_stage_selected "$name"; then
        echo "== $name: not selected (GPU_CHECK_ONLY='$GPU_CHECK_ONLY')"
        return 125
    fi
    local left=$(( BUDGET - RESERVE - $(gpu_stage_elapsed) ))
    if [ "$left" -lt 5 ]; then
        GPU_STAGE_REDO+=("$name")
        gpu_stage_row "$name" "SKIPPED: the ${BUDGET} s budget is spent" 0 "$cap"
        return 124
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    local shown="$*"
    echo "== $name (cap $cap s): ${shown:0:200}"
    local t0 code last result
    t0=$(date +%s)
    timeout -k 5 "$cap" "${GPU_STAGE_LINEBUF[@]}" "$@" > "$LOGS/$name.log" 2>&1
    code=$?
    [ "$code" -ne 0 ] && GPU_STAGE_REDO+=("$name")
    last=$(grep -v '^[[:space:]]*$' "$LOGS/$name.log" | tail -n 1)
    if [ "$code" -eq 0 ]; then
        result="PASS"
    elif [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        result="TIMEOUT after $cap s (the cap)"
    else
        result="FAIL (exit $code)"
    fi
    [ -n "$last" ] && result="$result: $last"
    gpu_stage_row "$name" "$result" $(( $(date +%s) - t0 )) "$cap"
    return "$code"
}

# ---- GPU samples: clocks, power and temperature while stages run (nvidia-smi -lms 500 in the background,
# bounded by the budget left); one row of min/median/max per sampled stretch
GPU_SAMPLE_FIELDS=clocks.sm,clocks.mem,power.draw,temperature.gpu
declare -gA GPU_SAMPLE_PIDS=()
gpu_sample_start() {  # NAME
    local name=$1 left=$(( BUDGET - $(gpu_stage_elapsed) ))
    command -v nvidia-smi > /dev/null || return 0
    [ "$left" -lt 1 ] && return 0
    timeout -k 2 "$left" nvidia-smi --query-gpu=timestamp,$GPU_SAMPLE_FIELDS --format=csv,noheader,nounits -lms 500 > "$LOGS/$name.csv" 2>&1 &
    GPU_SAMPLE_PIDS[$name]=$!
}
# min/median/max of each column of the samples: "SM MHz 1755/1980/1980, memory MHz ..., (N samples every 0.5 s)"
gpu_sample_summary() {  # CSV (timestamp, sm, mem, power, temperature)
    local col label values out="" n
    n=$(awk -F', *' 'NF >= 5 && $2 ~ /^[0-9.]+$/' "$1" | wc -l)
    for col in 2:SM_MHz 3:memory_MHz 4:power_W 5:temperature_C; do
        label=${col#*:}
        values=$(awk -F', *' -v c="${col%%:*}" 'NF >= 5 && $c ~ /^[0-9]+(\.[0-9]+)?$/ { print $c }' "$1" | sort -g)
        if [ -z "$values" ]; then
            out="$out${out:+, }${label//_/ } n/a"
            continue
        fi
        out="$out${out:+, }${label//_/ } $(echo "$values" | awk '{ v[NR] = $1 } END {
            m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%g/%g/%g", v[1], m, v[NR] }')"
    done
    echo "$out (min/median/max of $n samples every 0.5 s)"
}
gpu_sample_stop() {  # NAME: stops its sampler, writes its row
    local name=$1 pid=${GPU_SAMPLE_PIDS[$1]:-}
    if [ -z "$pid" ]; then
        note "$name" "not sampled: $(command -v nvidia-smi > /dev/null && echo "no time was left" || echo "no nvidia-smi")"
        return 0
    fi
    kill "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    unset "GPU_SAMPLE_PIDS[$name]"
    note "$name" "$(gpu_sample_summary "$LOGS/$name.csv")"
}
