// calculator.h: nanochat's calculator tool (nanochat/engine.py: use_calculator, eval_with_timeout) in C++, for
// the tool calls its chat data makes.
//
//   static inline bool calculator_eval(const std::string& expr, std::string* result);
//
// The chat model writes <|python_start|> expr <|python_end|>; the engine (chat/tool.h) evaluates expr and, when
// there is a result, feeds <|output_start|> result <|output_end|> back. calculator_eval returns false for "no
// result", else true with *result = the text nanochat would feed back. nanochat's rules, in order:
//  1. every ',' is removed (thousands separators: "1,200*3" is 3600);
//  2. if every character is one of "0123456789*+-/.() ": no result if "**" occurs, else Python's
//     eval(expr, {"__builtins__": {}}, {}) with a 3 s timeout;
//  3. else every character must be a letter, a digit or one of ' " ( ) . _ and space; no result if the lowercased
//     expr contains any of __ import exec eval compile open file input raw_input globals locals vars dir getattr
//     setattr delattr hasattr (inside string literals too: 'opening'.count('n') gets none), or if ".count("
//     does not occur; else eval as in 2;
//  4. an exception (a syntax error, a division by zero, the timeout) gives no result, a value gives str(value).
// So % and ^ never get a result (they are in neither character set), nor does a power.
//
// nanochat's tool calls are GSM8K's calculator annotations (<<48/2=24>>: arithmetic on ints and decimals) and
// SpellingBee's check ('strawberry'.count('r')). This file evaluates exactly those two forms, as Python does:
//  * rule 2: int and decimal literals (12, 007.5, .5, 5.; an int with a leading zero, 012, is a SyntaxError),
//    binary + - * / //, unary + -, parentheses. Ints are exact, // floors, int / int is the correctly rounded
//    float, an int meeting a float becomes the correctly rounded float (OverflowError past 1.8e308), float
//    arithmetic is IEEE (overflow gives inf, not an error), division by zero raises. The text is the int's
//    digits or the float's repr (shortest round-trip digits; 1e-05, 1e+16, inf, nan, -0.0).
//  * rule 3: 'text'.count('sub') with single- or double-quoted literals (no prefix, spaces between the parts as
//    Python allows them): the number of non-overlapping occurrences of sub (len(text) + 1 for '').
// Everything else that passes the rules gets no result here, also where Python would give a value: the empty
// tuple () and Ellipsis ..., other methods, names, keywords, prefixed, triple-quoted or adjacent literals.
//
// Caps, so that no expression can take much memory or time (nanochat's only guard is its 3 s timeout; a
// 50-character join of two zfill(99999) strings once took this file 10 GB):
//  * MAX_CHARS: no result for an expression longer than 1000 characters after rule 1. An int written with k
//    characters is below 10^k, so ints stay under 1000 digits (Python's str() refuses over 4300) and under
//    MAX_LIMBS, strings under 1000 characters, and an expression takes at most a few milliseconds (the slowest
//    found: 1.4 ms for a 300-digit int floor-divided by 7 233 times). Python's 3 s timeout never triggers here.
//  * MAX_PARENS: no result past 100 nested parentheses. Up to there CPython's parser (3.10 to 3.13) takes any
//    1000-character expression; deeper it can run out of stack (MemoryError; the shallowest found: 192
//    parentheses around 615 minus signs), and it refuses 201 (SyntaxError). The parser here recurses once per
//    parenthesis, never per operator.
//  * MAX_LIMBS: no result for an int over 4096 bits (checked on every int made; cannot happen under MAX_CHARS).
// No exception leaves calculator_eval (std::bad_alloc included: no result).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <system_error>
#include <vector>

namespace calc_detail {

constexpr size_t MAX_CHARS = 1000;
constexpr int MAX_PARENS = 100;
constexpr size_t MAX_LIMBS = 128;

// Python raised, or the expression is out of scope or over a cap: no result
struct NoResult {};
[[noreturn]] static inline void no_result() { throw NoResult{}; }

// ------------------------------------------------------------------------------------------------
// ints: a sign and a magnitude of base 2^32 limbs, least significant first, no leading zero limbs

typedef std::vector<uint32_t> Mag;

struct Int {
    bool neg = false;
    Mag m;  // empty: zero
};

static inline void trim(Mag* a) {
    while (!a->empty() && a->back() == 0) a->pop_back();
}

// every int goes through here: the size cap, and no negative zero
static inline Int make_int(bool neg, Mag m) {
    trim(&m);
    if (m.size() > MAX_LIMBS) no_result();
    Int r;
    r.neg = neg && !m.empty();
    r.m = std::move(m);
    return r;
}

static inline int cmp_mag(const Mag& a, const Mag& b) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    for (size_t i = a.size(); i-- > 0;)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

static inline Mag add_mag(const Mag& a, const Mag& b) {
    Mag r(std::max(a.size(), b.size()) + 1, 0);
    uint64_t carry = 0;
    for (size_t i = 0; i + 1 < r.size(); i++) {
        uint64_t s = (uint64_t)(i < a.size() ? a[i] : 0) + (i < b.size() ? b[i] : 0) + carry;
        r[i] = (uint32_t)s;
        carry = s >> 32;
    }
    r.back() = (uint32_t)carry;
    trim(&r);
    return r;
}

// a -= b, for a >= b
static inline void sub_from(Mag* a, const Mag& b) {
    uint64_t borrow = 0;
    for (size_t i = 0; i < a->size(); i++) {
        uint64_t t = (uint64_t)(*a)[i] - (i < b.size() ? b[i] : 0) - borrow;  // wraps when it borrows
        (*a)[i] = (uint32_t)t;
        borrow = t >> 63;
    }
    trim(a);
}

static inline Int int_add(const Int& a, const Int& b) {
    if (a.neg == b.neg) return make_int(a.neg, add_mag(a.m, b.m));
    const bool a_bigger = cmp_mag(a.m, b.m) >= 0;
    Mag r = a_bigger ? a.m : b.m;
    sub_from(&r, a_bigger ? b.m : a.m);
    return make_int(a_bigger ? a.neg : b.neg, r);
}

static inline Int int_neg(Int a) {
    a.neg = !a.neg && !a.m.empty();
    return a;
}

static inline Int int_mul(const Int& a, const Int& b) {
    if (a.m.size() + b.m.size() > MAX_LIMBS + 1) no_result();  // before the work
    Mag r(a.m.size() + b.m.size(), 0);
    for (size_t i = 0; i < a.m.size(); i++) {
        uint64_t carry = 0;
        for (size_t j = 0; j < b.m.size(); j++) {
            uint64_t t = (uint64_t)a.m[i] * b.m[j] + r[i + j] + carry;
            r[i + j] = (uint32_t)t;
            carry = t >> 32;
        }
        r[i + b.m.size()] = (uint32_t)carry;
    }
    return make_int(a.neg != b.neg, r);
}

// q = a / b and r = a % b on magnitudes (b nonzero): long division, one bit of a at a time (the ints here
// have at most a few thousand bits, so this simple loop costs microseconds)
static inline void divmod_mag(const Mag& a, const Mag& b, Mag* q, Mag* r) {
    q->assign(a.size(), 0);
    r->clear();
    for (size_t bit = a.size() * 32; bit-- > 0;) {
        uint32_t carry = (a[bit / 32] >> (bit % 32)) & 1;  // r = 2 r + this bit of a
        for (uint32_t& limb : *r) {
            uint32_t out = limb >> 31;
            limb = (limb << 1) | carry;
            carry = out;
        }
        if (carry) r->push_back(carry);
        if (cmp_mag(*r, b) >= 0) {
            sub_from(r, b);
            (*q)[bit / 32] |= (uint32_t)1 << (bit % 32);
        }
    }
    trim(q);
}

// Python's a // b: the floor; ZeroDivisionError for b == 0
static inline Int int_floordiv(const Int& a, const Int& b) {
    if (b.m.empty()) no_result();
    Mag q, r;
    divmod_mag(a.m, b.m, &q, &r);
    const bool neg = a.neg != b.neg;
    if (neg && !r.empty()) q = add_mag(q, Mag{1});  // a negative quotient that is not exact rounds away from 0
    return make_int(neg, q);
}

static inline size_t bit_length(const Mag& a) { return a.empty() ? 0 : 32 * a.size() - __builtin_clz(a.back()); }

static inline Mag shift_left(const Mag& a, size_t bits) {
    Mag r(a.size() + bits / 32 + 1, 0);
    for (size_t i = 0; i < a.size(); i++) {
        uint64_t v = (uint64_t)a[i] << (bits % 32);
        r[i + bits / 32] |= (uint32_t)v;
        r[i + bits / 32 + 1] |= (uint32_t)(v >> 32);
    }
    trim(&r);
    return r;
}

// Python's a / b for ints (CPython's long_true_divide): the exact quotient correctly rounded to a double (half to
// even, subnormals included); ZeroDivisionError for b == 0, OverflowError when it rounds past the largest double.
// With b = 1 it is int-to-float conversion (PyLong_AsDouble), which rounds and overflows the same way.
static inline double int_truediv(const Int& a, const Int& b) {
    if (b.m.empty()) no_result();
    const bool neg = a.neg != b.neg;
    if (a.m.empty()) return neg ? -0.0 : 0.0;
    const long diff = (long)bit_length(a.m) - (long)bit_length(b.m);  // a / b is in [2^(diff-1), 2^(diff+1))
    if (diff >= 1025) no_result();                                      // >= 2^1024
    if (diff <= -1076) return neg ? -0.0 : 0.0;                         // < 2^-1075: rounds to 0
    // the quotient scaled by 2^shift has 55 or 56 bits: 53 to keep, and two more to round with (plus the rest)
    const long shift = 55 - diff;
    Mag q, r;
    divmod_mag(shift >= 0 ? shift_left(a.m, (size_t)shift) : a.m, shift < 0 ? shift_left(b.m, (size_t)-shift) : b.m, &q, &r);
    uint64_t qq = 0;
    for (size_t i = q.size(); i-- > 0;) qq = (qq << 32) | q[i];
    const long e = (64 - __builtin_clzll(qq)) - 1 - shift;  // a / b is in [2^e, 2^(e+1))
    const long last = std::max(e - 52, -1074L);              // the exponent of the last bit a double keeps
    const long drop = last + shift;                          // the bits of qq below it: at least 2
    uint64_t mant = 0;
    if (drop <= 60) {  // (more: qq < 2^56 is under half of the last bit, which rounds to 0)
        mant = qq >> drop;
        const uint64_t rest = qq & (((uint64_t)1 << drop) - 1), half = (uint64_t)1 << (drop - 1);
        if (rest > half || (rest == half && (!r.empty() || (mant & 1)))) mant++;
    }
    const double x = std::ldexp((double)mant, (int)last);
    if (std::isinf(x)) no_result();
    return neg ? -x : x;
}

static inline double int_to_double(const Int& a) {
    Int one;
    one.m.push_back(1);
    return int_truediv(a, one);
}

static inline Int int_from_digits(const char* s, size_t n) {
    Mag m;
    for (size_t i = 0; i < n; i++) {  // m = 10 m + digit
        uint64_t carry = (uint64_t)(s[i] - '0');
        for (uint32_t& limb : m) {
            uint64_t t = (uint64_t)limb * 10 + carry;
            limb = (uint32_t)t;
            carry = t >> 32;
        }
        if (carry) m.push_back((uint32_t)carry);
        if (m.size() > MAX_LIMBS) no_result();  // as it grows: a long literal costs no more than the cap
    }
    return make_int(false, m);
}

static inline std::string int_str(const Int& a) {
    std::string s;  // the digits, last first
    Mag cur = a.m;
    while (!cur.empty()) {
        uint64_t rem = 0;
        for (size_t i = cur.size(); i-- > 0;) {  // cur /= 10
            uint64_t t = (rem << 32) | cur[i];
            cur[i] = (uint32_t)(t / 10);
            rem = t % 10;
        }
        trim(&cur);
        s += (char)('0' + rem);
    }
    if (s.empty()) s = "0";
    if (a.neg) s += '-';
    std::reverse(s.begin(), s.end());
    return s;
}

// ------------------------------------------------------------------------------------------------
// floats

// Python's repr: the shortest digits that read back as x, in exponent form when the decimal exponent is below
// -4 or from 16 on (1e-05, 1.5e+16), else positional with at least one decimal (100.0, 0.0001)
static inline std::string float_repr(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    const std::string sign = std::signbit(x) ? "-" : "";
    if (x == 0) return sign + "0.0";
    char buf[64];
    // C++17's to_chars without a precision gives the shortest round-trip digits, as Python's repr
    char* end = std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::scientific).ptr;
    const char* e = std::find(buf, end, 'e');
    std::string digits;
    for (const char* p = buf; p < e; p++)
        if (*p != '.') digits += *p;
    int exp10 = 0;  // after 'e': a sign, then digits (to_chars writes no '\0')
    std::from_chars(e + 2, end, exp10);
    if (e[1] == '-') exp10 = -exp10;
    const int n = (int)digits.size();
    if (exp10 < -4 || exp10 >= 16) {
        std::string r = digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "");
        const int ae = std::abs(exp10);
        return sign + r + "e" + (exp10 < 0 ? "-" : "+") + (ae < 10 ? "0" : "") + std::to_string(ae);
    }
    if (exp10 < 0) return sign + "0." + std::string((size_t)(-exp10 - 1), '0') + digits;
    if (exp10 + 1 >= n) return sign + digits + std::string((size_t)(exp10 + 1 - n), '0') + ".0";
    return sign + digits.substr(0, (size_t)exp10 + 1) + "." + digits.substr((size_t)exp10 + 1);
}

// a literal of digits and one '.', correctly rounded as Python reads it: inf past the largest double, 0 below the
// smallest (from_chars reports both as out of range; it cannot be small when a digit before the '.' is nonzero)
static inline double float_from_literal(const char* s, size_t n) {
    double x = 0;
    if (std::from_chars(s, s + n, x).ec == std::errc()) return x;
    for (size_t i = 0; i < n && s[i] != '.'; i++)
        if (s[i] != '0') return HUGE_VAL;
    return 0.0;
}

// a // b for floats in CPython's steps (float_floor_div: through fmod), so that it rounds as CPython does
static inline double float_floordiv(double a, double b) {
    if (b == 0) no_result();  // ZeroDivisionError
    double mod = std::fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= 1.0;
    if (div == 0) return std::copysign(0.0, a / b);
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
}

// ------------------------------------------------------------------------------------------------
// rule 2: arithmetic

struct Num {
    bool is_float = false;
    Int i;
    double f = 0;
};

static inline Num num_int(Int i) {
    Num n;
    n.i = std::move(i);
    return n;
}

static inline Num num_float(double f) {
    Num n;
    n.is_float = true;
    n.f = f;
    return n;
}

static inline Num arith(char op, const Num& a, const Num& b) {  // op: + - * / and 'f' for //
    if (!a.is_float && !b.is_float) {
        switch (op) {
            case '+': return num_int(int_add(a.i, b.i));
            case '-': return num_int(int_add(a.i, int_neg(b.i)));
            case '*': return num_int(int_mul(a.i, b.i));
            case '/': return num_float(int_truediv(a.i, b.i));
            default: return num_int(int_floordiv(a.i, b.i));
        }
    }
    const double x = a.is_float ? a.f : int_to_double(a.i), y = b.is_float ? b.f : int_to_double(b.i);
    switch (op) {
        case '+': return num_float(x + y);
        case '-': return num_float(x - y);
        case '*': return num_float(x * y);
        case '/':
            if (y == 0) no_result();
            return num_float(x / y);
        default: return num_float(float_floordiv(x, y));
    }
}

static inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Python's grammar on the characters of rule 2, evaluated as it is parsed: all that matters is the value or
// whether Python raises, and any error (syntax or arithmetic) gives no result, so the first one ends it
struct Arith {
    const std::string& s;
    size_t pos = 0;
    int depth = 0;  // open parentheses

    char peek() {  // the next character after spaces; '\0' at the end (rule 2 lets no '\0' through)
        while (pos < s.size() && s[pos] == ' ') pos++;
        return pos < s.size() ? s[pos] : '\0';
    }

    // sum: term (('+' | '-') term)*
    Num sum() {
        Num v = term();
        for (char c = peek(); c == '+' || c == '-'; c = peek()) {
            pos++;
            v = arith(c, v, term());
        }
        return v;
    }

    // term: factor (('*' | '/' | '//') factor)*; "//" is one token only without a space inside
    Num term() {
        Num v = factor();
        for (char c = peek(); c == '*' || c == '/'; c = peek()) {
            pos++;
            if (c == '/' && pos < s.size() && s[pos] == '/') {
                pos++;
                c = 'f';
            }
            v = arith(c, v, factor());
        }
        return v;
    }

    // factor: ('+' | '-')* atom, binding tighter than * and / as in Python (-7//2 is -4). Only the number of
    // minus signs matters (+x is x, - -x is x), so a long run of them needs no recursion.
    Num factor() {
        bool negate = false;
        for (char c = peek(); c == '+' || c == '-'; c = peek()) {
            pos++;
            negate ^= c == '-';
        }
        Num v = atom();
        if (negate) {
            if (v.is_float) v.f = -v.f;
            else v.i = int_neg(v.i);
        }
        return v;
    }

    // atom: '(' sum ')' | number
    Num atom() {
        if (peek() == '(') {
            pos++;
            if (++depth > MAX_PARENS) no_result();
            if (peek() == ')') no_result();  // (): the empty tuple, out of scope
            Num v = sum();
            if (peek() != ')') no_result();
            pos++;
            depth--;
            return v;
        }
        return number();
    }

    // a number as CPython's tokenizer reads one from these characters: digits, then optionally a '.' and more
    // digits (12, 007.5, 5., .5). An int other than 0, 00, ... may not start with 0 (012: SyntaxError).
    Num number() {
        const size_t start = pos;
        while (pos < s.size() && is_digit(s[pos])) pos++;
        if (pos < s.size() && s[pos] == '.') {
            pos++;
            while (pos < s.size() && is_digit(s[pos])) pos++;
            if (pos - start == 1) no_result();  // a '.' alone: a SyntaxError, or the Ellipsis ... (out of scope)
            return num_float(float_from_literal(s.data() + start, pos - start));
        }
        if (pos == start) no_result();  // not a number: a SyntaxError
        if (s[start] == '0' && std::any_of(s.begin() + start, s.begin() + pos, [](char c) { return c != '0'; }))
            no_result();
        return num_int(int_from_digits(s.data() + start, pos - start));
    }
};

static inline std::string eval_arith(const std::string& expr) {
    Arith p{expr};
    Num v = p.sum();
    if (p.peek() != '\0') no_result();  // more after the expression: a SyntaxError
    return v.is_float ? float_repr(v.f) : int_str(v.i);
}

// ------------------------------------------------------------------------------------------------
// rule 3: 'text'.count('sub')

static inline std::string eval_count(const std::string& expr) {
    size_t pos = 0;
    auto skip_spaces = [&]() {
        while (pos < expr.size() && expr[pos] == ' ') pos++;
    };
    auto expect = [&](const char* token) {
        skip_spaces();
        const size_t n = std::strlen(token);
        if (expr.compare(pos, n, token) != 0) no_result();
        pos += n;
    };
    // a literal in single or double quotes without a prefix (rule 3 lets no backslash or newline through)
    auto literal = [&]() {
        skip_spaces();
        if (pos >= expr.size() || (expr[pos] != '\'' && expr[pos] != '"')) no_result();
        const size_t close = expr.find(expr[pos], pos + 1);
        if (close == std::string::npos) no_result();  // unterminated: a SyntaxError
        std::string text = expr.substr(pos + 1, close - pos - 1);
        pos = close + 1;
        return text;
    };
    const std::string text = literal();
    expect(".");
    expect("count");
    expect("(");
    const std::string sub = literal();
    expect(")");
    skip_spaces();
    if (pos != expr.size()) no_result();  // anything more is out of scope (or a SyntaxError)
    if (sub.empty()) return std::to_string(text.size() + 1);  // Python counts '' at every position and the end
    size_t n = 0;
    for (size_t at = text.find(sub); at != std::string::npos; at = text.find(sub, at + sub.size())) n++;
    return std::to_string(n);
}

// ------------------------------------------------------------------------------------------------

static inline bool all_in(const std::string& s, const char* set) {
    for (char c : s)
        if (c == '\0' || !std::strchr(set, c)) return false;
    return true;
}

}  // namespace calc_detail

// nanochat's use_calculator(expr) then str() of its value (see the top of this file): false for no result
static inline bool calculator_eval(const std::string& expr_in, std::string* result) {
    try {
        std::string expr;  // rule 1
        for (char c : expr_in)
            if (c != ',') expr += c;
        const bool arithmetic = calc_detail::all_in(expr, "0123456789*+-/.() ");
        if (arithmetic) {  // rule 2
            if (expr.find("**") != std::string::npos) return false;
        } else {  // rule 3
            if (!calc_detail::all_in(expr, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'\"()._ "))
                return false;
            std::string lower = expr;
            for (char& c : lower)
                if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
            static const char* const dangerous[] = {"__", "import", "exec", "eval", "compile", "open", "file",
                "input", "raw_input", "globals", "locals", "vars", "dir", "getattr", "setattr", "delattr", "hasattr"};
            for (const char* d : dangerous)
                if (lower.find(d) != std::string::npos) return false;
            if (expr.find(".count(") == std::string::npos) return false;
        }
        if (expr.size() > calc_detail::MAX_CHARS) return false;
        *result = arithmetic ? calc_detail::eval_arith(expr) : calc_detail::eval_count(expr);
        return true;
    } catch (const calc_detail::NoResult&) {
        return false;
    } catch (const std::bad_alloc&) {
        return false;
    }
}
