// Host test of the config parser: `cc -Wall -o /tmp/t test_config.c config.c && /tmp/t`.
#include <stdio.h>
#include <string.h>

#include "config.h"

static int failures;

// Parses `json` and checks the result: `want_ok` with `want_value`, else `want_err`.
static void check(const char *json, int want_ok, uint32_t want_value, const char *want_err) {
    char err[CONFIG_ERROR_CAP];
    uint32_t v = 0;
    int ok = parse_min_tokens_config((const uint8_t *)json, strlen(json), &v, err);
    int good = want_ok ? (ok && v == want_value) : (!ok && strcmp(err, want_err) == 0);
    if (!good) {
        failures++;
        printf("FAIL %s -> ok=%d v=%u err=%s\n", json, ok, v, ok ? "" : err);
    }
}

int main(void) {
    check("{\"min_tokens\": 5}", 1, 5, NULL);
    check(" { \"min_tokens\" :1000000 } ", 1, 1000000, NULL);
    check("{\"min\\u005ftokens\": 7}", 1, 7, NULL);
    check("{\"min_tokens\": 0}", 0, 0, "min_tokens: must be an integer from 1 to 1000000, got 0");
    check("{\"min_tokens\": 1000001}", 0, 0,
          "min_tokens: must be an integer from 1 to 1000000, got 1000001");
    check("{\"min_tokens\": 99999999999999999999999}", 0, 0,
          "min_tokens: must be an integer from 1 to 1000000, got 99999999999999999999999");
    check("{\"min_tokens\": -3}", 0, 0, "min_tokens: must be an integer from 1 to 1000000, got -3");
    check("{\"min_tokens\": 2.5}", 0, 0, "min_tokens: must be an integer from 1 to 1000000, got 2.5");
    check("{\"min_tokens\": 1e3}", 0, 0, "min_tokens: must be an integer from 1 to 1000000, got 1e3");
    check("{\"min_tokens\": \"5\"}", 0, 0,
          "min_tokens: must be an integer from 1 to 1000000, got \"5\"");
    check("{\"min_tokens\": [1, {\"a\": null}]}", 0, 0,
          "min_tokens: must be an integer from 1 to 1000000, got [1, {\"a\": null}]");
    check("{}", 0, 0, "min_tokens: required, an integer from 1 to 1000000");
    check("{\"min_tokens\": 3, \"max\": 1}", 0, 0, "max: unknown field (known fields: min_tokens)");
    check("{\"min_tokens\": 3, \"min_tokens\": 4}", 0, 0, "min_tokens: given more than once");
    check("[1]", 0, 0, "config: must be a JSON object, got [1]");
    check("", 0, 0, "config: not valid JSON (expected a JSON value at byte 0)");
    check("{\"min_tokens\": 3,}", 0, 0, "config: not valid JSON (expected a string key at byte 17)");
    check("{\"min_tokens\": 03}", 0, 0, "config: not valid JSON (expected ',' or '}' at byte 16)");
    check("{\"min_tokens\": 3} x", 0, 0,
          "config: not valid JSON (expected the end of the input at byte 18)");
    check("{\"a\\ud800\": 1}", 0, 0, "config: not valid JSON (expected a low surrogate escape at byte 9)");
    check("{\"\\ud83d\\ude00\": 1}", 0, 0, "\xF0\x9F\x98\x80: unknown field (known fields: min_tokens)");
    check("{\"min_tokens\": 01}", 0, 0, "config: not valid JSON (expected ',' or '}' at byte 16)");
    check("{\"min_tokens\": tru}", 0, 0, "config: not valid JSON (expected a JSON value at byte 18)");
    check("{\"a\tb\": 1}", 0, 0, "config: not valid JSON (expected an escaped control character at byte 3)");
    if (failures == 0) {
        printf("all config tests passed\n");
    }
    return failures != 0;
}
