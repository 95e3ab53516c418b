/*
 * What dlcp.io._engine lends dlcp.io._udpio of its pacers (a capsule,
 * _engine.PACER_API): the receive loop hands the RATE reports it reads
 * (_control_frames.h) to the native engine's pacers itself, without the GIL,
 * and stops the round a STOP it reads ends (the engine's rule 10).
 */
#ifndef DLCP_PACER_API_H
#define DLCP_PACER_API_H

#include <Python.h>

#define DLCP_PACER_API_NAME "dlcp.io._engine.PACER_API"
#define DLCP_PACER_API_VERSION 2

typedef struct {
    int version;
    /* the type of _engine.Pacer: a pacer given to the receive loop is checked against it */
    PyTypeObject *pacer_type;
    /* Pacer.on_feedback for a caller without the GIL (arguments as that method
     * checks them: a finite rate and window >= 0, a finite time); the caller
     * keeps a reference to the pacer */
    void (*feedback)(PyObject *pacer, double bytes_per_s, int shared, double window, double now);
    /* the round of message (step, msg) that pacer's engine sends to pacer's
     * destination stops (rule 10 of _engine.c), for a caller without the GIL;
     * 1 if there was one */
    int (*stop_round)(PyObject *pacer, uint32_t step, uint32_t msg);
} DlcpPacerApi;

#endif
