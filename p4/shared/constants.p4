/*
 * DLCP P4: constants shared by every target.
 *
 * Values that are part of the wire format come from docs/spec.md; values the
 * controller must agree on are listed in docs/switch.md.  Nothing here is a
 * policy knob: queue mappings and drop thresholds live in tables the
 * controller writes.
 */
#ifndef DLCP_CONSTANTS_P4
#define DLCP_CONSTANTS_P4

/* ---- Ethernet / IPv4 ---------------------------------------------------- */
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_ARP  = 0x0806;

const bit<8> IP_PROTO_ICMP = 1;
const bit<8> IP_PROTO_TCP  = 6;
const bit<8> IP_PROTO_UDP  = 17;

const bit<4> IPV4_MIN_IHL = 5;          /* 20-byte header, no options */

/* ---- DLCP (docs/spec.md) ------------------------------------------------ */
/* UDP port of DLCP datagrams (dlcp.proto.wire.DEFAULT_PORT) */
const bit<16> DLCP_UDP_PORT = 9400;
/* ver_type of a data datagram: version 1, type DATA (spec §1) */
const bit<8> DLCP_VER_TYPE_DATA = 0x11;
/* the data header is 32 bytes (spec §2.1) */
const bit<32> DLCP_DATA_HEADER_BYTES = 32;

/* ---- switch resources (docs/switch.md) ---------------------------------- */
/* number of queues per port: BMv2 runs with --priority-queues 8 */
const bit<32> NUM_QUEUES = 8;
/* indirect per-port counters are indexed by the 9-bit port number */
const bit<32> NUM_PORTS = 512;
/* the port BMv2's v1model treats as "drop" */
const bit<9> DROP_PORT = 511;

const bit<32> IPV4_LPM_TABLE_SIZE = 1024;
const bit<32> ECMP_MEMBER_TABLE_SIZE = 1024;

/* ---- types -------------------------------------------------------------- */
typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<9>  port_t;
typedef bit<3>  queue_t;        /* standard_metadata.priority, 0 lowest, 7 most urgent */
typedef bit<16> ecmp_group_t;
typedef bit<19> qdepth_t;       /* standard_metadata.enq_qdepth */

#endif  /* DLCP_CONSTANTS_P4 */
