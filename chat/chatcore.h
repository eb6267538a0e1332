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
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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
        if (item.prompt.empty() || item.prompt[0] != bos_id) fail("ChatCORE task file '%s': item %u's prompt does not start with BOS", path.c_str(), i);
        if (item.prompt.size() < 2)  // (chat_eval.py renders BOS, the conversation, then <|assistant_start|>)
            fail("ChatCORE task file '%s': item %u's prompt is BOS alone, not a conversation ending with <|assistant_start|>; make the file again "
                 "with dev/data/chat_eval.py", path.c_str(), i);
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
    char* line = nullptr;  // each line whole, however long (getline grows it)
    size_t capacity = 0;
    struct LineFree {
        char** line;
        ~LineFree() { free(*line); }
    } line_free{&line};
    for (ssize_t got; (got = getline(&line, &capacity, f)) >= 0;) {
        const std::string name = std::string(line, (size_t)got).substr(0, strcspn(line, " \t\r\n"));
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

// What the test process runs before the program, as nanochat's execution.py guard does (not a security boundary:
// it keeps a wrong program from doing damage by accident; the boundary is python_run_passes's): the 256 MB stack
// limit, and the functions that delete files, kill processes or start others disabled. The address-space and data
// limits of nanochat's guard are set before exec instead (sandbox_child); the stack's stays here, after start-up as
// in nanochat, because glibc sizes every thread's stack from RLIMIT_STACK at start-up: set before exec, a thread
// would ask for 256 MB of stack and not fit the address space. The program follows as a string literal
// (json-escaped: a valid Python literal) passed to exec with fresh globals.
static const char* const PYTHON_GUARD =
    "import faulthandler, builtins, os, shutil, subprocess, sys, resource\n"
    "resource.setrlimit(resource.RLIMIT_STACK, (256 * 1024 * 1024, 256 * 1024 * 1024))\n"
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

// ----------------------------------------------------------------------------------------------------
// HumanEval's test process: the model's program, run by python3 (nanochat's execute_code) behind a boundary the
// kernel keeps, since the program may do anything python3 can. What it stops and what it does not:
// dev/docs/evaluation.md#humanevals-boundary.
//
// Where the kernel lets an unprivileged process make them (humaneval_namespaces), the process gets namespaces of
// its own: user (uid 1000 inside, not root: after exec it has no capability, so it can undo nothing below), mount
// (every mount read-only but its directory, a private tmpfs), PID (python3 is PID 1 of its own /proc: no process
// outside can be seen or signalled, and when PID 1 dies the kernel kills whatever it started), network (a loopback
// device, down) and IPC.
static const int SANDBOX_NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC;
static const int SANDBOX_MARKER_FD = 3;             // the pass marker's pipe: the one descriptor past 0-2 it gets
static const rlim_t SANDBOX_MEMORY = 256ull << 20;  // nanochat's maximum_memory_bytes: address space and data
static const rlim_t SANDBOX_FILE_SIZE = 16ull << 20;
static const rlim_t SANDBOX_FILES = 64;  // descriptors
// Processes and threads, with namespaces only: there RLIMIT_NPROC counts the processes of the namespace's uid, the
// program's own; without them it would count every process of ours (the trainer's threads too), so whether a program
// could start one would depend on what else runs. The kernel does not enforce it for root.
static const rlim_t SANDBOX_PROCESSES = 64;
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442  // Linux 5.12, the same number on every architecture (older C libraries lack the name)
#endif
#ifndef SYS_close_range
#define SYS_close_range 436  // Linux 5.9
#endif

// Setting the test process up, step by step (named in the error when one fails); the first
// SANDBOX_NAMESPACE_STEPS are the namespaces', whose failure means that this system does not allow them.
enum { SB_CLONE, SB_IDMAP, SB_READONLY, SB_TMPFS, SB_PROC, SB_SESSION, SB_CHDIR, SB_FDS, SB_LIMITS, SB_NO_NEW_PRIVS, SB_EXEC };
static const int SANDBOX_NAMESPACE_STEPS = SB_SESSION;
static const char* const SANDBOX_STEPS[] = {"start it (clone)", "map its user id", "make the file system read-only",
                                            "mount its private directory", "mount its own /proc", "start its own session",
                                            "enter its directory", "set its descriptors", "set its resource limits",
                                            "set no_new_privs", "exec python3"};

struct SandboxPlan {  // what the child needs, made before clone (the child allocates nothing)
    bool isolate;     // the namespaces
    const char* dir;  // its working directory (with namespaces, a tmpfs over it)
    char* const* argv;
    char uid_map[32], gid_map[32];         // "1000 OUR_ID 1"
    int report_fd, report_peer, marker_fd;  // the child's end of the report socket, the parent's, the marker pipe's write end
    rlim_t cpu_s;
};

static inline bool sandbox_write_file(const char* path, const char* text) {
    const int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    close(fd);
    return ok;
}

// Lowers a limit to soft / hard at most (a lower one set from outside stays); hard, so the program cannot raise it.
static inline bool sandbox_lower_limit(int resource, rlim_t soft, rlim_t hard) {
    struct rlimit r;
    if (getrlimit(resource, &r) != 0) return false;
    r.rlim_cur = std::min(r.rlim_cur, soft);
    r.rlim_max = std::min(r.rlim_max, hard);
    return setrlimit(resource, &r) == 0;
}

// The test process from clone to exec: system calls only (another thread of ours may have held malloc's lock at the
// clone). A failed step sends {step, errno} on the report socket, which exec closes otherwise.
static int sandbox_child(void* arg) {
    const SandboxPlan& p = *(const SandboxPlan*)arg;
    int report = p.report_fd;
    auto failed = [&](int step) {
        const int record[2] = {step, errno};
        (void)!write(report, record, sizeof record);  // (if even this fails, the parent sees a program that failed)
        _exit(127);
    };
    // It dies with the thread that started it (PR_SET_PDEATHSIG). A parent that died before the prctl sends no
    // signal; it has closed its end of the socket then (the only other copy, ours, closed first), which poll sees.
    close(p.report_peer);
    struct pollfd parent = {report, POLLRDHUP, 0};
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || poll(&parent, 1, 0) != 0) _exit(127);
    if (p.isolate) {
        if (!sandbox_write_file("/proc/self/setgroups", "deny") || !sandbox_write_file("/proc/self/uid_map", p.uid_map) ||
            !sandbox_write_file("/proc/self/gid_map", p.gid_map))
            failed(SB_IDMAP);
        // mount_setattr(2) on every mount under / (AT_RECURSIVE, 0x8000) with struct mount_attr {attr_set =
        // MOUNT_ATTR_RDONLY (1), attr_clr, propagation, userns_fd}: read-only, and private (the tmpfs stays ours)
        const uint64_t read_only[4] = {1, 0, MS_PRIVATE, 0};
        if (syscall(SYS_mount_setattr, AT_FDCWD, "/", 0x8000, read_only, sizeof read_only) != 0) failed(SB_READONLY);
        if (mount("tmpfs", p.dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0700") != 0) failed(SB_TMPFS);
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) failed(SB_PROC);
    }
    if (setsid() < 0) failed(SB_SESSION);  // its own session and process group, killed whole at the deadline
    if (chdir(p.dir) != 0) failed(SB_CHDIR);
    // 0-2 /dev/null, the marker's pipe at 3, the report socket at 4 until exec, nothing else of ours (copies made
    // at 5 or above first, out of the way of the moves)
    const int null_fd = open("/dev/null", O_RDWR);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0) failed(SB_FDS);
    const int report_copy = fcntl(report, F_DUPFD_CLOEXEC, 5), marker = fcntl(p.marker_fd, F_DUPFD, 5);
    if (report_copy < 0) failed(SB_FDS);
    report = report_copy;
    if (marker < 0 || dup2(marker, SANDBOX_MARKER_FD) < 0 || dup3(report, 4, O_CLOEXEC) < 0) failed(SB_FDS);
    report = 4;
    if (syscall(SYS_close_range, 5u, ~0u, 0u) != 0) {  // before Linux 5.9: one by one, up to the limit
        struct rlimit files;
        if (getrlimit(RLIMIT_NOFILE, &files) != 0) failed(SB_FDS);
        for (rlim_t fd = 5; fd < files.rlim_cur; fd++) close((int)fd);
    }
    // CPU: a few seconds past the deadline (the header of python_run_passes says why)
    if (!sandbox_lower_limit(RLIMIT_CPU, p.cpu_s, p.cpu_s + 1) || !sandbox_lower_limit(RLIMIT_AS, SANDBOX_MEMORY, SANDBOX_MEMORY) ||
        !sandbox_lower_limit(RLIMIT_DATA, SANDBOX_MEMORY, SANDBOX_MEMORY) ||
        !sandbox_lower_limit(RLIMIT_FSIZE, SANDBOX_FILE_SIZE, SANDBOX_FILE_SIZE) ||
        !sandbox_lower_limit(RLIMIT_NOFILE, SANDBOX_FILES, SANDBOX_FILES) || !sandbox_lower_limit(RLIMIT_CORE, 0, 0) ||
        (p.isolate && !sandbox_lower_limit(RLIMIT_NPROC, SANDBOX_PROCESSES, SANDBOX_PROCESSES)))
        failed(SB_LIMITS);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) failed(SB_NO_NEW_PRIVS);  // a set-uid program it runs gains nothing
    // the environment: PATH only (nanochat's). argv[0] the interpreter's own path: Python finds its library from it
    // (a bare "python3" would be looked up on that PATH, and another installation's library found)
    char* const envp[] = {(char*)"PATH=/usr/bin:/bin", nullptr};
    execve(p.argv[0], p.argv, envp);
    failed(SB_EXEC);
    return 127;
}

struct SandboxRun {
    int failed_step = -1, error = 0;  // a step of setting up that failed (SANDBOX_STEPS), its errno
    bool passed = false;
};

// One run of `program` in the test process (python_run_passes). A pass: the program ran to its end, the statement
// after it wrote the marker (a nonce drawn here, in no text the model saw) to its pipe, and python3 exited with 0.
static inline SandboxRun sandbox_run(const std::string& program, double timeout_s, bool isolate) {
    const std::string& python = python_path();
    if (python.empty()) fail("HumanEval runs the model's code with python3, which is not on PATH here");
    unsigned char random[16];
    if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random) fail("cannot draw HumanEval's pass marker: %s", strerror(errno));
    char nonce[2 * sizeof random + 1];
    for (size_t i = 0; i < sizeof random; i++) snprintf(nonce + 2 * i, 3, "%02x", random[i]);
    const std::string script = std::string(PYTHON_GUARD) + "passed = os.write\n" + "exec(compile(" + python_literal(program) +
                               ", '<llm>', 'exec'), {'__name__': '__main__'})\n" + "passed(" + std::to_string(SANDBOX_MARKER_FD) + ", b'" + nonce + "')\n";
    char dir[] = "/tmp/xsa_humaneval_XXXXXX";
    if (!mkdtemp(dir)) fail("cannot create a directory for HumanEval's test process: %s", strerror(errno));
    int report[2], marker[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, report) != 0 || pipe2(marker, O_CLOEXEC) != 0)
        fail("cannot make the pipes of HumanEval's test process: %s", strerror(errno));
    char* const argv[] = {(char*)python.c_str(), (char*)"-c", (char*)script.c_str(), nullptr};
    SandboxPlan plan = {isolate, dir, argv, {}, {}, report[1], report[0], marker[1], (rlim_t)ceil(timeout_s) + 2};
    snprintf(plan.uid_map, sizeof plan.uid_map, "1000 %u 1", (unsigned)geteuid());
    snprintf(plan.gid_map, sizeof plan.gid_map, "1000 %u 1", (unsigned)getegid());
    std::vector<char> stack(1 << 16);  // the child's until exec (no CLONE_VM: it has a copy of our memory, this included)
    const pid_t pid = clone(sandbox_child, stack.data() + stack.size(), (isolate ? SANDBOX_NAMESPACES : 0) | SIGCHLD, &plan);
    close(report[1]);
    close(marker[1]);
    SandboxRun r;
    if (pid < 0) r.failed_step = SB_CLONE, r.error = errno;
    else {  // a record if a step failed, else nothing: exec closed the child's end
        int record[2];
        ssize_t got;
        do got = recv(report[0], record, sizeof record, MSG_WAITALL);
        while (got < 0 && errno == EINTR);
        if (got == (ssize_t)sizeof record) r.failed_step = record[0], r.error = record[1];
    }
    close(report[0]);
    int status = 0;
    bool finished = pid < 0;
    const double start = wall_ms();
    while (!finished && r.failed_step < 0) {
        const pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) finished = true;
        else if (done < 0 && errno != EINTR) break;
        else if (wall_ms() - start > timeout_s * 1000.0) break;
        else usleep(2000);
    }
    if (pid > 0) {
        kill(-pid, SIGKILL);  // its process group, whatever happened (with namespaces PID 1's death takes the rest)
        if (!finished) waitpid(pid, &status, 0);
    }
    char seen[sizeof nonce];
    const bool marked = fcntl(marker[0], F_SETFL, O_NONBLOCK) == 0 && read(marker[0], seen, sizeof seen) == (ssize_t)sizeof nonce - 1 &&
                        memcmp(seen, nonce, sizeof nonce - 1) == 0;
    close(marker[0]);
    const std::string remove = std::string("rm -rf '") + dir + "'";
    if (system(remove.c_str()) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    r.passed = r.failed_step < 0 && finished && WIFEXITED(status) && WEXITSTATUS(status) == 0 && marked;
    return r;
}

[[noreturn]] static inline void sandbox_fail(const SandboxRun& r) {
    fail("cannot set up HumanEval's test process (%s): %s", SANDBOX_STEPS[r.failed_step], strerror(r.error));
}

// Whether the test process gets its namespaces here, found once by running a program that does nothing. Where they
// cannot be made (a container that forbids them, a kernel before 5.12) a note says so and it runs without them. The
// program must pass either way: a test process that passes nothing would score every answer wrong.
static inline bool humaneval_namespaces() {
    static const bool isolate = [] {
        SandboxRun r = sandbox_run("", 5.0, true);
        const bool works = r.failed_step < 0 || r.failed_step >= SANDBOX_NAMESPACE_STEPS;
        if (!works) {
            fprintf(stderr, "note: HumanEval's test process runs without namespaces here (cannot %s: %s); dev/docs/evaluation.md#humanevals-boundary "
                    "says what it then does not stop\n", SANDBOX_STEPS[r.failed_step], strerror(r.error));
            r = sandbox_run("", 5.0, false);
        }
        if (r.failed_step >= 0) sandbox_fail(r);
        if (!r.passed) fail("HumanEval's test process does not pass a program that does nothing (does %s start within 256 MB?)", python_path().c_str());
        return works;
    }();
    return isolate;
}

// Runs `program` with python3 (python_path) in the test process above: a fresh interpreter started by the guard, in
// a private temporary directory deleted afterwards, with no stdin, output discarded, killed (with anything it
// started) after timeout_s. True iff it ran to its end (the marker) and exited with 0: a program that exits before
// its tests (sys.exit(0), os._exit(0)) fails, as in nanochat's in-process runner before commit f4f69f9 (2026-07-03,
// the study's; its subprocess runner since, 92d63d4's, counts the exit status only: dev/docs/evaluation.md#chatcore). A program
// that is not valid UTF-8 fails as it would when decoded and compiled by Python. `isolate`: the namespaces, by
// default wherever they can be made (tests run without them to check what holds then).
// The deadline lives in this process's polling loop, so two limits hold where that loop cannot act:
//   * the process dies with the thread that started it (PR_SET_PDEATHSIG): an evaluator killed mid-run leaves no
//     program running. The signal follows the forking *thread*, not the process; the thread is safe here because
//     chat_check runs on the calling process's main thread (chat_eval, chat_sft and each forked rank call
//     chatcore_evaluate there, outside any OpenMP region), whose exit is the process's;
//   * RLIMIT_CPU, inherited by whatever the program starts, a few seconds past the deadline: SIGXCPU, then SIGKILL
//     a second later, for a process that left the group killed below (setsid; without namespaces only: with them
//     it dies with PID 1) and burns CPU. Only a program running on more than one core could reach it before the
//     deadline; HumanEval's solutions run on one.
static inline bool python_run_passes(const std::string& program, double timeout_s = 5.0, bool isolate = humaneval_namespaces()) {
    const SandboxRun r = sandbox_run(program, timeout_s, isolate);
    if (r.failed_step >= 0) sandbox_fail(r);
    return r.passed;
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
