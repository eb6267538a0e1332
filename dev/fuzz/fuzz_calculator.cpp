// fuzz_calculator: any bytes as the expression of a calculator tool call (chat/calculator.h: calculator_eval, the
// tool chat generation calls on <|python_start|> expr <|python_end|>). The caps there (MAX_CHARS, MAX_PARENS,
// MAX_LIMBS) must bound every input: a finding is a sanitizer report, an allocation over -malloc_limit_mb, an
// input slower than -timeout, or a broken rule checked here:
//  * a result is a number as Python prints one (an int's digits, a float's repr, inf, nan), short enough for the
//    caps (at most MAX_CHARS + 1 characters: an int below 10^1000 and its sign);
//  * rule 1: the commas are removed first, so the expression without its commas gives the same answer;
//  * no result for an expression longer than MAX_CHARS once its commas are gone;
//  * the same input gives the same answer twice (nothing is kept between calls).
#include "dev/fuzz/fuzz_util.h"
#include "chat/calculator.h"

// What Python's str() of an int or a float can print: [-]digits, [-]digits.digits[e[+-]digits],
// [-]digits e[+-]digits, inf, -inf, nan.
static bool looks_like_python_number(const std::string& s) {
    size_t i = s[0] == '-' ? 1 : 0;
    if (s.compare(i, std::string::npos, "inf") == 0 || s == "nan") return true;
    auto digits = [&] {
        const size_t start = i;
        while (i < s.size() && isdigit((unsigned char)s[i])) i++;
        return i > start;
    };
    if (!digits()) return false;
    if (i < s.size() && s[i] == '.') {
        i++;
        if (!digits()) return false;
    }
    if (i < s.size() && s[i] == 'e') {
        i++;
        if (i >= s.size() || (s[i] != '+' && s[i] != '-')) return false;
        i++;
        if (!digits()) return false;
    }
    return i == s.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string expr((const char*)data, size);
    std::string result, again, without_commas;
    const bool has = calculator_eval(expr, &result);
    for (char c : expr)
        if (c != ',') without_commas += c;
    if (has && (result.empty() || result.size() > calc_detail::MAX_CHARS + 1 || !looks_like_python_number(result))) abort();
    if (has && without_commas.size() > calc_detail::MAX_CHARS) abort();
    if (calculator_eval(expr, &again) != has || (has && again != result)) abort();
    std::string plain;
    if (calculator_eval(without_commas, &plain) != has || (has && plain != result)) abort();
    g_fuzz_sink += result.size();
    return 0;
}
