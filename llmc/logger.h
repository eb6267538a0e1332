// logger.h: the run's metrics log, DIR/metrics.jsonl: one JSON object per line (RFC 8259). A line is
// built with JsonLine (keys and strings escaped, numbers in a given printf format, a non-finite number
// written as null, which JSON has, rather than nan, which it has not) and written by metrics_write, which
// flushes it at once (a reader such as `tail -f` or a killed run sees every line) and checks every write:
// a full disk or an I/O error ends the run with one error line instead of a log that silently stops.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "safetensors.h"  // json_escape

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

// A JSON object of string values (the metadata maps of a checkpoint: model and optimizer settings).
static inline std::string json_object(const std::map<std::string, std::string>& m) {
    JsonLine o;
    for (const auto& kv : m) o.str(kv.first.c_str(), kv.second);
    return o.text();
}

struct MetricsLog {
    FILE* file = nullptr;  // null: no -o, or not rank 0; every call is then a no-op
    std::string path;
};

// mode "w" starts a new log, "a" continues one (after truncate_metrics on resume).
static inline void metrics_open(MetricsLog* log, const std::string& path, const char* mode) {
    log->path = path;
    log->file = fopen_or_fail(path.c_str(), mode);
}

static inline void metrics_write(MetricsLog* log, const JsonLine& line) {
    if (!log->file) return;
    const std::string text = line.text() + "\n";
    if (fwrite(text.data(), 1, text.size(), log->file) != text.size() || fflush(log->file) != 0)
        fail("cannot write to '%s': %s", log->path.c_str(), strerror(errno));
}

static inline void metrics_close(MetricsLog* log) {
    if (log->file && fclose(log->file) != 0) fail("cannot write to '%s': %s", log->path.c_str(), strerror(errno));
    log->file = nullptr;
}
