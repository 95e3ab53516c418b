"""switch -- the control plane of DLCP-aware switches.

One policy model (:mod:`.policy`) rendered for every target: the Linux ``tc`` profile
of the namespace testbed (:mod:`.linux_tc`), P4Runtime entries for the BMv2 program
(:mod:`.p4entries`, routes per topology in :mod:`.controller`), and a SONiC QoS
config (:mod:`.sonic`). :mod:`.p4runtime` is the P4Runtime client (the ``switch``
extra: p4runtime, grpcio, protobuf); :mod:`.p4info` resolves the names of
docs/switch.md through the compiled P4Info. ``dlcp switch config`` prints a target's
configuration (:mod:`.cli`).

Importing this package, the policy and the renderers needs no extra; only the
P4Runtime client and the P4Info helper import grpcio / protobuf.
"""
