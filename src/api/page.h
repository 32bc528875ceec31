/* page.h - the built-in chat page (page.html, embedded by page.c), served at GET /. */
#ifndef STRATA_API_PAGE_H
#define STRATA_API_PAGE_H

#include <stddef.h>

/* The page's bytes (static, NUL after the last) and their count. */
const char *page_html(size_t *len);

#endif
