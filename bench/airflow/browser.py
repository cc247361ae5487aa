"""The browser that tests and benchmarks drive Airflow's UI with: Debian's Chromium, headless, quiet."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
#: no sandbox (containers), no GPU or QUIC, none of the background traffic that would load the machine
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
