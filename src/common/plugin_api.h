#ifndef SUMO_COMMON_PLUGIN_API_H
#define SUMO_COMMON_PLUGIN_API_H

/* An internal function that sumo's own MPI plugin (libsumo_mpi.so) calls in libsumo.so. The
 * MPI transport fills the internal transport table (staging areas, shared windows, offload)
 * that the public seam of sumo_ext.h does not carry, so it stays on the inside: libsumo.so
 * exports the functions marked here, and only these, under the version node
 * SUMO_PRIVATE_<version> (the Makefile makes the linker script from these marks), which a
 * plugin of another version cannot bind, as glibc keeps GLIBC_PRIVATE for its own. */
#define SUMO__PLUGIN_API __attribute__((visibility("default")))

#endif
