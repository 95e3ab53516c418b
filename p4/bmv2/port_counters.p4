/*
 * DLCP v1model: per-port packet and byte counters, indexed by port number.
 * Ingress counts every arriving frame; egress every frame that leaves (after
 * selective drop).
 */

control IngressPortCounters(in standard_metadata_t standard_metadata) {
    counter(NUM_PORTS, CounterType.packets_and_bytes) ingress_port;

    apply {
        ingress_port.count((bit<32>)standard_metadata.ingress_port);
    }
}

control EgressPortCounters(in standard_metadata_t standard_metadata) {
    counter(NUM_PORTS, CounterType.packets_and_bytes) egress_port;

    apply {
        egress_port.count((bit<32>)standard_metadata.egress_port);
    }
}
