/* harness.h - the tiny test harness every tests/test_*.c uses: EXPECT counts a pass or a
 * failure (printing file:line and a message), and TEST_DONE prints "N passed, N failed" and
 * returns the exit status. */
#ifndef STRATA_HARNESS_H
#define STRATA_HARNESS_H

#include <stdio.h>

static int test_passed, test_failed;

#define EXPECT(cond, ...)                                                                      \
    do {                                                                                       \
        if (cond) {                                                                            \
            test_passed++;                                                                     \
        } else {                                                                               \
            test_failed++;                                                                     \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

#define TEST_DONE()                                                                            \
    (printf("%d passed, %d failed\n", test_passed, test_failed), test_failed ? 1 : 0)

#endif
