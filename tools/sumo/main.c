/*
 * The `sumo` command: `sumo SUBCOMMAND [options]`. This file only dispatches; each subcommand
 * is a separate file declared in commands.h, so that people adding one never touch the others.
 */
#include "commands.h"

#include "sumo.h"

#include <stdio.h>
#include <string.h>

typedef struct sumo_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} sumo_command;

static int cmd_help(int argc, char **argv);

/* One line per subcommand, in the order `sumo help` lists them. */
static const sumo_command commands[] = {
    {"bench", "allreduce time and bandwidth per size, transport, rank count and op, against "
              "MPI_Allreduce and memory bandwidth",
     sumo_cmd_bench},
    {"train", "data-parallel training on Fashion-MNIST with any aggregation method; several "
              "methods are compared in one table",
     sumo_cmd_train},
    {"environment", "the environment variables sumo reads: what each accepts, its default and "
                    "what it does (--markdown: docs/settings.md's table)",
     sumo_cmd_environment},
    {"help", "list the subcommands, or show one's options: sumo help SUBCOMMAND", cmd_help},
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const sumo_command *find_command(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

static void list_commands(FILE *out)
{
    fprintf(out, "usage: sumo SUBCOMMAND [options]    (sumo %d.%d.%d)\n\nsubcommands:\n",
            SUMO_VERSION_MAJOR, SUMO_VERSION_MINOR, SUMO_VERSION_PATCH);
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`sumo SUBCOMMAND --help` (or `sumo help SUBCOMMAND`) shows its options.\n\n");
    sumo_print_settings_short(out);
}

static int cmd_help(int argc, char **argv)
{
    if (argc < 2) {
        list_commands(stdout);
        return 0;
    }
    const sumo_command *c = find_command(argv[1]);
    if (c == NULL) {
        fprintf(stderr, "sumo help: unknown subcommand '%s'\n\n", argv[1]);
        list_commands(stderr);
        return 2;
    }
    if (c->run == cmd_help) return cmd_help(1, argv);
    char *sub_argv[] = {argv[1], "--help", NULL};
    return c->run(2, sub_argv);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        list_commands(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) return cmd_help(1, argv);
    if (strcmp(argv[1], "--version") == 0) {
        printf("sumo %d.%d.%d\n", SUMO_VERSION_MAJOR, SUMO_VERSION_MINOR, SUMO_VERSION_PATCH);
        return 0;
    }
    const sumo_command *c = find_command(argv[1]);
    if (c == NULL) {
        fprintf(stderr, "sumo: unknown subcommand '%s'\n\n", argv[1]);
        list_commands(stderr);
        return 2;
    }
    return c->run(argc - 1, argv + 1);
}
