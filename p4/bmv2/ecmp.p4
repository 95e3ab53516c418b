/*
 * DLCP v1model ingress: ECMP member selection.
 *
 * Runs only when routing chose a group of `size` members.  The member index,
 * in [0, size), is drawn per packet for DLCP data packets (their chunks say
 * where they belong, so order across paths does not matter) and taken from a
 * hash of the 5-tuple for everything else, so TCP flows keep their order.
 * (group, member) -> next hop comes from the ecmp_member table.
 */

control Ecmp(inout headers_t hdr,
             inout metadata_t meta,
             inout standard_metadata_t standard_metadata) {

    action drop() {
        mark_to_drop(standard_metadata);
    }

    action set_member_next_hop(port_t port, mac_addr_t smac, mac_addr_t dmac) {
        standard_metadata.egress_spec = port;
        hdr.ethernet.src_addr = smac;
        hdr.ethernet.dst_addr = dmac;
    }

    table ecmp_member {
        key = {
            meta.ecmp_group_id: exact;
            meta.ecmp_member: exact;
        }
        actions = {
            set_member_next_hop;
            drop;
        }
        default_action = drop();
        size = ECMP_MEMBER_TABLE_SIZE;
    }

    apply {
        if (meta.use_ecmp) {
            if (meta.ecmp_group_size == 0) {
                drop();
            } else {
                if (hdr.dlcp.isValid()) {
                    random(meta.ecmp_member, (bit<16>)0, meta.ecmp_group_size - 1);
                } else {
                    hash(meta.ecmp_member, HashAlgorithm.crc16, (bit<16>)0,
                         { hdr.ipv4.src_addr, hdr.ipv4.dst_addr, hdr.ipv4.protocol,
                           meta.l4_src_port, meta.l4_dst_port },
                         meta.ecmp_group_size);
                }
                ecmp_member.apply();
            }
        }
    }
}
