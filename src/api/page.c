/* page.c - the chat page served at / (page.html), embedded in the binary by the assembler's
 * .incbin: no generated source, no tool beyond the compiler. The path is relative to the
 * repository root, where make runs; the Makefile rebuilds page.o when page.html changes. */
#include "page.h"

__asm__(".section .rodata\n"
        ".balign 16\n"
        ".globl strata_page_html\n"
        "strata_page_html:\n"
        ".incbin \"src/api/page.html\"\n"
        ".globl strata_page_html_end\n"
        "strata_page_html_end:\n"
        ".byte 0\n"
        ".previous\n");

extern const char strata_page_html[], strata_page_html_end[];

const char *page_html(size_t *len) {
    *len = (size_t)(strata_page_html_end - strata_page_html);
    return strata_page_html;
}
