# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pictures of the benchmark, as SVG written by hand (no plotting library): where a deploy's time goes, per node and
stage, and the fault matrix (seconds to a diagnosis per fault class, against its budget)."""

from __future__ import annotations

from html import escape

# One colour per stage, in the deploy's order; tasks of no role are the playbook's own.
STAGE_COLOURS = {
    "node": "#9e9e9e", "fabric": "#1f77b4", "image": "#ff7f0e", "weights": "#8c564b", "ray_cluster": "#2ca02c",
    "gate": "#17becf", "collective": "#9467bd", "vllm_server": "#d62728", "supervisor": "#7f7f7f", "playbook": "#bcbd22",
}
FONT = 'font-family="sans-serif" font-size="12"'


def stage_of(task: dict) -> str:
    role = (task.get("role") or "").rsplit(".", 1)[-1]
    return role if role in STAGE_COLOURS else "playbook"


def stage_spans(parsed: dict) -> dict[str, list[tuple[str, float, float]]]:
    """Per host, the stages in the order they ran: (stage, start, end) in seconds from the run's first event, one
    span per run of consecutive tasks of the same stage on that host."""
    origin = parsed["first_event"] or 0.0
    spans: dict[str, list[list]] = {}
    for task in parsed["tasks"]:
        stage = stage_of(task)
        for host, result in task["hosts"].items():
            if "start" not in result or "end" not in result:
                continue
            start, end = result["start"] - origin, result["end"] - origin
            mine = spans.setdefault(host, [])
            if mine and mine[-1][0] == stage:
                mine[-1][2] = max(mine[-1][2], end)
            else:
                mine.append([stage, start, end])
    return {host: [tuple(span) for span in mine] for host, mine in sorted(spans.items())}


def _axis(left: int, top: int, width: int, total: float, height: int) -> list[str]:
    step = next(s for s in (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200) if total / s <= 10)
    out = []
    tick = 0.0
    while tick <= total + 1e-9:
        x = left + width * tick / total
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, top, x, top + height))
        out.append('<text x="%.1f" y="%d" text-anchor="middle" %s>%g</text>' % (x, top + height + 14, FONT, tick))
        tick += step
    return out


def timeline_svg(parsed: dict, title: str) -> str:
    """Rows of nodes, bars of stages across the run's seconds, a legend of the stages that ran."""
    spans = stage_spans(parsed)
    total = max([end for mine in spans.values() for unused_stage, unused_start, end in mine] + [1.0])
    left, top, width, row = 90, 40, 760, 28
    height = row * len(spans)
    parts = ['<text x="%d" y="20" %s font-weight="bold">%s</text>' % (left, FONT, escape(title))]
    parts += _axis(left, top, width, total, height)
    for index, (host, mine) in enumerate(spans.items()):
        y = top + index * row
        parts.append('<text x="%d" y="%d" text-anchor="end" %s>%s</text>' % (left - 8, y + row / 2 + 4, FONT, escape(host)))
        for stage, start, end in mine:
            x = left + width * start / total
            w = max(width * (end - start) / total, 0.8)
            parts.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %.1f-%.1f s</title></rect>'
                         % (x, y + 4, w, row - 8, STAGE_COLOURS[stage], escape(stage), start, end))
    used = [stage for stage in STAGE_COLOURS if any(s == stage for mine in spans.values() for s, unused_start, unused_end in mine)]
    legend_y = top + height + 34
    for index, stage in enumerate(used):
        x = left + index * 95
        parts.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>' % (x, legend_y - 10, STAGE_COLOURS[stage]))
        parts.append('<text x="%d" y="%d" %s>%s</text>' % (x + 16, legend_y, FONT, escape(stage)))
    parts.append('<text x="%d" y="%d" %s>seconds from the start of the run</text>' % (left + width - 200, legend_y + 22, FONT))
    return _document(left + width + 30, legend_y + 34, parts)


def faults_svg(rows: list[dict], title: str) -> str:
    """One bar per fault class: median seconds to the stop (min-max whisker), its budget marked; green when the last
    line named the cause and the fix and nothing started past the stage, red when not."""
    total = max([(row.get("seconds") or {}).get("max") or 0 for row in rows] + [row["budget_s"] for row in rows] + [1.0])
    left, top, width, row_h = 330, 40, 520, 24
    height = row_h * len(rows)
    parts = ['<text x="10" y="20" %s font-weight="bold">%s</text>' % (FONT, escape(title))]
    parts += _axis(left, top, width, total, height)
    for index, row in enumerate(rows):
        y = top + index * row_h
        seconds = row.get("seconds") or {}
        good = row["named"] and row["nothing_past_stage"] and row["within_budget"]
        parts.append('<text x="%d" y="%d" text-anchor="end" %s>%s</text>' % (left - 8, y + row_h / 2 + 4, FONT, escape(row["title"])))
        if seconds.get("median") is not None:
            w = width * seconds["median"] / total
            parts.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %.1f s (%s)</title></rect>'
                         % (left, y + 5, max(w, 0.8), row_h - 10, "#2ca02c" if good else "#d62728", escape(row["key"]),
                            seconds["median"], "named" if row["named"] else "not named"))
            x1, x2 = left + width * seconds["min"] / total, left + width * seconds["max"] / total
            parts.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>' % (x1, y + row_h / 2, x2, y + row_h / 2))
        budget = left + width * row["budget_s"] / total
        parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333" stroke-dasharray="3,2"/>' % (budget, y + 2, budget, y + row_h - 2))
    foot = top + height + 34
    parts.append('<text x="%d" y="%d" %s>seconds from the deploy\'s start to its stop (median, min-max); dashes: the budget; '
                 'green: named with its fix, nothing started past the stage</text>' % (10, foot, FONT))
    return _document(left + width + 30, foot + 16, parts)


def _document(width: float, height: float, parts: list[str]) -> str:
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n'
            '<rect width="100%%" height="100%%" fill="white"/>\n%s\n</svg>\n' % (width, height, width, height, "\n".join(parts)))
