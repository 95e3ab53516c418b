/*
 * DLCP v1model egress: selective drop and per-class counters.
 *
 * A drop-eligible DLCP data packet (tclass drop bit set) is dropped when the
 * depth of its queue at enqueue time (enq_qdepth, packets in that port and
 * priority queue) exceeds the threshold the controller set for the queue.
 * Without a threshold entry nothing is dropped.  Protected DLCP packets and
 * other traffic are never dropped here.
 *
 * Counters, indexed by queue: `forwarded` (every packet that leaves egress)
 * and `dropped_selective`.
 */

control SelectiveDrop(inout headers_t hdr,
                      inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {

    counter(NUM_QUEUES, CounterType.packets_and_bytes) forwarded;
    counter(NUM_QUEUES, CounterType.packets_and_bytes) dropped_selective;

    action set_threshold(qdepth_t depth) {
        meta.drop_depth = depth;
    }

    table drop_threshold {
        key = {
            meta.queue: exact;
        }
        actions = {
            set_threshold;
            NoAction;
        }
        default_action = NoAction();
        size = 8;
    }

    apply {
        if (hdr.dlcp.isValid() && hdr.dlcp.drop == 1) {
            if (drop_threshold.apply().hit) {
                if (standard_metadata.enq_qdepth > meta.drop_depth) {
                    meta.selectively_dropped = true;
                }
            }
        }
        if (meta.selectively_dropped) {
            mark_to_drop(standard_metadata);
            dropped_selective.count((bit<32>)meta.queue);
        } else {
            forwarded.count((bit<32>)meta.queue);
        }
    }
}
