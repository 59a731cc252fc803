/*
 * What a run's bits depend on besides the code and its flags: the same seed gives the same
 * parameters on machines that agree on both of these, and may not on others.
 *   - OpenBLAS picks its matrix kernels for the CPU at load time, and each kernel sums a
 *     product's terms in its own order (the training driver's forward and backward passes).
 *   - sumo's kernels pick AVX-512, AVX2 or portable code at run time, and the order of their
 *     dot products and Gram sums follows the vector width (Adasum, ACGA).
 * Both can be forced (OPENBLAS_CORETYPE, SUMO_KERNEL_ISA) to a CPU kind's that this one has
 * the instructions for, and these report what ran, forced or not: scripts/check-recorded
 * reproduces a row of another CPU that way.
 * Header-only, so that every file of the tool (and a fuzzer that compiles some of them alone)
 * can name them without another object to link.
 */
#ifndef SUMO_TOOL_MACHINE_H
#define SUMO_TOOL_MACHINE_H

#include <sumo.h>

char *openblas_get_corename(void);

/* OpenBLAS's kernel family on this CPU ("Haswell", "SkylakeX", ...). */
static inline const char *sumo_tool_blas_core(void)
{
    const char *name = openblas_get_corename();
    return name && *name ? name : "unknown";
}

/* The instruction set sumo's kernels dispatch to here, SUMO_KERNEL_ISA's where it is set
 * (sumo_kernel_isa). */
static inline const char *sumo_tool_kernel_isa(void)
{
    const char *name = "unknown";
    sumo_kernel_isa(&name);
    return name;
}

#endif
