"""The only code that touches sockets: UDP data path, TCP control channel, Endpoint."""

from .config import EndpointConfig
from .endpoint import Endpoint, PeerAddress, Received

__all__ = ["Endpoint", "EndpointConfig", "PeerAddress", "Received"]
