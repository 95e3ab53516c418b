/*
 * DLCP P4: header and metadata definitions shared by every target.
 *
 * The DLCP data header follows docs/spec.md §2.1 byte for byte (32 bytes,
 * big-endian), with the one-byte fields that pack several values split into
 * their bit fields: ver_type (§1) into version/pkt_type and tclass (§2.3) into
 * prio/drop/mag.  Control datagrams (spec §5, 16-byte header) are not parsed:
 * the switch treats them as ordinary UDP traffic.
 */
#ifndef DLCP_HEADERS_P4
#define DLCP_HEADERS_P4

#include "constants.p4"

header ethernet_t {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16>    ether_type;
}

header ipv4_t {
    bit<4>      version;
    bit<4>      ihl;
    bit<6>      dscp;           /* spec §7: DSCP 8*prio by default */
    bit<2>      ecn;            /* spec §7: ECT(0) protected, Not-ECT drop-eligible */
    bit<16>     total_len;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     frag_offset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

/* IPv4 options, 0 to 40 bytes (ihl 5 to 15) */
header ipv4_options_t {
    varbit<320> data;
}

header tcp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<32> seq_no;
    bit<32> ack_no;
    bit<4>  data_offset;
    bit<4>  res;
    bit<8>  flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent_ptr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

/* docs/spec.md §2.1: the 32-byte data header */
header dlcp_data_t {
    bit<4>  version;        /* offset 0, high nibble: 1 */
    bit<4>  pkt_type;       /* offset 0, low nibble: 1 = DATA */
    bit<8>  flags;          /* offset 1: LAST 0x01, RETRANSMIT 0x02, AUTH 0x04 */
    bit<16> job;            /* offset 2 */
    bit<32> step;           /* offset 4 */
    bit<16> msg;            /* offset 8 */
    bit<16> layer;          /* offset 10 */
    bit<32> seq;            /* offset 12 */
    bit<32> offset;         /* offset 16 */
    bit<32> msg_elems;      /* offset 20 */
    bit<16> payload_len;    /* offset 24 */
    bit<16> src;            /* offset 26 */
    bit<3>  prio;           /* offset 28 (tclass) bits 7-5: priority class, 7 most urgent */
    bit<1>  drop;           /* offset 28 (tclass) bit 4: 1 = drop-eligible, 0 = protected */
    bit<4>  mag;            /* offset 28 (tclass) bits 3-0: magnitude class */
    bit<8>  dtype;          /* offset 29 */
    bit<8>  bound;          /* offset 30: loss bound in thousandths */
    bit<8>  path;           /* offset 31: path index chosen by the sender */
}

struct headers_t {
    ethernet_t     ethernet;
    ipv4_t         ipv4;
    ipv4_options_t ipv4_options;
    tcp_t          tcp;
    udp_t          udp;
    dlcp_data_t    dlcp;
}

struct metadata_t {
    /* L4 ports of TCP or UDP (0 otherwise), for the per-flow ECMP hash */
    bit<16>      l4_src_port;
    bit<16>      l4_dst_port;
    /* set by routing when the route is an ECMP group */
    bool         use_ecmp;
    ecmp_group_t ecmp_group_id;
    bit<16>      ecmp_group_size;
    /* member index in [0, ecmp_group_size): the ecmp_member table's key */
    bit<16>      ecmp_member;
    /* the DLCP priority class (hdr.dlcp.tclass[7:5]): dlcp_class_to_queue's key */
    bit<3>       dlcp_prio;
    /* the queue chosen in ingress; becomes standard_metadata.priority and
       indexes the per-class counters and drop thresholds in egress */
    queue_t      queue;
    /* egress: the drop threshold of meta.queue, and whether selective drop took the packet */
    qdepth_t     drop_depth;
    bool         selectively_dropped;
}

#endif  /* DLCP_HEADERS_P4 */
