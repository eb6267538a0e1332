// logger.h: the run's metrics log, DIR/metrics.jsonl: one JSON object per line (RFC 8259). A line is
// built with JsonLine (keys and strings escaped, numbers in a given printf format, a non-finite number
// written as null, which JSON has, rather than nan, which it has not) and written by metrics_write, which
// flushes it at once (a reader such as `tail -f` or a killed run sees every line) and checks every write:
// a full disk or an I/O error ends the run with one error line instead of a log that silently stops, and
// leaves the file ending in a whole line. And Progress: a console line now and then while long work runs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "safetensors.h"  // json_escape
#include "ranks.cuh"      // g_ranks: only rank 0 prints progress

struct JsonLine {
    std::string body;  // "key": value pairs so far, comma-separated

    JsonLine& raw(const char* key, const std::string& json) {  // a value already in JSON
        body += (body.empty() ? "\"" : ", \"") + json_escape(key) + "\": " + json;
        return *this;
    }
    JsonLine& str(const char* key, const std::string& value) { return raw(key, "\"" + json_escape(value) + "\""); }
    JsonLine& num(const char* key, long long value) { return raw(key, std::to_string(value)); }
    JsonLine& num(const char* key, double value, const char* format) { return raw(key, json_number(value, format)); }
    JsonLine& array(const char* key, const std::vector<double>& values, const char* format) {
        std::string json = "[";
        for (size_t i = 0; i < values.size(); i++) json += (i ? ", " : "") + json_number(values[i], format);
        return raw(key, json + "]");
    }
    std::string text() const { return "{" + body + "}"; }

    static std::string json_number(double value, const char* format) {
        if (!std::isfinite(value)) return "null";
        char buf[64];
        snprintf(buf, sizeof buf, format, value);
        return buf;
    }
};

// A JSON object from a metadata map of a checkpoint (model and optimizer settings, all strings there):
// the keys in `text_keys` as strings, every other value as the number it holds (written as it is, since
// it was printed as a number; a value that is not one is an internal error, not a malformed line).
static inline std::string json_object(const std::map<std::string, std::string>& m, const std::vector<std::string>& text_keys) {
    JsonLine o;
    for (const auto& kv : m) {
        if (std::find(text_keys.begin(), text_keys.end(), kv.first) != text_keys.end()) {
            o.str(kv.first.c_str(), kv.second);
            continue;
        }
        char* end = nullptr;
        const double v = strtod(kv.second.c_str(), &end);
        if (kv.second.empty() || *end != '\0' || !std::isfinite(v)) fail("internal: setting %s = '%s' is not a number", kv.first.c_str(), kv.second.c_str());
        o.raw(kv.first.c_str(), kv.second);
    }
    return o.text();
}

struct MetricsLog {
    int fd = -1;          // -1: no -o, or not rank 0; every call is then a no-op
    std::string path;
    off_t complete = 0;   // bytes of whole lines in the file: a failed write is cut back to here
};

// append: continue the log (after truncate_metrics on resume), else start it anew.
static inline void metrics_open(MetricsLog* log, const std::string& path, bool append) {
    log->path = path;
    log->fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (log->fd < 0) fail("cannot open '%s' for writing: %s", path.c_str(), strerror(errno));
    struct stat st;
    log->complete = fstat(log->fd, &st) == 0 ? st.st_size : 0;
}

// One line, written with write(2) (nothing waits in a buffer); a failed or short write is cut back, so
// the file never ends in a torn line.
static inline void metrics_write(MetricsLog* log, const JsonLine& line) {
    if (log->fd < 0) return;
    const std::string text = line.text() + "\n";
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = write(log->fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = n < 0 ? errno : ENOSPC;
            if (ftruncate(log->fd, log->complete) != 0) {}  // best effort: the error below is what matters
            log->fd = -1;
            fail("cannot write to '%s': %s", log->path.c_str(), strerror(err));
        }
        done += (size_t)n;
    }
    log->complete += (off_t)text.size();
}

// With each checkpoint: the lines so far are on disk, not only in the page cache.
static inline void metrics_sync(MetricsLog* log) {
    if (log->fd >= 0 && fsync(log->fd) != 0) fail("cannot write to '%s': %s", log->path.c_str(), strerror(errno));
}

static inline void metrics_close(MetricsLog* log) {
    if (log->fd >= 0 && close(log->fd) != 0) fail("cannot write to '%s': %s", log->path.c_str(), strerror(errno));
    log->fd = -1;
}

// Progress of long work (an evaluation, CORE): a line when it starts, then at most every --progress-every
// seconds (30) a line with what is done, the total and an estimate of the time left, so that a log shows a
// run is alive. Rank 0 only.
struct Progress {
    const char *what, *unit;  // "val bpb", "batches"
    long total = 0;
    double start_ms = 0.0, last_ms = 0.0;
};

static double g_progress_every_ms = 30000.0;  // --progress-every

static Progress progress_start(const char* what, const char* unit, long total) {
    Progress p{what, unit, total, wall_ms(), wall_ms()};
    if (g_ranks.rank == 0) printf("%s: %ld %s\n", what, total, unit);
    return p;
}

static void progress_update(Progress* p, long done) {
    const double now = wall_ms();
    if (g_ranks.rank != 0 || now - p->last_ms < g_progress_every_ms || done <= 0) return;
    p->last_ms = now;
    const double elapsed = (now - p->start_ms) / 1000.0;
    printf("%s: %ld/%ld %s (%.0f%%) in %.0f s, ETA %.0f s\n", p->what, done, p->total, p->unit, 100.0 * done / p->total, elapsed,
           elapsed / done * (p->total - done));
}
