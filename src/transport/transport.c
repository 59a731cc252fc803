#include "transport/transport.h"

#include <stdio.h>

sumo_result sumo__transport_fail(sumo__transport *tp, sumo_result code, const char *file,
                                 int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tp->errmsg, sizeof tp->errmsg, fmt, ap);
    va_end(ap);
    if (code == SUMO_ERR_TIMEOUT || code == SUMO_ERR_PEER_FAILURE || code == SUMO_ERR_INTERNAL)
        tp->broken = true;
    sumo__log(tp->log_level, SUMO__LOG_WARN, file, line, "rank %d/%d (%s): %s: %s", tp->rank,
              tp->size, tp->ops->name, sumo_result_name(code), tp->errmsg);
    return code;
}
