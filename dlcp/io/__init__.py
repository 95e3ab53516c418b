"""The only code that touches sockets: UDP data path, TCP control channel, Endpoint."""

from .config import EndpointConfig
from .endpoint import Endpoint, Received
from .peers import PeerAddress

__all__ = ["Endpoint", "EndpointConfig", "PeerAddress", "Received"]
