"""Peer tools run on the same path and files as the agent: iperf3, GridFTP, rsync, SFTP, and the agent itself."""
