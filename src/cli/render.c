/* render.c - `strata render --model DIR`: reads an OpenAI chat request (JSON) on stdin and
 * prints the prompt the chat template makes of it, exactly (no newline added). The template
 * comes from DIR/chat_template.jinja or DIR/tokenizer_config.json (see chat.h); DIR defaults to
 * the bundled demo model. A request the template refuses prints its refusal and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "cli.h"

int cmd_render(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            dir = argv[++i];
        } else {
            fprintf(stderr, "usage: strata render [--model DIR] < request.json\n");
            return 2;
        }
    }
    if (!dir) dir = cli_default_model_dir();
    struct error err;
    struct chat_template t;
    if (chat_template_load(&t, dir, &err) < 0) {
        fprintf(stderr, "strata render: %s\n", err.msg);
        return 1;
    }
    json_error_t jerr;
    json_t *req = json_loadf(stdin, 0, &jerr);
    if (!req) {
        fprintf(stderr, "strata render: request on stdin: line %d column %d: %s\n", jerr.line,
                jerr.column, jerr.text);
        return 1;
    }
    char *prompt;
    int rc = chat_render(&t, req, &prompt, &err);
    json_decref(req);
    if (rc < 0) {
        fprintf(stderr, "strata render: %s\n", err.msg);
        return 1;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    free(prompt);
    return fflush(stdout) == 0 ? 0 : 1;
}
