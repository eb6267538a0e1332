// calc: nanochat's calculator tool (chat/calculator.h: calculator_eval), for its tests (dev/data/test_calculator.py).
// make dev/data/bin/calc
//
//   dev/data/bin/calc [--tagged] < EXPRESSIONS
//
// Reads expressions from standard input, one a line (each ends at a '\n'; nothing else is removed), and
// prints one line for each: str() of the result, or the word None where nanochat's use_calculator gives
// None. --tagged: a result is printed after '=' ("=5.0", "=None" for the string 'None'), and None is
// printed as Unsupported where it comes from something chat/calculator.h does not implement (Python might
// give a value there; see the top of chat/calculator.h). Any bad argument: one "error: ..." line, exit 1.
#include <cstdio>
#include <cstring>
#include <string>
#include "chat/calculator.h"

int main(int argc, char** argv) {
    bool tagged = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tagged") == 0) {
            tagged = true;
        } else {
            fprintf(stderr, "error: unknown argument '%s' (usage: calc [--tagged] < EXPRESSIONS)\n", argv[i]);
            return 1;
        }
    }
    std::string line, out;
    auto emit = [&]() {
        bool unsupported = false;
        if (calculator_eval(line, &out, &unsupported)) printf("%s%s\n", tagged ? "=" : "", out.c_str());
        else puts(tagged && unsupported ? "Unsupported" : "None");
        line.clear();
    };
    int c;
    bool pending = false;
    while ((c = getchar()) != EOF) {
        if (c == '\n') {
            emit();
            pending = false;
        } else {
            line += (char)c;
            pending = true;
        }
    }
    if (pending) emit();  // a last line without '\n'
    if (ferror(stdin)) {
        fprintf(stderr, "error: cannot read standard input\n");
        return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
