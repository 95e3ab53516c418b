/*
 * DLCP v1model: parser.
 *
 *   ethernet -> ipv4 [-> options] -> tcp
 *                                 -> udp -> dlcp data header (dst port 9400, ver_type 0x11)
 *
 * Only first fragments carry an L4 header.  DLCP control datagrams (ver_type
 * 0x12-0x16) and anything else on port 9400 stay plain UDP.
 */

parser DlcpParser(packet_in packet,
                  out headers_t hdr,
                  inout metadata_t meta,
                  inout standard_metadata_t standard_metadata) {

    state start {
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl) {
            IPV4_MIN_IHL: parse_l4;
            default: parse_ipv4_options;
        }
    }

    state parse_ipv4_options {
        packet.extract(hdr.ipv4_options,
                       (bit<32>)(((bit<16>)hdr.ipv4.ihl - 5) * 32));
        transition parse_l4;
    }

    state parse_l4 {
        transition select(hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (0, IP_PROTO_TCP): parse_tcp;
            (0, IP_PROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_tcp {
        packet.extract(hdr.tcp);
        meta.l4_src_port = hdr.tcp.src_port;
        meta.l4_dst_port = hdr.tcp.dst_port;
        transition accept;
    }

    state parse_udp {
        packet.extract(hdr.udp);
        meta.l4_src_port = hdr.udp.src_port;
        meta.l4_dst_port = hdr.udp.dst_port;
        transition select(hdr.udp.dst_port) {
            DLCP_UDP_PORT: parse_dlcp_ver_type;
            default: accept;
        }
    }

    state parse_dlcp_ver_type {
        transition select(packet.lookahead<bit<8>>()) {
            DLCP_VER_TYPE_DATA: parse_dlcp_data;
            default: accept;
        }
    }

    state parse_dlcp_data {
        packet.extract(hdr.dlcp);
        transition accept;
    }
}
