// fuzz_chat_task: a ChatCORE task file (chat/chatcore.h: chat_task_load), loaded for the embedded corpus's
// tokenizer (vocabulary 4096, BOS 4087). An accepted task's references go through the answer checkers that
// need no process (GSM8K's number, HumanEval's program extraction), and made-up verdicts through the
// aggregation, which must give finite numbers.
#include "dev/fuzz/fuzz_util.h"
#include "chat/chatcore.h"

static const int VOCAB = 4096, BOS = 4087;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static FuzzFile file = fuzz_file("chat_task");
    const std::string& path = fuzz_write(file, data, size);
    ChatTask task;
    if (!fuzz_parse(path, [&] { task = chat_task_load(path, VOCAB, BOS); })) return 0;
    ChatResult result;
    ChatTaskResult r;
    r.label = task.label;
    r.kind = task.kind;
    r.baseline = task.baseline;
    for (const ChatItem& item : task.items) {
        int verdict = (int)(item.prompt.size() % 2);
        for (const std::string& s : item.refs) {
            std::string number;
            verdict ^= gsm8k_extract_answer(s, &number);
            g_fuzz_sink += number.size() + humaneval_extract_program(s).size();
        }
        r.correct.push_back(verdict);
    }
    result.tasks.push_back(r);
    chat_finish(&result);
    for (const ChatTaskResult& t : result.tasks)
        if (!std::isfinite(t.accuracy) || !std::isfinite(t.centered)) abort();
    return 0;
}
