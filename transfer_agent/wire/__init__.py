"""The wire: framing, the protocol version, the handshake (shared secret or mutual TLS), keyed integrity and sealing, pre-authentication bounds."""
