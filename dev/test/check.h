// dev/test/check.h: what the C++ test programs share (test_xsa.cu, dev/test/test_infra.cu): the check()
// line and its counters, the closing "N passed, N failed" line, each run's temporary directory, a tiny
// model's configuration (and one model both build), and running one of the built binaries and reading
// their files. Included after train_gpt.cu (with TRAIN_GPT_NO_MAIN), whose fail(), GPTConfig, GPT and
// model functions it uses.
#pragma once

#include <sys/wait.h>
#include <string>

static int g_passed = 0, g_failed = 0;

// Every file a test writes goes into one directory of this run's own (two runs on a machine never
// collide), removed at the end.
static std::string g_tmp_dir;

static std::string tmp_path(const std::string& name) {
    if (g_tmp_dir.empty()) {
        char dir[] = "/tmp/xsa_test_XXXXXX";
        if (!mkdtemp(dir)) fail("cannot create a temporary directory: %s", strerror(errno));
        g_tmp_dir = dir;
    }
    return g_tmp_dir + "/" + name;
}

static void remove_tmp_dir() {
    if (!g_tmp_dir.empty() && system(("rm -rf '" + g_tmp_dir + "'").c_str()) != 0) printf("warning: could not remove %s\n", g_tmp_dir.c_str());
}

static void check(bool ok, const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
    (ok ? g_passed : g_failed)++;
}

// The end of a test program: the temporary directory removed, the closing line printed (dev/test/run_tests.py
// reads it), and the exit code: 0 if every check passed, else 1.
static int finish_checks() {
    remove_tmp_dir();
    printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}

// A small model for the tests: V tokens, L layers of width C with H heads of D channels, T positions,
// windows "SL" with a short window of `window`, no XSA.
static GPTConfig tiny_config(int V, int L, int C, int H, int D, int T, int window) {
    GPTConfig c;
    c.vocab_size = V;
    c.padded_vocab = padded_vocab_size(V);
    c.n_layer = L;
    c.n_embd = C;
    c.n_head = c.n_kv_head = H;
    c.head_dim = D;
    c.seq_len = T;
    c.short_window = window;
    c.window_pattern = "SL";
    c.xsa_layer.assign(L, false);
    return c;
}

// The model of test_xsa's initialisation check and test_infra's safetensors round trip, built and
// initialised (seed 7): vocabulary 1000, 4 layers of width 128 (2 heads of 64), T 64, XSA (alpha 1) on
// layers 1-2. Returns its configuration.
static GPTConfig build_init_model(GPT* model) {
    GPTConfig c = tiny_config(1000, 4, 128, 2, 64, 64, 16);
    c.xsa_alpha = 1.0f;
    c.xsa_layer = parse_layer_spec("1-2", 4);
    gpt_build(model, c);
    gpt_init_weights(model, 7);
    return c;
}

// Runs one of our binaries (./train_gpt_cpu, ./train_gpt_cuda, ./eval_core) with `args`; returns its exit
// code and what it printed (stderr only if !want_stdout).
// $XSA_BIN_DIR, where set, is where the binaries are instead (make test-sanitize: build/sanitize/).
static int run_program(const char* binary, const std::string& args, std::string* out, bool want_stdout) {
    const char* dir = getenv("XSA_BIN_DIR");
    const std::string path = dir && *dir && !strncmp(binary, "./", 2) ? std::string(dir) + "/" + (binary + 2) : binary;
    std::string cmd = path + " " + args + (want_stdout ? " 2>&1" : " 2>&1 >/dev/null");
    FILE* p = popen(cmd.c_str(), "r");
    out->clear();
    char buf[512];
    while (p && fgets(buf, sizeof buf, p)) *out += buf;
    int status = p ? pclose(p) : -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static std::string read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) return "";
    std::string s;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
}
