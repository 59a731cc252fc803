/* A transport whose operations the caller supplies (sumo_ext.h's sumo_transport_ops):
 * transport/transport_ext.c adapts them to the internal interface. */
#ifndef SUMO_TRANSPORT_EXT_H
#define SUMO_TRANSPORT_EXT_H

#include "transport/transport.h"

/* Checks desc and wraps its operations; *why (when not NULL) says what is wrong with it. */
sumo_result sumo__ext_transport_create(const sumo_transport_desc *desc, const sumo__env *env,
                                       sumo__transport **out, const char **why);

#endif
