/* cw_parse_size: the one size grammar ("256MiB", "1.5gib", "1e9", "unlimited"), shared by
 * cw-vae and the Python package so a budget means the same wherever it is written. Parsed
 * by hand, not strtod: strtod follows the locale's decimal point and takes hex and inf. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "convweave/convweave.h"

static int cw__is_space(char c) { return c == ' ' || c == '\t'; }
static int cw__is_digit(char c) { return c >= '0' && c <= '9'; }

cw_status cw_parse_size(const char *s, int64_t *out_bytes) {
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
        {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    if (!s || !out_bytes) return CW_ERR_INVALID_ARG;
    while (cw__is_space(*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && cw__is_space(s[n - 1])) n--;
    if ((n == 9 && !strncasecmp(s, "unlimited", 9)) || (n == 4 && !strncasecmp(s, "none", 4))) {
        *out_bytes = -1;
        return CW_OK;
    }
    /* mantissa: digits [. digits], at least one digit; kept as an integer and a power of 10 */
    const char *p = s, *end = s + n;
    double mant = 0;
    int exp10 = 0, digits = 0;
    for (; p < end && cw__is_digit(*p); p++, digits++)
        if (digits < 19) mant = mant * 10 + (*p - '0');
        else exp10++;
    if (p < end && *p == '.') {
        for (p++; p < end && cw__is_digit(*p); p++, digits++)
            if (digits < 19) mant = mant * 10 + (*p - '0'), exp10--;
    }
    if (digits == 0) return CW_ERR_INVALID_ARG;
    if (p < end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        int sign = 1, e = 0, ed = 0;
        if (q < end && (*q == '+' || *q == '-')) sign = *q++ == '-' ? -1 : 1;
        for (; q < end && cw__is_digit(*q); q++, ed++)
            if (e < 10000) e = e * 10 + (*q - '0');
        if (ed == 0) return CW_ERR_INVALID_ARG; /* "1e" or "1eb": no exponent */
        exp10 += sign * e;
        p = q;
    }
    while (p < end && cw__is_space(*p)) p++;
    const size_t ulen = (size_t)(end - p);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].unit) != ulen || strncasecmp(p, units[i].unit, ulen)) continue;
        double v = mant == 0 ? 0 : mant * pow(10.0, exp10) * units[i].mult;
        if (!(v < 9223372036854775808.0)) return CW_ERR_INVALID_ARG; /* 2^63: beyond int64_t */
        *out_bytes = (int64_t)llround(v);
        return CW_OK;
    }
    return CW_ERR_INVALID_ARG;
}
