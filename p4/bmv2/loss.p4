/*
 * DLCP v1model ingress: loss injection, compiled in only with
 * -DDLCP_LOSS_INJECTION (`make -C p4 loss`), for experiments.
 *
 * Every packet about to be forwarded is dropped with probability
 * drop_per_65536 / 65536; the controller writes the register (index 0).
 * Dropped packets are counted in `injected`.
 */

#ifdef DLCP_LOSS_INJECTION
control Loss(inout headers_t hdr,
             inout metadata_t meta,
             inout standard_metadata_t standard_metadata) {

    register<bit<16>>(1) drop_per_65536;
    counter(1, CounterType.packets_and_bytes) injected;

    apply {
        if (standard_metadata.egress_spec != DROP_PORT) {
            bit<16> probability;
            drop_per_65536.read(probability, 0);
            bit<16> draw;
            random(draw, (bit<16>)0, (bit<16>)0xFFFF);
            if (draw < probability) {
                mark_to_drop(standard_metadata);
                injected.count(0);
            }
        }
    }
}
#endif  /* DLCP_LOSS_INJECTION */
