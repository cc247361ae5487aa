"""Nextflow-style channel operators over FStream: ``from fstream_provider.flow import channel``.

    from fstream_provider.flow import channel

    for rec in (channel.watch_path("/daq/run7/**/*.h5")
                .buffer(size=100, duration=2.0)
                .transfer(to="fstream://dtn2:7600/lcls/run7", secret_file="/etc/fstream/secret")
                .take(1000)):
        print(rec.path, rec.size, rec.checksum)

Composition is lazy; a channel runs when iterated, ``subscribe``d or ``collect``ed; breaking out
of the loop cancels every stage. See docs/pipelines.md.
"""

from fstream_provider.flow import channel
from fstream_provider.flow.core import Channel, Running
from fstream_provider.flow.records import FlowError, Landed

__all__ = ["channel", "Channel", "Running", "FlowError", "Landed"]
