# dev/gpu_stage.sh: the stage runner of dev/gpu_check.sh (sourced, not run). A GPU session gets one call
# of a few minutes, and only a few files come back from it, so:
#   * every stage runs under its own time cap, never past the script's whole budget (BUDGET seconds from
#     the moment this file is sourced, less a reserve for the summary and the archive): a stage that
#     hangs costs its cap, and the stages after it still run;
#   * after every stage the summary ($OUT/summary.md, a markdown table) is rewritten and every log is put
#     into one archive ($OUT/gpu_check_logs.tar.gz), so whatever ends the call, what ran so far is there.
# Use:
#   source dev/gpu_stage.sh
#   stage NAME CAP_SECONDS COMMAND [ARGS...]   # runs it, logs to $LOGS/NAME.log, records PASS/FAIL/TIMEOUT
#   note NAME TEXT                             # a row without a command (a skipped stage, a measured value)
# The result column is PASS, FAIL (exit code), TIMEOUT (the cap) or SKIPPED, then the log's last line.
# stage returns the command's exit code, so a caller can act on it.

OUT=${OUT:-/tmp/gpu_check}
BUDGET=${BUDGET:-480}       # seconds for the whole call (the device tool's limit is 600, the machine start not counted)
RESERVE=${RESERVE:-15}      # kept back for the last summary and archive
LOGS=${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_logs.XXXXXX")}
mkdir -p "$OUT" "$LOGS"
GPU_STAGE_START=$(date +%s)
GPU_STAGE_ROWS=()
GPU_STAGE_TITLE=${GPU_STAGE_TITLE:-gpu_check}

gpu_stage_elapsed() { echo $(( $(date +%s) - GPU_STAGE_START )); }

# the summary and the archive, as they stand
gpu_stage_flush() {
    {
        echo "# $GPU_STAGE_TITLE"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(gpu_stage_elapsed) s of a ${BUDGET} s budget; logs: gpu_check_logs.tar.gz"
        echo
        echo "| stage | result | seconds | cap |"
        echo "|---|---|---|---|"
        printf '%s\n' "${GPU_STAGE_ROWS[@]}"
        if [ -n "${GPU_STAGE_EXTRA:-}" ] && [ -f "$GPU_STAGE_EXTRA" ]; then
            echo
            cat "$GPU_STAGE_EXTRA"
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

stage() {
    local name=$1 cap=$2
    shift 2
    local left=$(( BUDGET - RESERVE - $(gpu_stage_elapsed) ))
    if [ "$left" -lt 5 ]; then
        gpu_stage_row "$name" "SKIPPED: the ${BUDGET} s budget is spent" 0 "$cap"
        return 124
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "== $name (cap $cap s): $*"
    local t0 code last result
    t0=$(date +%s)
    timeout -k 5 "$cap" "$@" > "$LOGS/$name.log" 2>&1
    code=$?
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
