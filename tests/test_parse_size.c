/* cw_parse_size, the one size grammar of cw-vae and the Python package: units in any case,
 * exponents, spaces, "unlimited"; signs, hex, inf, NaN, unknown units and 2^63 refused with
 * the output untouched. */
#include "convweave/convweave.h"
#include "testutil.h"

static void ok(const char *s, int64_t want) {
    int64_t got = 12345;
    cw_status st = cw_parse_size(s, &got);
    if (st != CW_OK || got != want)
        fprintf(stderr, "cw_parse_size(\"%s\"): status %s, %lld bytes; expected %lld\n", s, cw_status_name(st),
                (long long)got, (long long)want);
    CHECK(st == CW_OK && got == want);
}

static void bad(const char *s) {
    int64_t got = 12345;
    cw_status st = cw_parse_size(s, &got);
    if (st != CW_ERR_INVALID_ARG || got != 12345)
        fprintf(stderr, "cw_parse_size(\"%s\"): status %s, %lld bytes; expected CW_ERR_INVALID_ARG\n", s,
                cw_status_name(st), (long long)got);
    CHECK(st == CW_ERR_INVALID_ARG && got == 12345);
}

int main(void) {
    ok("0", 0);
    ok("1048576", 1048576);
    ok("256MiB", 256ll << 20);
    ok("256mib", 256ll << 20);
    ok("256MIB", 256ll << 20);
    ok(" 256 MiB ", 256ll << 20);
    ok("1.5GiB", 3ll << 29);
    ok("1.5gib", 3ll << 29);
    ok("64MB", 64000000);
    ok("64mb", 64000000);
    ok("2kib", 2048);
    ok("2KB", 2000);
    ok("1TiB", 1ll << 40);
    ok("3tb", 3000000000000ll);
    ok("10b", 10);
    ok("1e9", 1000000000);
    ok("1E9", 1000000000);
    ok("1e+3KiB", 1024000);
    ok("2.5e-1KiB", 256);
    ok(".5MiB", 1 << 19);
    ok("5.MiB", 5 << 20);
    ok("1.5", 2); /* rounded to whole bytes */
    ok("12345678901234567890e-10", 1234567890);
    ok("unlimited", -1);
    ok("Unlimited", -1);
    ok("NONE", -1);
    ok("8589934591GiB", 9223372035781033984ll);
    bad("");
    bad("   ");
    bad("-1");
    bad("+1");
    bad("-1MiB");
    bad("0x10");
    bad("inf");
    bad("nan");
    bad("MiB");
    bad(".");
    bad("1e");
    bad("1eMiB");
    bad("1 e9");
    bad("1..5");
    bad("12 34");
    bad("256 MiBs");
    bad("256M");
    bad("256 Mi B");
    bad("8EiB");
    bad("8589934592GiB"); /* 2^63 */
    bad("1e400");
    bad("unlimitedx");
    bad(NULL);
    ASSERT_STATUS(cw_parse_size("1", NULL), CW_ERR_INVALID_ARG);
    TEST_DONE();
}
