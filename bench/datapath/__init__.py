"""The data path's numbers: loopback against GridFTP and iperf3, CPU per GB and per file, the GIL, flows,
authorization and quota costs, micro-benchmarks."""
