"""Example workflows shipped with the provider (the dags folder of ``fstream demo``); each file is one example.

The directory is installed with the package, so ``fstream demo`` and a user's deployment can point their
folder of workflow files at ``importlib.resources.files("fstream_provider.example_dags")`` from a wheel.
This ``__init__`` defines nothing, so the file parser skips it.
"""

from __future__ import annotations
