/*
 * DLCP v1model: deparser.  Emits the valid headers in wire order; the payload
 * (DLCP chunk, tag) follows unchanged.
 */

control DlcpDeparser(packet_out packet, in headers_t hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.ipv4_options);
        packet.emit(hdr.tcp);
        packet.emit(hdr.udp);
        packet.emit(hdr.dlcp);
    }
}
