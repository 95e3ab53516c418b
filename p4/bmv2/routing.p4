/*
 * DLCP v1model ingress: IPv4 routing.
 *
 * Longest-prefix match on the destination.  A route either names the next hop
 * directly (port and the MAC addresses to write) or an ECMP group, whose member
 * the ecmp control picks.  Packets that are not IPv4, carry a bad header
 * checksum or would leave with TTL 0 are dropped; routed packets leave with the
 * TTL decremented (the checksum is recomputed in DlcpComputeChecksum).
 */

control Routing(inout headers_t hdr,
                inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action set_next_hop(port_t port, mac_addr_t smac, mac_addr_t dmac) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.src_addr = smac;
        hdr.ethernet.dst_addr = dmac;
    }

    action set_ecmp_group(ecmp_group_t group_id, bit<16> size) {
        meta.use_ecmp = true;
        meta.ecmp_group_id = group_id;
        meta.ecmp_group_size = size;
    }

    table ipv4_lpm {
        key = {
            hdr.ipv4.dst_addr: lpm;
        }
        actions = {
            set_next_hop;
            set_ecmp_group;
            drop;
        }
        default_action = drop();
        size = IPV4_LPM_TABLE_SIZE;
    }

    apply {
        if (!hdr.ipv4.isValid()
                || standard_metadata.checksum_error == 1
                || hdr.ipv4.ttl <= 1) {
            drop();
        } else {
            ipv4_lpm.apply();
            hdr.ipv4.ttl = hdr.ipv4.ttl - 1;
        }
    }
}
