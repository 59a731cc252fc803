#include "transport/transport.h"

#include <stdio.h>
#include <string.h>

static sumo_result record(sumo__transport *tp, sumo_result code, bool together, const char *file,
                          int line, const char *fmt, va_list ap)
{
    char message[sizeof tp->status->message];
    vsnprintf(message, sizeof message, fmt, ap);
    if (tp->status) memcpy(tp->status->message, message, sizeof message);
    /* A failure that is not a verdict every rank reached together (bad arguments, a mismatch,
     * a non-finite result) leaves this rank out of step with its peers: the communicator is
     * broken, and the peers are told at once where the transport can reach them, so none of
     * them can finish a collective this rank abandoned and report success. */
    if (!together && code != SUMO_ERR_INVALID_ARGUMENT && code != SUMO_ERR_MISMATCH &&
        code != SUMO_ERR_NONFINITE && code != SUMO_ERR_INVALID_USAGE) {
        if (tp->status) tp->status->broken = true;
        tp->ops->abort(tp);
    }
    sumo__log(tp->log_level, SUMO__LOG_WARN, file, line, "rank %d/%d (%s): %s: %s", tp->rank,
              tp->size, tp->ops->name, sumo_result_name(code), message);
    return code;
}

sumo_result sumo__transport_fail(sumo__transport *tp, sumo_result code, const char *file,
                                 int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sumo_result r = record(tp, code, false, file, line, fmt, ap);
    va_end(ap);
    return r;
}

sumo_result sumo__transport_fail_together(sumo__transport *tp, sumo_result code,
                                          const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sumo_result r = record(tp, code, true, file, line, fmt, ap);
    va_end(ap);
    return r;
}

sumo_result sumo__sendrecv_working(sumo__transport *tp, const void *sbuf, size_t sbytes, int dst,
                                   void *rbuf, size_t rbytes, int src, sumo__work_fn work,
                                   void *ctx)
{
    sumo_result r;
    if (tp->ops->sendrecv_working) {
        r = tp->ops->sendrecv_working(tp, sbuf, sbytes, dst, rbuf, rbytes, src, work, ctx);
    } else {
        r = tp->ops->sendrecv(tp, sbuf, sbytes, dst, rbuf, rbytes, src);
    }
    while (work && work(ctx)) {}
    return r;
}
