// calc: nanochat's calculator tool (chat/calculator.h: calculator_eval), for its tests (dev/data/test_calculator.py).
// make dev/data/bin/calc
//
//   dev/data/bin/calc < EXPRESSIONS
//
// Reads expressions from standard input, one a line (each ends at a '\n', which is not part of it; a last line
// without one counts too), and prints one line for each: the result, or the word None where there is none (a
// result is never the text None: it is a number). Any argument, or unreadable input: one "error: ..." line, exit 1.
#include <cstdio>
#include <string>
#include "chat/calculator.h"

int main(int argc, char** argv) {
    if (argc > 1) {
        fprintf(stderr, "error: calc takes no arguments, got '%s' (usage: calc < EXPRESSIONS)\n", argv[1]);
        return 1;
    }
    std::string line, result;
    int c;
    do {
        c = getchar();
        if (c != EOF && c != '\n') {
            line += (char)c;
            continue;
        }
        if (c == '\n' || !line.empty()) {  // (input that ends with '\n' has no empty line after it)
            puts(calculator_eval(line, &result) ? result.c_str() : "None");
            line.clear();
        }
    } while (c != EOF);
    if (ferror(stdin)) {
        fprintf(stderr, "error: cannot read standard input\n");
        return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
