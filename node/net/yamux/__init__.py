"""pnode's yamux muxer: frames (wire format), stream, conn (the connection and `install`)."""

from node.net.yamux.conn import YamuxConnection, install
from node.net.yamux.frames import INITIAL_WINDOW, PROTOCOL_ID, YamuxProtocolError
from node.net.yamux.stream import YamuxStream

__all__ = ["INITIAL_WINDOW", "PROTOCOL_ID", "YamuxConnection", "YamuxProtocolError", "YamuxStream",
           "install"]
