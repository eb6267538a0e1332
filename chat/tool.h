// tool.h: nanochat's calculator tool in chat generation (its Engine): the special tokens that open and
// close an expression and its output, and the per-row state machine generate() (llmc/engine.h) drives.
// Included after train_gpt.cu (as a library).
#pragma once

#include "calculator.h"
#include "encoder.h"

// nanochat's calculator tool (its Engine): a row that writes <|python_start|> EXPR <|python_end|> gets
// <|output_start|> RESULT <|output_end|> forced in as its next tokens, RESULT = calculator_eval of the decoded
// EXPR (chat/calculator.h) encoded; no result (an expression it refuses), nothing forced. Forced tokens are
// new tokens like the sampled ones (they count against max_new).
struct ToolRow;
struct CalculatorTool {
    using Row = ToolRow;             // each row's state (generate() keeps one per row)
    const Tokenizer* tok = nullptr;  // null: no tool (the tokenizer has no chat tokens)
    int python_start = -1, python_end = -1, output_start = -1, output_end = -1;
};

static CalculatorTool calculator_tool(const Tokenizer* tok) {
    CalculatorTool t;
    t.python_start = tokenizer_special_id(tok, "<|python_start|>");
    t.python_end = tokenizer_special_id(tok, "<|python_end|>");
    t.output_start = tokenizer_special_id(tok, "<|output_start|>");
    t.output_end = tokenizer_special_id(tok, "<|output_end|>");
    if (t.python_start >= 0 && t.python_end >= 0 && t.output_start >= 0 && t.output_end >= 0) t.tok = tok;
    return t;
}

// One row's use of the tool: the tokens to force in (the next one last) and the expression being written
struct ToolRow {
    std::vector<int> forced, expr;
    bool in_python = false;
};

// The tool sees the row's next token (sampled or forced)
static void tool_step(const CalculatorTool& tool, ToolRow* row, int token) {
    if (!tool.tok) return;
    if (token == tool.python_start) {
        row->in_python = true;
        row->expr.clear();
    } else if (token == tool.python_end && row->in_python) {
        row->in_python = false;
        std::string result;
        if (!row->expr.empty() && calculator_eval(tokenizer_decode(tool.tok, row->expr.data(), row->expr.size()), &result)) {
            std::vector<int> output = {tool.output_start};
            const std::vector<int> ids = tokenizer_encode(tool.tok, result);
            output.insert(output.end(), ids.begin(), ids.end());
            output.push_back(tool.output_end);
            row->forced.assign(output.rbegin(), output.rend());
        }
        row->expr.clear();
    } else if (row->in_python) {
        row->expr.push_back(token);
    }
}

