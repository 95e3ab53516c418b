"""Put in a folder first on PYTHONPATH as sitecustomize.py: PLACE_STREAM_MIN=<bytes>
sets dlcp.proto.kernels.PLACE_STREAM_MIN_BYTES in every process (the ranks too),
for the streaming A/B of stream_ab.txt."""

import os

if os.environ.get("PLACE_STREAM_MIN"):
    import dlcp.proto.kernels as kernels

    kernels.PLACE_STREAM_MIN_BYTES = int(os.environ["PLACE_STREAM_MIN"])
