"""Server-side SVG charts for the reconciliation dashboard, pure Python (nothing from a
CDN). Values stay ints or Decimals, so money is exact in the labels; every chart is
`<svg class="tally-chart" id="chart-<slug>">`, and an empty one says "no data yet"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from html import escape

from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#417690", "#e07b39", "#3a9d5d", "#b54f6f", "#7a5fb0", "#c9a227")
WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 44

Number = int | Decimal | float


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[Number]


@dataclass(frozen=True)
class Chart:
    slug: str
    title: str
    labels: list[str]
    series: list[Series] = field(default_factory=list)
    kind: str = "line"  # "line" or "bar"
    unit: str = ""


def _fmt(value: Number) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def _nice_max(value: Decimal) -> Decimal:
    if value <= 0:
        return Decimal(1)
    magnitude = Decimal(10) ** (len(str(int(value))) - 1)
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return Decimal(step) * magnitude
    return Decimal(10) * magnitude


def chart_svg(chart: Chart) -> SafeString:
    """The chart as an inline SVG element (text escaped)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [Decimal(str(v)) for s in chart.series for v in s.values]
    top = _nice_max(max(values, default=Decimal(0)))
    if top < 4 and all(v == v.to_integral_value() for v in values):
        top = Decimal(4)  # counts: whole-number ticks
    n = max(len(chart.labels), 1)
    parts = [
        f'<svg class="tally-chart tally-chart-{escape(chart.kind)}" id="chart-{escape(chart.slug)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(chart.title)}" '
        f'data-points="{len(chart.labels)}" data-series="{len(chart.series)}">',
        f'<title>{escape(chart.title)}</title>',
        f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold" fill="#333">{escape(chart.title)}'
        f'{" (" + escape(chart.unit) + ")" if chart.unit and not chart.title.endswith(chart.unit) else ""}</text>',
    ]
    for i in range(5):  # grid and y labels
        y = TOP + plot_h * i / 4
        tick = top * (4 - i) / 4
        tick_text = _fmt(int(tick)) if tick == tick.to_integral_value() else _fmt(tick)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#666">{escape(tick_text)}</text>')
    if not chart.labels or not values:
        parts.append(f'<text class="tally-chart-empty" x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" font-size="13" '
                     f'text-anchor="middle" fill="#999">no data yet</text>')
    longest = max((len(label) for label in chart.labels), default=1)
    step = max(1, -(-n * (longest * 6 + 8) // plot_w))  # thin the x labels so they do not overlap
    for i, label in enumerate(chart.labels):  # x labels, thinned
        if i % step == 0 or i == n - 1:
            x = LEFT + plot_w * (i + 0.5) / n
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="10" text-anchor="middle" fill="#666">{escape(label)}</text>')

    def y_of(value: Number) -> float:
        return TOP + plot_h * float(1 - Decimal(str(value)) / top)

    bar_w = plot_w / n / max(len(chart.series), 1) * 0.8
    for k, series in enumerate(chart.series):
        color = PALETTE[k % len(PALETTE)]
        if chart.kind == "bar":
            for i, value in enumerate(series.values):
                x = LEFT + plot_w * i / n + plot_w / n * 0.1 + bar_w * k
                y = y_of(value)
                parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{TOP + plot_h - y:.1f}" fill="{color}">'
                             f'<title>{escape(chart.labels[i])}: {escape(_fmt(value))}</title></rect>')
        else:
            points = " ".join(f"{LEFT + plot_w * (i + 0.5) / n:.1f},{y_of(v):.1f}" for i, v in enumerate(series.values))
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
            for i, value in enumerate(series.values):
                parts.append(f'<circle cx="{LEFT + plot_w * (i + 0.5) / n:.1f}" cy="{y_of(value):.1f}" r="2.5" fill="{color}">'
                             f'<title>{escape(chart.labels[i])}: {escape(_fmt(value))}</title></circle>')
        lx = LEFT + 10 + 150 * k
        parts.append(f'<rect x="{lx}" y="{HEIGHT - 14}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{lx + 14}" y="{HEIGHT - 5}" font-size="11" fill="#333">{escape(series.name)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text is escaped above
