"""A small vector canvas that renders the same drawing to SVG (text) or PNG (Pillow).

Only what the topology picture needs: rounded boxes, text, polylines with
arrowheads (solid or dashed) and a text-width measure, so layout code can size
boxes to their labels. SVG needs nothing installed; PNG uses Pillow (a wheel
with its own FreeType, no system library) and DejaVu Sans when the system has
it, else Pillow's bundled font.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal
from xml.sax.saxutils import escape

FONT_FAMILY = "DejaVu Sans, Verdana, Arial, sans-serif"
Point = tuple[float, float]


@lru_cache(maxsize=32)
def _font(size: float, bold: bool):
    try:
        from PIL import ImageFont
    except ImportError:
        return None
    names = ("DejaVuSans-Bold.ttf",) if bold else ("DejaVuSans.ttf",)
    for name in names:
        try:
            return ImageFont.truetype(name, size=max(1, round(size)))
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # pragma: no cover - Pillow older than 10.1
        return ImageFont.load_default()


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """Width of ``text`` in pixels at ``size`` (the PNG font's metrics; an estimate without Pillow)."""
    font = _font(size, bold)
    if font is not None and hasattr(font, "getlength"):
        return float(font.getlength(text))
    return len(text) * size * (0.66 if bold else 0.6)


@dataclass
class _Item:
    kind: str
    args: dict


@dataclass
class Canvas:
    """Collects shapes in logical pixels; :meth:`svg` and :meth:`png` render them."""

    width: float
    height: float
    background: str = "#ffffff"
    items: list[_Item] = field(default_factory=list)

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        *,
        fill: str = "none",
        stroke: str = "#000000",
        width: float = 1.0,
        radius: float = 0.0,
        dash: bool = False,
        title: str | None = None,
    ) -> None:
        self.items.append(_Item("rect", dict(x=x, y=y, w=w, h=h, fill=fill, stroke=stroke, width=width,
                                            radius=radius, dash=dash, title=title)))

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        size: float = 12,
        bold: bool = False,
        color: str = "#111111",
        anchor: Literal["start", "middle", "end"] = "start",
    ) -> None:
        """``y`` is the baseline."""
        self.items.append(_Item("text", dict(x=x, y=y, text=text, size=size, bold=bold, color=color, anchor=anchor)))

    def line(
        self,
        points: list[Point],
        *,
        color: str = "#000000",
        width: float = 1.5,
        dash: bool = False,
        arrow: bool = True,
        group: dict[str, str] | None = None,
    ) -> None:
        """A polyline; ``arrow`` puts an arrowhead at the last point. ``group``: SVG attributes/title."""
        self.items.append(_Item("line", dict(points=points, color=color, width=width, dash=dash, arrow=arrow,
                                            group=group or {})))

    def fit(self, margin: float = 30.0) -> None:
        """Grow (and shift) the canvas so every shape is inside it with ``margin`` around."""
        xs: list[float] = []
        ys: list[float] = []
        for item in self.items:
            a = item.args
            if item.kind == "rect":
                xs += [a["x"], a["x"] + a["w"]]
                ys += [a["y"], a["y"] + a["h"]]
            elif item.kind == "text":
                w = text_width(a["text"], a["size"], bold=a["bold"])
                x0 = a["x"] - {"start": 0, "middle": w / 2, "end": w}[a["anchor"]]
                xs += [x0, x0 + w]
                ys += [a["y"] - a["size"], a["y"] + a["size"] * 0.3]
            else:
                xs += [p[0] for p in a["points"]]
                ys += [p[1] for p in a["points"]]
        if not xs:
            return
        dx, dy = max(0.0, margin - min(xs)), max(0.0, margin - min(ys))
        if dx or dy:
            for item in self.items:
                a = item.args
                if item.kind == "line":
                    a["points"] = [(x + dx, y + dy) for x, y in a["points"]]
                else:
                    a["x"] += dx
                    a["y"] += dy
        self.width = max(self.width, max(xs) + dx + margin)
        self.height = max(self.height, max(ys) + dy + margin)

    # ------------------------------------------------------------------ SVG

    def svg(self) -> str:
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
            f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="{FONT_FAMILY}">',
            f'<rect x="0" y="0" width="{self.width:.0f}" height="{self.height:.0f}" fill="{self.background}"/>',
        ]
        for item in self.items:
            a = item.args
            if item.kind == "rect":
                dash = ' stroke-dasharray="6 4"' if a["dash"] else ""
                title = f"<title>{escape(a['title'])}</title>" if a["title"] else ""
                out.append(
                    f'<rect x="{a["x"]:.1f}" y="{a["y"]:.1f}" width="{a["w"]:.1f}" height="{a["h"]:.1f}" '
                    f'rx="{a["radius"]:.1f}" fill="{a["fill"]}" stroke="{a["stroke"]}" '
                    f'stroke-width="{a["width"]:.1f}"{dash}>{title}</rect>'
                )
            elif item.kind == "text":
                weight = ' font-weight="bold"' if a["bold"] else ""
                out.append(
                    f'<text x="{a["x"]:.1f}" y="{a["y"]:.1f}" font-size="{a["size"]:.1f}" fill="{a["color"]}" '
                    f'text-anchor="{a["anchor"]}"{weight} xml:space="preserve">{escape(a["text"])}</text>'
                )
            else:
                pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in a["points"])
                dash = ' stroke-dasharray="7 5"' if a["dash"] else ""
                attrs = "".join(
                    f' {k}="{escape(v, {chr(34): "&quot;"})}"' for k, v in a["group"].items() if k != "title"
                )
                title = f"<title>{escape(a['group']['title'])}</title>" if "title" in a["group"] else ""
                head = ""
                if a["arrow"] and len(a["points"]) >= 2:
                    tri = " ".join(f"{x:.1f},{y:.1f}" for x, y in _arrowhead(a["points"], a["width"]))
                    head = f'<polygon points="{tri}" fill="{a["color"]}"/>'
                out.append(
                    f"<g{attrs}>{title}<polyline points=\"{pts}\" fill=\"none\" stroke=\"{a['color']}\" "
                    f'stroke-width="{a["width"]:.1f}" stroke-linejoin="round"{dash}/>{head}</g>'
                )
        out.append("</svg>")
        return "\n".join(out) + "\n"

    # ------------------------------------------------------------------ PNG

    def png(self, path: str, *, scale: float = 2.0) -> None:
        """Render with Pillow at 2x ``scale`` and downsample (anti-aliasing)."""
        try:
            from PIL import Image, ImageDraw
        except ImportError as exc:  # pragma: no cover - pillow is a dependency
            raise RuntimeError("PNG output needs Pillow: pip install pillow (or write .svg or .mmd)") from exc
        s = scale * 2
        img = Image.new("RGB", (math.ceil(self.width * s), math.ceil(self.height * s)), self.background)
        draw = ImageDraw.Draw(img)
        for item in self.items:
            a = item.args
            if item.kind == "rect":
                box = [a["x"] * s, a["y"] * s, (a["x"] + a["w"]) * s, (a["y"] + a["h"]) * s]
                fill = None if a["fill"] == "none" else a["fill"]
                if a["dash"]:
                    draw.rounded_rectangle(box, radius=a["radius"] * s, fill=fill)
                    x0, y0, x1, y1 = box
                    for seg in ([(x0, y0), (x1, y0)], [(x1, y0), (x1, y1)], [(x1, y1), (x0, y1)], [(x0, y1), (x0, y0)]):
                        _dashed(draw, seg, a["stroke"], a["width"] * s, 6 * s, 4 * s)
                else:
                    draw.rounded_rectangle(box, radius=a["radius"] * s, fill=fill, outline=a["stroke"],
                                           width=max(1, round(a["width"] * s)))
            elif item.kind == "text":
                font = _font(a["size"] * s, a["bold"])
                anchor = {"start": "ls", "middle": "ms", "end": "rs"}[a["anchor"]]
                draw.text((a["x"] * s, a["y"] * s), a["text"], fill=a["color"], font=font, anchor=anchor)
            else:
                pts = [(x * s, y * s) for x, y in a["points"]]
                w = a["width"] * s
                if a["arrow"] and len(pts) >= 2:
                    # stop the shaft under the arrowhead so its square end does not show
                    head = _arrowhead(a["points"], a["width"])
                    tip, base = pts[-1], ((head[1][0] + head[2][0]) / 2 * s, (head[1][1] + head[2][1]) / 2 * s)
                    pts = pts[:-1] + [(base[0] + (tip[0] - base[0]) * 0.2, base[1] + (tip[1] - base[1]) * 0.2)]
                if a["dash"]:
                    _dashed(draw, pts, a["color"], w, 7 * s, 5 * s)
                else:
                    draw.line(pts, fill=a["color"], width=max(1, round(w)), joint="curve")
                if a["arrow"] and len(a["points"]) >= 2:
                    draw.polygon([(x * s, y * s) for x, y in _arrowhead(a["points"], a["width"])], fill=a["color"])
        final = img.resize((math.ceil(self.width * scale), math.ceil(self.height * scale)), Image.LANCZOS)
        final.save(path, "PNG", optimize=True)


def _arrowhead(points: list[Point], width: float) -> list[Point]:
    (x0, y0), (x1, y1) = points[-2], points[-1]
    angle = math.atan2(y1 - y0, x1 - x0)
    length, half = 9 + 2 * width, 4 + width
    bx, by = x1 - length * math.cos(angle), y1 - length * math.sin(angle)
    nx, ny = -math.sin(angle) * half, math.cos(angle) * half
    return [(x1, y1), (bx + nx, by + ny), (bx - nx, by - ny)]


def _dashed(draw, pts: list[Point], color: str, width: float, on: float, off: float) -> None:
    carry = 0.0  # distance into the current dash pattern
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        seg = math.hypot(x1 - x0, y1 - y0)
        if seg == 0:
            continue
        ux, uy = (x1 - x0) / seg, (y1 - y0) / seg
        pos = 0.0
        while pos < seg:
            phase = carry % (on + off)
            if phase < on:
                step = min(on - phase, seg - pos)
                draw.line(
                    [(x0 + ux * pos, y0 + uy * pos), (x0 + ux * (pos + step), y0 + uy * (pos + step))],
                    fill=color,
                    width=max(1, round(width)),
                )
            else:
                step = min(on + off - phase, seg - pos)
            pos += step
            carry += step
