/*
 * What dlcp.io._engine lends dlcp.io._udpio of its pacers (a capsule,
 * _engine.PACER_API): the receive loop's linger hands the RATE reports it reads
 * (_control_rates.h) to the native engine's pacers itself, without the GIL.
 */
#ifndef DLCP_PACER_API_H
#define DLCP_PACER_API_H

#include <Python.h>

#define DLCP_PACER_API_NAME "dlcp.io._engine.PACER_API"
#define DLCP_PACER_API_VERSION 1

typedef struct {
    int version;
    /* the type of _engine.Pacer: a pacer given to the receive loop is checked against it */
    PyTypeObject *pacer_type;
    /* Pacer.on_feedback for a caller without the GIL (arguments as that method
     * checks them: a finite rate and window >= 0, a finite time); the caller
     * keeps a reference to the pacer */
    void (*feedback)(PyObject *pacer, double bytes_per_s, int shared, double window, double now);
} DlcpPacerApi;

#endif
