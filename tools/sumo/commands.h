/*
 * The subcommands of the `sumo` tool. Each lives in its own file under tools/sumo/ and is
 * reached through the table in main.c: adding one is a declaration here and a line there.
 *
 * An entry point gets the subcommand's own argument vector (argv[0] is its name, e.g.
 * "bench") and returns the process exit status: 0 on success, 1 when the work failed, 2 on a
 * usage error. Given "--help" it prints its usage on stdout and returns 0, which is what
 * `sumo help NAME` relies on.
 */
#ifndef SUMO_TOOL_COMMANDS_H
#define SUMO_TOOL_COMMANDS_H

#include <stdio.h>

int sumo_cmd_bench(int argc, char **argv);
int sumo_cmd_train(int argc, char **argv);
int sumo_cmd_environment(int argc, char **argv);

/* The environment variables sumo reads, a line each, for `sumo --help` (environment.c). */
void sumo_print_settings_short(FILE *out);

#endif
