/*
 * DLCP v1model ingress: traffic class -> queue.
 *
 * DLCP data packets are classified by their priority class (tclass bits 7-5),
 * everything else by DSCP.  The queue becomes standard_metadata.priority: with
 * `--priority-queues 8` BMv2 serves queue 7 first and 0 last.  Unmapped
 * classes go to queue 0.
 */

control Queueing(inout headers_t hdr,
                 inout metadata_t meta,
                 inout standard_metadata_t standard_metadata) {

    action set_queue(queue_t queue) {
        meta.queue = queue;
    }

    table dlcp_class_to_queue {
        key = {
            meta.dlcp_prio: exact;
        }
        actions = {
            set_queue;
        }
        default_action = set_queue(0);
        size = 8;
    }

    table dscp_to_queue {
        key = {
            hdr.ipv4.dscp: exact;
        }
        actions = {
            set_queue;
        }
        default_action = set_queue(0);
        size = 64;
    }

    apply {
        if (hdr.dlcp.isValid()) {
            meta.dlcp_prio = hdr.dlcp.prio;
            dlcp_class_to_queue.apply();
        } else if (hdr.ipv4.isValid()) {
            dscp_to_queue.apply();
        }
        standard_metadata.priority = meta.queue;
    }
}
