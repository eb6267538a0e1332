// chatcore.h: ChatCORE (nanochat's chat metric, dev/docs/evaluation.md#chatcore) over the pre-tokenized task
// files that dev/data/chat_eval.py writes: ARC-Easy, ARC-Challenge and MMLU (categorical: the model's logits
// at the end of the prompt, restricted to the choices' letters), GSM8K and HumanEval (generative: a greedy
// answer, then the task's checker). Python renders the prompts exactly as nanochat does; this side reads the
// files, checks answers (the GSM8K number, HumanEval's code run against its tests in a separate Python
// process) and aggregates. The model runs in chatcore_evaluate.h (chatcore_evaluate).
//
// Task file (little-endian):
//   int32 header[256]: [0] = 20261203 (magic), [1] = 1 (version), [2] = kind (0 categorical, 1 generative),
//     [3] = items N, [4] = tokenizer vocab size, [5] = BOS id, [6] = chat_eval.py's --max-per-task (-1 =
//     all), [7] = baseline accuracy (float32 bits), [8] = checker (0 letter, 1 gsm8k, 2 humaneval),
//     [9..40] = the task label, UTF-8, NUL-padded; the rest 0
//   N items: uint32 n_prompt, n_prompt x uint32 ids (BOS first, <|assistant_start|> last); uint32 n_choices,
//     n_choices x uint32 letter ids, uint32 gold; uint32 n_strings, n_strings x (uint32 n_bytes, bytes):
//     GSM8K's reference number; HumanEval's imports, test code and entry point.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "../llmc/common.h"
#include "../llmc/core.h"  // valid_utf8
#include "encoder.h"         // utf8_replace_invalid: how nanochat's tokenizer decodes an answer

static const int CHATCORE_MAGIC = 20261203;
static const int CHATCORE_VERSION = 1;
enum ChatKind { CHAT_CATEGORICAL = 0, CHAT_GENERATIVE = 1 };
enum ChatChecker { CHECK_LETTER = 0, CHECK_GSM8K = 1, CHECK_HUMANEVAL = 2 };
static const char* const CHAT_TASKS[5] = {"ARC-Easy", "ARC-Challenge", "MMLU", "GSM8K", "HumanEval"};  // ChatCORE's, nanochat HEAD
static const char* const CHAT_TASK_BEFORE_JULY = "SpellingBee";  // ChatCORE's sixth before nanochat 950a1dc (July 2026): the study's

struct ChatItem {
    std::vector<int> prompt;
    std::vector<int> choices;  // categorical: the letters' token ids
    int gold = 0;
    std::vector<std::string> refs;  // generative: what the checker compares with
};

struct ChatTask {
    std::string path, label;
    int kind = 0, checker = 0, max_per_task = -1, bos_id = 0;
    float baseline = 0.0f;
    std::vector<ChatItem> items;
};

// Reads a task file, checking everything against the file's size and the model's vocabulary and BOS.
static inline ChatTask chat_task_load(const std::string& path, int vocab_size, int bos_id) {
    InputFile f(path);
    if (f.size > (1ull << 30)) fail("ChatCORE task file '%s' has %llu bytes; more than 1 GiB is not a task file", path.c_str(), (unsigned long long)f.size);
    std::vector<uint8_t> data(f.size);
    f.read(data.data(), 1, data.size());
    ChatTask task;
    task.path = path;
    size_t pos = 0;
    auto u32 = [&](const char* what) {
        if (data.size() - pos < 4) fail("ChatCORE task file '%s' is truncated (reading %s at byte %zu)", path.c_str(), what, pos);
        uint32_t v;
        memcpy(&v, data.data() + pos, 4);
        pos += 4;
        return v;
    };
    if (data.size() < 1024) fail("'%s' is not a ChatCORE task file (%zu bytes, shorter than its header)", path.c_str(), data.size());
    int32_t h[256];
    memcpy(h, data.data(), sizeof h);
    pos = 1024;
    if (h[0] != CHATCORE_MAGIC) fail("'%s' is not a ChatCORE task file (magic %d, expected %d; dev/data/chat_eval.py writes them)", path.c_str(), h[0], CHATCORE_MAGIC);
    if (h[1] != CHATCORE_VERSION) fail("ChatCORE task file '%s' has version %d; this build reads %d", path.c_str(), h[1], CHATCORE_VERSION);
    if (h[2] != CHAT_CATEGORICAL && h[2] != CHAT_GENERATIVE) fail("ChatCORE task file '%s': unknown kind %d", path.c_str(), h[2]);
    if (h[8] < CHECK_LETTER || h[8] > CHECK_HUMANEVAL || (h[8] == CHECK_LETTER) != (h[2] == CHAT_CATEGORICAL))
        fail("ChatCORE task file '%s': checker %d does not fit kind %d", path.c_str(), h[8], h[2]);
    if (h[4] != vocab_size || h[5] != bos_id)
        fail("ChatCORE task file '%s' was made with a tokenizer of %d tokens and BOS %d; this model's has %d and BOS %d (make the files with "
             "the model's tokenizer)", path.c_str(), h[4], h[5], vocab_size, bos_id);
    task.kind = h[2];
    task.checker = h[8];
    task.max_per_task = h[6];
    task.bos_id = bos_id;
    memcpy(&task.baseline, &h[7], 4);
    if (!(task.baseline >= 0.0f && task.baseline < 1.0f)) fail("ChatCORE task file '%s': baseline %g is not in [0, 1)", path.c_str(), task.baseline);
    const char* label = (const char*)&h[9];
    task.label.assign(label, strnlen(label, 128));
    if (task.label.empty() || task.label.size() == 128 || !valid_utf8(task.label)) fail("ChatCORE task file '%s': bad label", path.c_str());
    const uint32_t n = (uint32_t)h[3];
    if (h[3] < 1 || n > (data.size() - 1024) / 16) fail("ChatCORE task file '%s': %d items cannot fit in %zu bytes", path.c_str(), h[3], data.size());
    auto ids = [&](uint32_t count, std::vector<int>* out, const char* what) {
        if (count > (data.size() - pos) / 4) fail("ChatCORE task file '%s' is truncated (%s of %u tokens at byte %zu)", path.c_str(), what, count, pos);
        for (uint32_t k = 0; k < count; k++) {
            const uint32_t id = u32(what);
            if (id >= (uint32_t)vocab_size) fail("ChatCORE task file '%s': %s holds token id %u >= vocab %d", path.c_str(), what, id, vocab_size);
            out->push_back((int)id);
        }
    };
    for (uint32_t i = 0; i < n; i++) {
        ChatItem item;
        ids(u32("a prompt length"), &item.prompt, "a prompt");
        if (item.prompt.size() < 2 || item.prompt[0] != bos_id) fail("ChatCORE task file '%s': item %u's prompt does not start with BOS", path.c_str(), i);
        ids(u32("a choice count"), &item.choices, "the choices");
        item.gold = (int)u32("a gold index");
        if (task.kind == CHAT_CATEGORICAL ? (item.choices.size() < 2 || item.gold >= (int)item.choices.size() || item.gold < 0) : !item.choices.empty())
            fail("ChatCORE task file '%s': item %u has %zu choices and gold %d", path.c_str(), i, item.choices.size(), item.gold);
        const uint32_t strings = u32("a string count");
        if (strings != (task.checker == CHECK_GSM8K ? 1u : task.checker == CHECK_HUMANEVAL ? 3u : 0u))
            fail("ChatCORE task file '%s': item %u has %u reference strings for checker %d", path.c_str(), i, strings, task.checker);
        for (uint32_t k = 0; k < strings; k++) {
            const uint32_t bytes = u32("a string length");
            if (bytes > data.size() - pos) fail("ChatCORE task file '%s' is truncated (a string of %u bytes at byte %zu)", path.c_str(), bytes, pos);
            item.refs.emplace_back((const char*)data.data() + pos, bytes);
            pos += bytes;
        }
        task.items.push_back(std::move(item));
    }
    if (pos != data.size()) fail("ChatCORE task file '%s' has %zu bytes after its %u items", path.c_str(), data.size() - pos, n);
    return task;
}

// The task files of a directory, in the order of its index.txt (first field of each line).
static inline std::vector<ChatTask> chat_tasks_load(const std::string& dir, int vocab_size, int bos_id) {
    const std::string index = dir + "/index.txt";
    FILE* f = fopen(index.c_str(), "r");
    if (!f) fail("no ChatCORE tasks in '%s': cannot read %s (%s); make them with dev/data/chat_eval.py", dir.c_str(), index.c_str(), strerror(errno));
    std::vector<ChatTask> tasks;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const std::string name = std::string(line).substr(0, strcspn(line, " \t\r\n"));
        if (name.empty()) continue;
        tasks.push_back(chat_task_load(dir + "/" + name, vocab_size, bos_id));
        for (size_t i = 0; i + 1 < tasks.size(); i++)
            if (tasks[i].label == tasks.back().label) {
                fclose(f);
                fail("'%s' lists two files of task %s", index.c_str(), tasks.back().label.c_str());
            }
    }
    fclose(f);
    if (tasks.empty()) fail("'%s' lists no task files", index.c_str());
    return tasks;
}

// ----------------------------------------------------------------------------------------------------
// Checkers (nanochat's tasks/gsm8k.py and tasks/humaneval.py)

// Python's whitespace in valid UTF-8: the characters of str.isspace(), which str.strip() removes and `\s`
// matches in a str regex: \t \n \v \f \r, \x1c-\x1f, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
// U+2029, U+202F, U+205F and U+3000. py_space_at: the byte length of the one starting at s[p] (p < s.size()),
// 0 if none does. Bytes are compared, never read past the end, so any bytes are safe (and invalid UTF-8 is no
// whitespace).
static inline size_t py_space_at(const std::string& s, size_t p) {
    const unsigned char* u = (const unsigned char*)s.data() + p;
    const size_t left = s.size() - p;
    if (u[0] < 0x80) return u[0] == ' ' || (u[0] >= '\t' && u[0] <= '\r') || (u[0] >= 0x1c && u[0] <= 0x1f);
    if (u[0] == 0xC2) return left >= 2 && (u[1] == 0x85 || u[1] == 0xA0) ? 2 : 0;
    if (left < 3) return 0;
    const uint32_t c = (uint32_t)u[0] << 16 | (uint32_t)u[1] << 8 | u[2];
    const bool space = c == 0xE19A80 || (c >= 0xE28080 && c <= 0xE2808A) || c == 0xE280A8 || c == 0xE280A9 || c == 0xE280AF ||
                       c == 0xE2819F || c == 0xE38080;
    return space ? 3 : 0;
}

// The byte length of the whitespace character ending at s[e - 1] (0 if none does). In valid UTF-8 a whole
// character's bytes just before e are that character (a lead byte never continues another).
static inline size_t py_space_before(const std::string& s, size_t e) {
    for (size_t len = 1; len <= 3 && len <= e; len++)
        if (py_space_at(s, e - len) == len) return len;
    return 0;
}

// Python's str.strip() of valid UTF-8 text
static inline std::string py_strip(const std::string& s) {
    size_t b = 0, e = s.size(), len;
    while (b < e && (len = py_space_at(s, b)) > 0) b += len;
    while (e > b && (len = py_space_before(s, e)) > 0) e -= len;
    return s.substr(b, e - b);
}

// GSM8K's answer: the first "#### " followed by an optional '-' and one or more of [0-9.,] (the regex
// r"#### (\-?[0-9\.\,]+)"), commas removed; false if there is none. (nanochat strips the match too, which
// changes nothing: it holds no whitespace.)
static inline bool gsm8k_extract_answer(const std::string& text, std::string* out) {
    auto number_char = [](char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; };
    for (size_t i = text.find("#### "); i != std::string::npos; i = text.find("#### ", i + 1)) {
        size_t j = i + 5, k = j + (j < text.size() && text[j] == '-');
        size_t e = k;
        while (e < text.size() && number_char(text[e])) e++;
        if (e == k) continue;
        out->clear();
        for (size_t p = j; p < e; p++)
            if (text[p] != ',') out->push_back(text[p]);
        return true;
    }
    return false;
}

// HumanEval's program in a completion (valid UTF-8): the first block matching r'```(?:python)?\s*\n(.*?)\n```'
// (DOTALL: after ``` and an optional "python", whitespace ending in a newline, then the shortest text up to a
// newline and ```), stripped; else the whole completion, stripped. \s and the strip are Python's whitespace
// (py_space_at), Unicode's included. The regex's backtracking is followed exactly: the block's text starts
// after the last newline of the whitespace that has a closing fence after it.
static inline std::string humaneval_extract_program(const std::string& text) {
    for (size_t i = text.find("```"); i != std::string::npos; i = text.find("```", i + 1)) {
        size_t pos = i + 3, len;
        if (text.compare(pos, 6, "python") == 0) pos += 6;
        size_t run_end = pos;
        while (run_end < text.size() && (len = py_space_at(text, run_end)) > 0) run_end += len;
        for (size_t ws = run_end; ws-- > pos;) {
            if (text[ws] != '\n') continue;
            const size_t close = text.find("\n```", ws + 1);
            if (close != std::string::npos) return py_strip(text.substr(ws + 1, close - ws - 1));
        }
    }
    return py_strip(text);
}

// What the test process runs before the program, as nanochat's execution.py guard does (not a security
// sandbox: it keeps a wrong program from doing damage by accident): 256 MB address-space, data and stack
// limits, and the functions that delete files, kill processes or start others disabled. The program
// follows as a string literal (json-escaped: a valid Python literal) passed to exec with fresh globals.
static const char* const PYTHON_GUARD =
    "import faulthandler, builtins, os, shutil, subprocess, sys, resource\n"
    "for limit in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_STACK):\n"
    "    resource.setrlimit(limit, (256 * 1024 * 1024, 256 * 1024 * 1024))\n"
    "faulthandler.disable()\n"
    "builtins.exit = builtins.quit = builtins.help = None\n"
    "os.environ['OMP_NUM_THREADS'] = '1'\n"
    "for name in ('kill', 'system', 'putenv', 'remove', 'removedirs', 'rmdir', 'fchdir', 'setuid', 'fork', 'forkpty', 'killpg',\n"
    "             'rename', 'renames', 'truncate', 'replace', 'unlink', 'fchmod', 'fchown', 'chmod', 'chown', 'chroot', 'lchflags',\n"
    "             'lchmod', 'lchown', 'getcwd', 'chdir'):\n"
    "    setattr(os, name, None)\n"
    "for name in ('rmtree', 'move', 'chown'):\n"
    "    setattr(shutil, name, None)\n"
    "subprocess.Popen = None\n"
    "for name in ('ipdb', 'joblib', 'resource', 'psutil', 'tkinter'):\n"
    "    sys.modules[name] = None\n";

// s as a Python string literal: "..." with backslash, double quote and the control characters escaped;
// UTF-8 passes through as it is.
static inline std::string python_literal(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '\\' || c == '"') out += '\\', out += (char)c;
        else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else out += (char)c;
    }
    return out + "\"";
}

// The python3 that runs HumanEval's tests: the interpreter (sys.executable) of the python3 on PATH, found
// once; "" if there is none. Asked of python3 itself, so that a launcher script (pyenv's shims, which need
// the environment the test process does not get) resolves to the real interpreter.
static inline const std::string& python_path() {
    static const std::string path = [] {
        std::string found;
        FILE* p = popen("python3 -c 'import sys; print(sys.executable)' 2>/dev/null", "r");
        if (!p) return found;
        char line[4096];
        if (fgets(line, sizeof line, p)) found.assign(line, strcspn(line, "\r\n"));
        if (pclose(p) != 0 || found.empty() || found[0] != '/' || access(found.c_str(), X_OK) != 0) found.clear();
        return found;
    }();
    return path;
}

// Runs `program` with python3 (python_path) in a separate process (nanochat's execute_code): a fresh interpreter
// started by the guard above, in a temporary directory deleted afterwards, with a scrubbed environment (PATH only),
// no stdin, output discarded, killed (with anything it started) after timeout_s. True iff it exits with 0.
// A program that is not valid UTF-8 fails as it would when decoded and compiled by Python.
// The deadline lives in this process's polling loop, so two limits hold where that loop cannot act:
//   * the process dies with the thread that started it (PR_SET_PDEATHSIG): an evaluator killed mid-run leaves no
//     program running. The signal follows the forking *thread*, not the process; the thread is safe here because
//     chat_check runs on the calling process's main thread (chat_eval, chat_sft and each forked rank call
//     chatcore_evaluate there, outside any OpenMP region), whose exit is the process's;
//   * RLIMIT_CPU, inherited by whatever the program starts, a few seconds past the deadline: SIGXCPU, then SIGKILL
//     a second later, for a process that left the group killed below (setsid) and burns CPU. Only a program
//     running on more than one core could reach it before the deadline; HumanEval's solutions run on one.
static inline bool python_run_passes(const std::string& program, double timeout_s = 5.0) {
    const std::string& python = python_path();
    if (python.empty()) fail("HumanEval runs the model's code with python3, which is not on PATH here");
    char dir[] = "/tmp/xsa_humaneval_XXXXXX";
    if (!mkdtemp(dir)) fail("cannot create a directory for HumanEval's test process: %s", strerror(errno));
    const std::string script = std::string(PYTHON_GUARD) + "exec(compile(" + python_literal(program) + ", '<llm>', 'exec'), {'__name__': '__main__'})\n";
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) fail("cannot start HumanEval's test process: %s", strerror(errno));
    if (pid == 0) {
        // a parent that died before the prctl sends no signal: then the parent is no longer ours
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
        // the CPU limit, lowered only (a lower one set from outside stays)
        const rlim_t cpu_s = (rlim_t)ceil(timeout_s) + 2;
        struct rlimit cpu;
        if (getrlimit(RLIMIT_CPU, &cpu) != 0) _exit(127);
        cpu.rlim_cur = std::min(cpu.rlim_cur, cpu_s);
        cpu.rlim_max = std::min(cpu.rlim_max, cpu_s + 1);
        if (setrlimit(RLIMIT_CPU, &cpu) != 0) _exit(127);
        setpgid(0, 0);
        if (chdir(dir) != 0) _exit(127);
        const int null_fd = open("/dev/null", O_RDWR);
        if (null_fd < 0) _exit(127);
        dup2(null_fd, 0);
        dup2(null_fd, 1);
        dup2(null_fd, 2);
        // argv[0] the interpreter's own path: Python finds its library from it (a bare "python3" would be
        // looked up on the scrubbed PATH, and another installation's library found)
        char* const argv[] = {(char*)python.c_str(), (char*)"-c", (char*)script.c_str(), nullptr};
        char* const envp[] = {(char*)"PATH=/usr/bin:/bin", nullptr};
        execve(python.c_str(), argv, envp);
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0;
    bool finished = false;
    const double start = wall_ms();
    while (!finished) {
        const pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid) finished = true;
        else if (got < 0 && errno != EINTR) break;
        else if (wall_ms() - start > timeout_s * 1000.0) break;
        else usleep(2000);
    }
    kill(-pid, SIGKILL);  // the program's own children too, whatever happened
    if (!finished) waitpid(pid, &status, 0);
    const std::string remove = std::string("rm -rf '") + dir + "'";
    if (system(remove.c_str()) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    return finished && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Whether a completion (the answer's tokens' bytes) answers item (a generative task's checker). The checkers
// read the text nanochat's tokenizer decodes, invalid UTF-8 replaced by U+FFFD (bytes.decode("utf-8",
// errors="replace")), so a broken byte in a comment does not fail a correct program.
static inline bool chat_check(const ChatTask& task, const ChatItem& item, const std::string& completion) {
    const std::string text = utf8_replace_invalid(completion);
    if (task.checker == CHECK_GSM8K) {
        std::string got;
        return gsm8k_extract_answer(text, &got) && got == item.refs[0];
    }
    // HumanEval: the prompt's imports, the completion's code, the tests, and the call of check on the entry point
    const std::string program = item.refs[0] + "\n\n" + humaneval_extract_program(text) + "\n\n" + item.refs[1] + "\n" + "check(" + item.refs[2] + ")";
    return python_run_passes(program);
}

// ----------------------------------------------------------------------------------------------------
// Aggregation: centered accuracy (acc - baseline) / (1 - baseline); ChatCORE = their mean over the five
// tasks, reported only when all five ran, and over six when SpellingBee ran too (ChatCORE as nanochat
// computed it before July 2026, the study's); ChatCORE_cat = the same over the categorical ones.

struct ChatTaskResult {
    std::string label;
    int kind = 0;
    float baseline = 0.0f;
    std::vector<int> correct;  // per item evaluated, 0/1
    std::vector<int> pred;     // categorical: the chosen letter's index, per item
    std::vector<std::string> answers;  // generative: the answer's text, per item (this rank's items only)
    double accuracy = 0.0, centered = 0.0;
};

struct ChatResult {
    std::vector<ChatTaskResult> tasks;
    double chatcore = NAN, chatcore_cat = NAN;  // NAN: not every task ran
    int chatcore_tasks = 0;                      // the tasks in chatcore: 5, or 6 with SpellingBee
};

static inline void chat_finish(ChatResult* r) {
    int all = 0, cat = 0, cat_seen = 0, spelling_bee = 0;
    double sum = 0.0, sum_cat = 0.0, sum_spelling_bee = 0.0;
    for (ChatTaskResult& t : r->tasks) {
        long n = 0;
        for (int c : t.correct) n += c;
        t.accuracy = t.correct.empty() ? 0.0 : (double)n / t.correct.size();
        t.centered = (t.accuracy - t.baseline) / (1.0 - t.baseline);
        for (const char* name : CHAT_TASKS)
            if (t.label == name) all++, sum += t.centered;
        if (t.label == CHAT_TASK_BEFORE_JULY) spelling_bee++, sum_spelling_bee += t.centered;
        if (t.kind == CHAT_CATEGORICAL) cat_seen++, sum_cat += t.centered;
        if (t.kind == CHAT_CATEGORICAL && (t.label == "ARC-Easy" || t.label == "ARC-Challenge" || t.label == "MMLU")) cat++;
    }
    r->chatcore_tasks = all == 5 ? 5 + spelling_bee : 0;
    r->chatcore = all == 5 ? (sum + sum_spelling_bee) / r->chatcore_tasks : NAN;
    r->chatcore_cat = cat == 3 && cat_seen == 3 ? sum_cat / 3.0 : NAN;
}

static inline void chat_print(const ChatResult& r) {
    printf("%-16s %-12s %6s %9s %9s %9s\n", "task", "kind", "items", "accuracy", "baseline", "centered");
    for (const ChatTaskResult& t : r.tasks)
        printf("%-16s %-12s %6zu %9.4f %9.4f %9.4f\n", t.label.c_str(), t.kind == CHAT_CATEGORICAL ? "categorical" : "generative",
               t.correct.size(), t.accuracy, t.baseline, t.centered);
    if (std::isfinite(r.chatcore))
        printf("ChatCORE %.6f%s | ChatCORE_cat %.6f\n", r.chatcore,
               r.chatcore_tasks == 6 ? " (6 tasks with SpellingBee: nanochat's ChatCORE before July 2026)" : "", r.chatcore_cat);
    else printf("ChatCORE: n/a (needs all of ARC-Easy, ARC-Challenge, MMLU, GSM8K, HumanEval)%s\n",
                std::isfinite(r.chatcore_cat) ? (" | ChatCORE_cat " + std::to_string(r.chatcore_cat)).c_str() : "");
}

static inline void chat_write_csv(const ChatResult& r, const std::string& path) {
    std::string text = "task,kind,items,accuracy,baseline,centered\n";
    char line[512];
    for (const ChatTaskResult& t : r.tasks) {
        snprintf(line, sizeof line, "%s,%s,%zu,%.6f,%.6f,%.6f\n", t.label.c_str(), t.kind == CHAT_CATEGORICAL ? "categorical" : "generative",
                 t.correct.size(), t.accuracy, t.baseline, t.centered);
        text += line;
    }
    if (std::isfinite(r.chatcore)) {
        snprintf(line, sizeof line, "ChatCORE,,,,,%.6f\n", r.chatcore);
        text += line;
    }
    AtomicFile out = atomic_open(path);
    atomic_write(&out, text.data(), text.size());
    atomic_commit(&out);
}
