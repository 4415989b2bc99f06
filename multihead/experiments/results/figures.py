"""What the figures of `compare` share (matplotlib is imported by their callers)."""

from __future__ import annotations

import textwrap
from typing import Any


def legend_below(fig: Any, handles: list[Any], labels: list[str]) -> None:
    """One legend under the panels, inside the canvas: constrained layout makes room for it
    below, and its labels are wrapped, and its columns reduced, until it fits the figure's
    width (measured on the drawn figure)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    legend = None
    for columns in range(min(len(labels), 3), 0, -1):
        for width in (60, 40, 28, 18, 12):
            if legend is not None:
                legend.remove()
            wrapped = ["\n".join(textwrap.wrap(label, width)) or label for label in labels]
            legend = fig.legend(handles, wrapped, loc="outside lower center", ncols=columns,
                                fontsize="small")
            fig.canvas.draw()
            box = legend.get_window_extent()
            if box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1:
                return
