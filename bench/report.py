"""Render benchmark results: machine header, markdown tables with ratios, Fig. 4.3-style PNG plots."""

from __future__ import annotations

import os
import platform
import time


def machine_info() -> dict:
    """nproc, kernel, CPU model, RAM and the UTC date: the header every table carries."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 0.0
    return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu, "mem_gib": mem,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
