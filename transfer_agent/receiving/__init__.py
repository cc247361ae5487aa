"""The receiving side: the listener, control sessions, data streams and the commit path."""
