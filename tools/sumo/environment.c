/*
 * `sumo environment`: the environment variables the library reads, from its own table
 * (sumo_setting_describe), as a list or, with --markdown, as the table docs/settings.md holds
 * (tests/unit/test_tool.c checks that the two agree), or, with --check, whether this machine
 * accepts the values set (scripts/check-recorded asks it which kernel sets run here).
 * `sumo --help` prints the short form.
 */
#include "commands.h"

#include "sumo.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Prints text from column indent, broken between words before column width. */
static void print_wrapped(FILE *out, const char *text, int indent, int width)
{
    int col = 0;
    while (*text) {
        size_t word = strcspn(text, " ");
        if (col > indent && col + 1 + (int)word > width) {
            fputc('\n', out);
            col = 0;
        }
        if (col == 0) col = fprintf(out, "%*s", indent, "");
        else col += fprintf(out, " ");
        col += fprintf(out, "%.*s", (int)word, text);
        text += word;
        while (*text == ' ') text++;
    }
    fputc('\n', out);
}

void sumo_print_settings_short(FILE *out)
{
    const char *name, *fallback;
    char accepts[256];
    fprintf(out, "environment (`sumo environment` says what each does):\n");
    for (int i = 0; sumo_setting_describe(i, &name, accepts, sizeof accepts, &fallback, NULL) ==
                    SUMO_SUCCESS;
         i++)
        fprintf(out, "  %-27s %s; default %s\n", name, accepts, fallback ? fallback : "none");
}

int sumo_cmd_environment(int argc, char **argv)
{
    bool markdown = argc == 2 && strcmp(argv[1], "--markdown") == 0;
    if (argc == 2 && strcmp(argv[1], "--check") == 0) {
        char why[256] = "";
        if (sumo_env_check(why, sizeof why) == SUMO_SUCCESS) return 0;
        fprintf(stderr, "sumo: %s\n", why);
        return 1;
    }
    if (argc > 2 || (argc == 2 && !markdown)) {
        bool help = argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        fprintf(help ? stdout : stderr,
                "usage: sumo environment [--markdown | --check]\n\n"
                "Lists the environment variables sumo reads: what each accepts, its default and\n"
                "what it does. A malformed value is refused by name where it is read\n"
                "(sumo_env_check checks them all). --markdown prints the table of\n"
                "docs/settings.md. --check prints nothing and exits 0 when every variable set\n"
                "is accepted here (SUMO_KERNEL_ISA=avx512 only where the CPU runs AVX-512),\n"
                "else prints the first refusal and exits 1.\n");
        return help ? 0 : 2;
    }
    const char *name, *fallback, *doc;
    char accepts[256];
    if (markdown)
        printf("| variable | accepts | default | what it does |\n| --- | --- | --- | --- |\n");
    for (int i = 0; sumo_setting_describe(i, &name, accepts, sizeof accepts, &fallback, &doc) ==
                    SUMO_SUCCESS;
         i++) {
        if (markdown) {
            printf("| `%s` | %s | %s%s%s | %s |\n", name, accepts, fallback ? "`" : "",
                   fallback ? fallback : "none", fallback ? "`" : "", doc);
            continue;
        }
        printf("%s%s\n    accepts: %s\n    default: %s\n", i ? "\n" : "", name, accepts,
               fallback ? fallback : "none");
        print_wrapped(stdout, doc, 4, 92);
    }
    return 0;
}
