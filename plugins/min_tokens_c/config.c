// A tiny strict JSON parser for the flat config object of the `min_tokens` plugin.
//
// Two passes: the first checks that the whole input is one valid JSON value (RFC 8259
// grammar, nesting at most 64 deep); the second walks the top-level object and checks
// its fields. Error messages name the field, the bound and the value given, e.g.
// `min_tokens: must be an integer from 1 to 1000000, got 0`.
#include "config.h"

#include <stdbool.h>

// Deepest nesting of arrays/objects accepted in a value.
#define MAX_DEPTH 64
// Longest rendering of a rejected value or key in a message, in bytes.
#define SHOW_MAX 80

// The input and a read position.
typedef struct {
    const uint8_t *s;
    size_t len;
    size_t pos;
} parser_t;

// An error message being built in a fixed buffer (always NUL-terminated, truncated).
typedef struct {
    char *buf;
    size_t len;
} msg_t;

// Appends `n` bytes to the message, dropping what does not fit.
static void msg_bytes(msg_t *m, const uint8_t *bytes, size_t n) {
    for (size_t i = 0; i < n && m->len + 1 < CONFIG_ERROR_CAP; i++) {
        m->buf[m->len++] = (char)bytes[i];
    }
    m->buf[m->len] = '\0';
}

// Appends a NUL-terminated string.
static void msg_str(msg_t *m, const char *s) {
    size_t n = 0;
    while (s[n] != '\0') {
        n++;
    }
    msg_bytes(m, (const uint8_t *)s, n);
}

// Appends an unsigned integer in decimal.
static void msg_u64(msg_t *m, uint64_t v) {
    char digits[24];
    size_t n = 0;
    do {
        digits[sizeof digits - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    msg_bytes(m, (const uint8_t *)digits + sizeof digits - n, n);
}

// Appends (valid UTF-8) input text, cut at a character boundary after SHOW_MAX bytes.
static void msg_show(msg_t *m, const uint8_t *text, size_t n) {
    if (n <= SHOW_MAX) {
        msg_bytes(m, text, n);
        return;
    }
    size_t cut = SHOW_MAX;
    while (cut > 0 && (text[cut] & 0xC0) == 0x80) {
        cut--;
    }
    msg_bytes(m, text, cut);
    msg_str(m, "\xE2\x80\xA6"); // U+2026 HORIZONTAL ELLIPSIS
}

// Starts a message in `err`.
static msg_t msg_start(char *err) {
    msg_t m = {err, 0};
    err[0] = '\0';
    return m;
}

// Reports a syntax error at the current position; returns 0.
static int syntax_error(const parser_t *p, const char *expected, char *err) {
    msg_t m = msg_start(err);
    msg_str(&m, "config: not valid JSON (expected ");
    msg_str(&m, expected);
    msg_str(&m, " at byte ");
    msg_u64(&m, p->pos);
    msg_str(&m, ")");
    return 0;
}

// The byte at the read position, or -1 at the end.
static int peek(const parser_t *p) {
    return p->pos < p->len ? p->s[p->pos] : -1;
}

// Skips JSON whitespace.
static void skip_ws(parser_t *p) {
    while (p->pos < p->len) {
        uint8_t c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            break;
        }
        p->pos++;
    }
}

// Whether the byte at the read position is an ASCII digit.
static bool at_digit(const parser_t *p) {
    int c = peek(p);
    return c >= '0' && c <= '9';
}

// Reads 4 hex digits of a `\u` escape.
static int hex4(parser_t *p, uint32_t *out, char *err) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int c = peek(p);
        uint32_t d;
        if (c >= '0' && c <= '9') {
            d = (uint32_t)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            d = (uint32_t)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            d = (uint32_t)(c - 'A' + 10);
        } else {
            return syntax_error(p, "a hex digit", err);
        }
        v = v * 16 + d;
        p->pos++;
    }
    *out = v;
    return 1;
}

// Appends code point `cp` as UTF-8 to `out` (capacity `cap`, length `*n`); sets
// `*truncated` when it does not fit.
static void put_utf8(uint8_t *out, size_t cap, size_t *n, bool *truncated, uint32_t cp) {
    uint8_t b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        k = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (cp & 0x3F));
        k = 4;
    }
    if (out == NULL || *n + k > cap) {
        *truncated = true;
        return;
    }
    for (size_t i = 0; i < k; i++) {
        out[(*n)++] = b[i];
    }
}

// Parses a string at the read position (which is at its opening quote). The decoded
// text goes to `out` (if not NULL) up to `cap` bytes; `*truncated` tells whether it
// was cut.
static int parse_string(parser_t *p, uint8_t *out, size_t cap, size_t *out_len,
                        bool *truncated, char *err) {
    size_t n = 0;
    *truncated = false;
    p->pos++; // the opening quote
    for (;;) {
        int c = peek(p);
        if (c < 0) {
            return syntax_error(p, "a closing '\"'", err);
        }
        p->pos++;
        if (c == '"') {
            break;
        }
        if (c < 0x20) {
            p->pos--;
            return syntax_error(p, "an escaped control character", err);
        }
        uint32_t cp = (uint32_t)c;
        if (c == '\\') {
            int e = peek(p);
            p->pos++;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (!hex4(p, &cp, err)) {
                    return 0;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t low;
                    if (peek(p) != '\\' || p->pos + 1 >= p->len || p->s[p->pos + 1] != 'u') {
                        return syntax_error(p, "a low surrogate escape", err);
                    }
                    p->pos += 2;
                    if (!hex4(p, &low, err)) {
                        return 0;
                    }
                    if (low < 0xDC00 || low > 0xDFFF) {
                        p->pos -= 4;
                        return syntax_error(p, "a low surrogate escape", err);
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    p->pos -= 4;
                    return syntax_error(p, "a high surrogate first", err);
                }
                break;
            default:
                p->pos--;
                return syntax_error(p, "a valid escape", err);
            }
            put_utf8(out, cap, &n, truncated, cp);
        } else if (out != NULL && n < cap) {
            out[n++] = (uint8_t)c; // raw bytes of (valid UTF-8) input
        } else {
            *truncated = true;
        }
    }
    if (out_len != NULL) {
        *out_len = n;
    }
    return 1;
}

// Parses a number at the read position (RFC 8259 grammar).
static int parse_number(parser_t *p, char *err) {
    if (peek(p) == '-') {
        p->pos++;
    }
    if (peek(p) == '0') {
        p->pos++;
    } else if (at_digit(p)) {
        while (at_digit(p)) {
            p->pos++;
        }
    } else {
        return syntax_error(p, "a digit", err);
    }
    if (peek(p) == '.') {
        p->pos++;
        if (!at_digit(p)) {
            return syntax_error(p, "a digit", err);
        }
        while (at_digit(p)) {
            p->pos++;
        }
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-') {
            p->pos++;
        }
        if (!at_digit(p)) {
            return syntax_error(p, "a digit", err);
        }
        while (at_digit(p)) {
            p->pos++;
        }
    }
    return 1;
}

// Parses the literal `word` (true, false or null) at the read position.
static int parse_literal(parser_t *p, const char *word, char *err) {
    for (size_t i = 0; word[i] != '\0'; i++) {
        if (peek(p) != (uint8_t)word[i]) {
            return syntax_error(p, "a JSON value", err);
        }
        p->pos++;
    }
    return 1;
}

// Checks one JSON value at the read position and moves past it.
static int skip_value(parser_t *p, int depth, char *err) {
    bool truncated;
    skip_ws(p);
    int c = peek(p);
    if (c == '{' || c == '[') {
        if (depth >= MAX_DEPTH) {
            return syntax_error(p, "less nesting", err);
        }
        int close = c == '{' ? '}' : ']';
        p->pos++;
        skip_ws(p);
        if (peek(p) == close) {
            p->pos++;
            return 1;
        }
        for (;;) {
            if (close == '}') {
                skip_ws(p);
                if (peek(p) != '"') {
                    return syntax_error(p, "a string key", err);
                }
                if (!parse_string(p, NULL, 0, NULL, &truncated, err)) {
                    return 0;
                }
                skip_ws(p);
                if (peek(p) != ':') {
                    return syntax_error(p, "':'", err);
                }
                p->pos++;
            }
            if (!skip_value(p, depth + 1, err)) {
                return 0;
            }
            skip_ws(p);
            if (peek(p) == ',') {
                p->pos++;
            } else if (peek(p) == close) {
                p->pos++;
                return 1;
            } else {
                return syntax_error(p, close == '}' ? "',' or '}'" : "',' or ']'", err);
            }
        }
    }
    if (c == '"') {
        return parse_string(p, NULL, 0, NULL, &truncated, err);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        return parse_number(p, err);
    }
    if (c == 't') {
        return parse_literal(p, "true", err);
    }
    if (c == 'f') {
        return parse_literal(p, "false", err);
    }
    if (c == 'n') {
        return parse_literal(p, "null", err);
    }
    return syntax_error(p, "a JSON value", err);
}

// Whether the decoded key equals the NUL-terminated `name`.
static bool key_is(const uint8_t *key, size_t len, bool truncated, const char *name) {
    size_t i = 0;
    for (; i < len; i++) {
        if (name[i] == '\0' || (uint8_t)name[i] != key[i]) {
            return false;
        }
    }
    return !truncated && name[i] == '\0';
}

// Checks the `min_tokens` value spanning `text[0..n]` (valid JSON) and stores it.
static int check_min_tokens(const uint8_t *text, size_t n, uint32_t *out, char *err) {
    uint64_t v = 0;
    bool integer = n > 0;
    for (size_t i = 0; i < n && integer; i++) {
        if (text[i] < '0' || text[i] > '9') {
            integer = false; // sign, fraction, exponent or not a number at all
        } else if (v <= MIN_TOKENS_HIGHEST) {
            v = v * 10 + (uint64_t)(text[i] - '0');
        }
    }
    if (integer && v >= MIN_TOKENS_LOWEST && v <= MIN_TOKENS_HIGHEST) {
        *out = (uint32_t)v;
        return 1;
    }
    msg_t m = msg_start(err);
    msg_str(&m, "min_tokens: must be an integer from ");
    msg_u64(&m, MIN_TOKENS_LOWEST);
    msg_str(&m, " to ");
    msg_u64(&m, MIN_TOKENS_HIGHEST);
    msg_str(&m, ", got ");
    msg_show(&m, text, n);
    return 0;
}

int parse_min_tokens_config(const uint8_t *json, size_t len, uint32_t *min_tokens,
                            char err[CONFIG_ERROR_CAP]) {
    parser_t p = {json, len, 0};
    // Pass 1: one valid JSON value and nothing after it.
    if (!skip_value(&p, 0, err)) {
        return 0;
    }
    skip_ws(&p);
    if (p.pos != p.len) {
        return syntax_error(&p, "the end of the input", err);
    }
    // Pass 2: the fields of the top-level object.
    p.pos = 0;
    skip_ws(&p);
    if (peek(&p) != '{') {
        size_t start = p.pos;
        (void)skip_value(&p, 0, err);
        msg_t m = msg_start(err);
        msg_str(&m, "config: must be a JSON object, got ");
        msg_show(&m, json + start, p.pos - start);
        return 0;
    }
    p.pos++;
    bool have = false;
    for (;;) {
        skip_ws(&p);
        if (peek(&p) == '}') {
            break;
        }
        if (peek(&p) == ',') {
            p.pos++;
            skip_ws(&p);
        }
        uint8_t key[64];
        size_t key_len = 0;
        bool truncated = false;
        size_t key_start = p.pos + 1;
        (void)parse_string(&p, key, sizeof key, &key_len, &truncated, err);
        size_t key_end = p.pos - 1;
        skip_ws(&p);
        p.pos++; // ':'
        skip_ws(&p);
        if (!key_is(key, key_len, truncated, "min_tokens")) {
            msg_t m = msg_start(err);
            if (truncated) { // longer than `key`: show the raw (escaped) text
                msg_show(&m, json + key_start, key_end - key_start);
            } else {
                msg_show(&m, key, key_len);
            }
            msg_str(&m, ": unknown field (known fields: min_tokens)");
            return 0;
        }
        if (have) {
            msg_t m = msg_start(err);
            msg_str(&m, "min_tokens: given more than once");
            return 0;
        }
        size_t value_start = p.pos;
        (void)skip_value(&p, 0, err);
        if (!check_min_tokens(json + value_start, p.pos - value_start, min_tokens, err)) {
            return 0;
        }
        have = true;
    }
    if (!have) {
        msg_t m = msg_start(err);
        msg_str(&m, "min_tokens: required, an integer from ");
        msg_u64(&m, MIN_TOKENS_LOWEST);
        msg_str(&m, " to ");
        msg_u64(&m, MIN_TOKENS_HIGHEST);
        return 0;
    }
    err[0] = '\0';
    return 1;
}
