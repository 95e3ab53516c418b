/*
 * DLCP switch data plane, v1model (BMv2 simple_switch / simple_switch_grpc).
 *
 * The control-plane interface (table, action and counter names) is the
 * contract in docs/switch.md; the controller (dlcp/switch/) resolves them
 * through the P4Info compiled from this file.  BMv2 must run with
 * `-- --priority-queues 8`: standard_metadata.priority is the queue, and a
 * priority at or above the number of queues is dropped.
 *
 * Pipeline, one control per file:
 *
 *   parser.p4          ethernet -> ipv4 -> tcp | udp -> dlcp data (udp dst 9400)
 *   checksum.p4        verify IPv4 header checksum
 *   --- ingress ---
 *   port_counters.p4   ingress_port counter
 *   routing.p4         ipv4_lpm: next hop or ECMP group
 *   ecmp.p4            ecmp_member: DLCP per packet, other traffic per 5-tuple
 *   queueing.p4        dlcp_class_to_queue / dscp_to_queue -> priority
 *   loss.p4            optional loss injection (-DDLCP_LOSS_INJECTION)
 *   --- egress ---
 *   selective_drop.p4  drop_threshold on enq_qdepth; forwarded / dropped_selective
 *   port_counters.p4   egress_port counter
 *   checksum.p4        recompute IPv4 header checksum
 *   deparser.p4
 */

#include <core.p4>
#include <v1model.p4>

#include "../shared/constants.p4"
#include "../shared/headers.p4"

#include "parser.p4"
#include "checksum.p4"
#include "port_counters.p4"
#include "routing.p4"
#include "ecmp.p4"
#include "queueing.p4"
#include "loss.p4"
#include "selective_drop.p4"
#include "deparser.p4"

control DlcpIngress(inout headers_t hdr,
                    inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {

    IngressPortCounters() port_counters;
    Routing() routing;
    Ecmp() ecmp;
    Queueing() queueing;
#ifdef DLCP_LOSS_INJECTION
    Loss() loss;
#endif

    apply {
        port_counters.apply(standard_metadata);
        routing.apply(hdr, meta, standard_metadata);
        ecmp.apply(hdr, meta, standard_metadata);
        queueing.apply(hdr, meta, standard_metadata);
#ifdef DLCP_LOSS_INJECTION
        loss.apply(hdr, meta, standard_metadata);
#endif
    }
}

control DlcpEgress(inout headers_t hdr,
                   inout metadata_t meta,
                   inout standard_metadata_t standard_metadata) {

    SelectiveDrop() selective_drop;
    EgressPortCounters() port_counters;

    apply {
        selective_drop.apply(hdr, meta, standard_metadata);
        if (!meta.selectively_dropped) {
            port_counters.apply(standard_metadata);
        }
    }
}

V1Switch(
    DlcpParser(),
    DlcpVerifyChecksum(),
    DlcpIngress(),
    DlcpEgress(),
    DlcpComputeChecksum(),
    DlcpDeparser()
) main;
