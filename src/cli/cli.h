/* cli.h - the strata subcommands. Each returns the process exit status. main.c dispatches. */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

int cmd_run(int argc, char **argv);      /* main.c: generate from ids or a prompt */
int cmd_info(int argc, char **argv);     /* main.c: config, sizes, memory */
int cmd_tokenize(int argc, char **argv); /* tokenize.c: text <-> ids */
int cmd_render(int argc, char **argv);   /* render.c: chat request -> prompt text */
int cmd_serve(int argc, char **argv);    /* serve.c: the OpenAI-compatible HTTP server */
int cmd_bench(int argc, char **argv);    /* bench.c: llama-bench style measurements */

/* A numeric option: v as an integer in [lo, hi], or a message naming the command and the flag
 * ("strata serve: --port must be an integer from 0 to 65535 (got 'abc')") and -1. */
int cli_int(const char *cmd, const char *flag, const char *v, int lo, int hi, int *out);

/* The model directory used when --model is not given: the bundled demo model. */
const char *cli_default_model_dir(void);

#endif
