"""What every figure command shares: saving a matplotlib figure and the ``python -m ... RESULT... PNG`` command line
(``tuning.harp_figure``, ``tuning.deadline_figure``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable


def save(fig: Any, png: Path) -> None:
    """Lay ``fig`` out, write it to ``png`` (parents made) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def cli(argv: list[str] | None, usage: str, draw: Callable[..., None], inputs: int) -> int:
    """``draw(*inputs, png)`` from the command line's ``inputs`` result paths and the PNG; 2 with ``usage``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != inputs + 1:
        print(f"usage: {usage}", file=sys.stderr)
        return 2
    draw(*(Path(a) for a in args))
    print(f"figure: {args[-1]}")
    return 0
