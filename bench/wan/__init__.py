"""Emulated WAN: two namespaces, TUN delay line, tbf, TCP buffer caps."""
