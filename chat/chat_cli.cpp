/*
chat_cli.cpp: talk with a model that went through SFT, in nanochat's chat format.
    make chat_cli && ./chat_cli -e CHECKPOINT [-t 0.6] [-k 50] [-n 256] [-p "one question"]
Each user turn is <|user_start|> text <|user_end|>, then <|assistant_start|>, and the model answers until
it writes <|assistant_end|> (or <|bos|>, or -n tokens); the answer and <|assistant_end|> join the
conversation, and the next turn sees all of it (the whole conversation is one sequence, BOS first, as
nanochat's chat_cli builds it). Type 'clear' to start over, 'quit' or end of input to stop. With -p:
one answer to that text, then exit. A base model's answers will not make sense; the path works all the same.
As nanochat's engine, the answer may use the calculator: <|python_start|> 12/60 <|python_end|> is followed
by <|output_start|> 0.2 <|output_end|>, forced in (chat/tool.h: CalculatorTool).
*/
#define TRAIN_GPT_NO_MAIN  // use train_gpt.cu as a library: everything but main()
#include "../train_gpt.cu"
#include "generation_args.h"
#include "tool.h"

#include <iostream>

static void usage() {
    printf("usage: chat_cli -e CHECKPOINT [-p TEXT] [-n TOKENS] [-t TEMPERATURE] [-k TOP_K] [-s SEED] [--tokenizer FILE]\n"
           "  -e FILE          checkpoint or exported weights of a chat (SFT) model\n"
           "  -p TEXT          answer this one message and exit (default: an interactive conversation on stdin)\n"
           "  -n N             tokens per answer, at most (default 256)\n"
           "  -t T             temperature; 0 is greedy (default 0.6)\n"
           "  -k K             sample among the K most likely tokens; 0 for all (default 50)\n"
           "  -s SEED          random seed (default 42)\n"
           "  --tokenizer FILE the model's tokenizer, if not where its file says\n");
}

static int special_or_fail(const Tokenizer* tok, const char* name) {
    const int id = tokenizer_special_id(tok, name);
    if (id < 0) fail("the tokenizer '%s' has no special token %s: chat needs nanochat's chat tokens", tok->path.c_str(), name);
    return id;
}

int main(int argc, char** argv) {
    openmp_short_spin(argv);  // first: it may start the program again (common.h says why)
    GenerationArgs a;
    a.max_new = 256;
    a.sampling.temperature = 0.6f;
    a.sampling.top_k = 50;
    std::string one_message;
    bool one_shot = false;
    parse_options(argc, argv, usage, [&](const std::string& flag, const char* value) {
        if (flag == "-p") one_message = value, one_shot = true;
        else return parse_generation_flag(&a, flag, value);
        return true;
    });
    validate_generation_args(a, "chat_cli");

    backend_init(nullptr);
    GPT model;
    Tokenizer tok;
    if (load_model_and_tokenizer(&model, &tok, a.weights, a.tokenizer))
        printf("note: this is a base model (a checkpoint of train_gpt, not fine-tuned by chat_sft): it continues text rather than "
               "answering; fine-tune it first: ./chat_sft --init-from CHECKPOINT --sft DIR -o sft (dev/docs/chat.md)\n");
    const int user_start = special_or_fail(&tok, "<|user_start|>"), user_end = special_or_fail(&tok, "<|user_end|>");
    const int assistant_start = special_or_fail(&tok, "<|assistant_start|>"), assistant_end = special_or_fail(&tok, "<|assistant_end|>");
    const int context = model.config.seq_len;
    const CalculatorTool tool = calculator_tool(&tok);  // the model's <|python_start|> 2+3 <|python_end|> gets its result
    if (!one_shot) printf("chat with %s (context %d tokens, %s). 'clear' starts over, 'quit' stops.\n", a.weights.c_str(), context, BACKEND_NAME);

    std::vector<int> conversation = {tok.bos_id};
    for (int turn = 0;; turn++) {
        std::string message;
        if (one_shot) {
            if (turn > 0) break;
            message = one_message;
        } else {
            printf("\nUser: ");
            fflush(stdout);
            if (!std::getline(std::cin, message)) break;
            if (message == "quit" || message == "exit") break;
            if (message == "clear") {
                conversation = {tok.bos_id};
                printf("(conversation cleared)\n");
                continue;
            }
        }
        std::vector<int> turn_tokens = {user_start};
        const std::vector<int> text = tokenizer_encode(&tok, message);
        turn_tokens.insert(turn_tokens.end(), text.begin(), text.end());
        turn_tokens.push_back(user_end);
        turn_tokens.push_back(assistant_start);
        if ((long)conversation.size() + (long)turn_tokens.size() >= context) {
            if (conversation.size() == 1) fail("the message has %zu tokens; the model's context is %d", text.size(), context);
            printf("(the conversation is past the model's context of %d tokens; starting over with this message)\n", context);
            conversation = {tok.bos_id};
            if ((long)turn_tokens.size() + 1 >= context) fail("the message has %zu tokens; the model's context is %d", text.size(), context);
        }
        conversation.insert(conversation.end(), turn_tokens.begin(), turn_tokens.end());
        if (!one_shot) printf("\nAssistant: ");
        fflush(stdout);
        GenerateStats stats;
        const std::vector<std::vector<int>> answer = generate(&model, {conversation}, a.max_new, a.sampling, a.seed + (uint64_t)turn,
                                                              {assistant_end, tok.bos_id}, [&](int, int token) {
            const std::string& piece = tok.pieces[token];
            fwrite(piece.data(), 1, piece.size(), stdout);
            fflush(stdout);
        }, &stats, &tool);
        printf("\n");
        conversation.insert(conversation.end(), answer[0].begin(), answer[0].end());
        conversation.push_back(assistant_end);
        fprintf(stderr, "(%zu tokens at %.1f tokens/s)\n", answer[0].size(),
                stats.decode_steps > 0 ? stats.decode_steps / (stats.decode_ms / 1000.0) : 0.0);
    }
    gpt_free(&model);
    return 0;
}
