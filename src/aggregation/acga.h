/* ACGA as an aggregation method (aggregation/acga.c; docs/design/acga.md). */
#ifndef SUMO_ACGA_H
#define SUMO_ACGA_H

#include "aggregation/aggregator_impl.h"

/* Fills agg->vtbl and agg->impl for agg->options.acga; validates the options first. */
sumo_result sumo__acga_init(sumo_aggregator *agg);

#endif
