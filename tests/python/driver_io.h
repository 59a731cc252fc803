/* What the C sides of the binding's parity tests (the drivers in tests/python) share: reading the
 * inputs the Python test wrote. */
#ifndef SUMO_TESTS_DRIVER_IO_H
#define SUMO_TESTS_DRIVER_IO_H

#include <stdio.h>
#include <stdlib.h>

/* n floats from path, or the program ends naming what it could not read. */
static inline float *driver_read_floats(const char *program, const char *path, size_t n)
{
    float *b = malloc(n * sizeof *b);
    FILE *f = fopen(path, "rb");
    if (b == NULL || f == NULL || fread(b, sizeof *b, n, f) != n) {
        fprintf(stderr, "%s: cannot read %zu floats from %s\n", program, n, path);
        exit(1);
    }
    fclose(f);
    return b;
}

#endif
