/* test_util.c — compiler/util/util.c: SHA-256 hex against the FIPS 180-2 vectors, hex of
 * arbitrary bytes, and a clock that is monotonic and measures a known sleep. */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "compiler/util/util.h"

Test(util, sha256_hex_matches_the_standard_vectors)
{
    char hex[65];
    cr_assert_eq(tlm_sha256_hex("abc", 3, hex), 0);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    cr_assert_eq(tlm_sha256_hex("", 0, hex), 0);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    static const char two_blocks[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    cr_assert_eq(tlm_sha256_hex(two_blocks, strlen(two_blocks), hex), 0);
    cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    uint8_t md[32];
    cr_assert_eq(tlm_sha256("abc", 3, md), 0);
    cr_assert_eq(md[0], 0xba);
    cr_assert_eq(md[31], 0xad);
}

Test(util, hex_of_every_byte_value)
{
    uint8_t b[256];
    for (int i = 0; i < 256; i++)
        b[i] = (uint8_t)i;
    char out[513];
    memset(out, 'x', sizeof out);
    tlm_hex(b, sizeof b, out);
    cr_assert_eq(strlen(out), 512);
    cr_assert_eq(strncmp(out, "000102", 6), 0);
    cr_assert_eq(strncmp(out + 2 * 0x9f, "9fa0", 4), 0);
    cr_assert_str_eq(out + 506, "fdfeff");
    tlm_hex(b, 0, out);
    cr_assert_str_eq(out, "");
}

Test(util, monotonic_clock_measures_a_sleep)
{
    double s0 = tlm_now_s();
    int64_t n0 = tlm_now_ns();
    usleep(20000);
    double s1 = tlm_now_s();
    int64_t n1 = tlm_now_ns();
    cr_assert(s1 - s0 >= 0.019 && s1 - s0 < 5, "%g", s1 - s0);
    cr_assert(n1 - n0 >= 19000000 && n1 - n0 < 5000000000LL, "%lld", (long long)(n1 - n0));
    /* the two clocks are the same clock */
    cr_assert(((double)n1 * 1e-9 - s1) < 1e-3 && (s1 - (double)n1 * 1e-9) < 1e-3);
}
