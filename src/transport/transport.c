#include "transport/transport.h"

#include <stdio.h>

sumo_result sumo__transport_fail(sumo__transport *tp, sumo_result code, const char *file,
                                 int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tp->errmsg, sizeof tp->errmsg, fmt, ap);
    va_end(ap);
    /* A failure that is not a verdict every rank reached together (bad arguments, a mismatch,
     * a non-finite result) leaves this rank out of step with its peers: the communicator is
     * broken, and on shared memory the peers are told at once, so none of them can finish a
     * collective this rank abandoned and report success. */
    if (code != SUMO_ERR_INVALID_ARGUMENT && code != SUMO_ERR_MISMATCH &&
        code != SUMO_ERR_NONFINITE && code != SUMO_ERR_INVALID_USAGE) {
        tp->broken = true;
        if (tp->shm) sumo__shm_abort(tp->shm, tp->rank);
    }
    sumo__log(tp->log_level, SUMO__LOG_WARN, file, line, "rank %d/%d (%s): %s: %s", tp->rank,
              tp->size, tp->ops->name, sumo_result_name(code), tp->errmsg);
    return code;
}
