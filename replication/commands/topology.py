"""``replication topology CONFIG... -o fabric.svg|.png|.mmd``: draw the fabric for a design review.

Instances are boxes inside their Group; groups are laid out in tiers, from
the groups that take publishes (a Kafka ingress) down along the replication
links. Every address of every destination is an arrow: solid for the
preferred address, dashed for the failover ones; blue for sync, orange for
async. The preferred arrow carries the destination's label: name and sync
type, the failover order, PassThrough, and each Topic with its exclusions and
filter. SVG needs nothing; PNG is drawn with Pillow; ``.mmd`` is Mermaid text.
"""

from __future__ import annotations

import argparse
import os
from collections import deque
from dataclasses import dataclass, field

from replication.commands.drawing import Canvas, text_width
from replication.config.fabric import Fabric
from replication.config.model import VALIDATION_CHECKS, Destination
from replication.errors import ConfigError

SYNC_COLOR = "#1d4ed8"
ASYNC_COLOR = "#c2410c"
EXTERNAL_GROUP = "not among the configs"

NAME_SIZE, SUB_SIZE, LABEL_SIZE, GROUP_SIZE = 15, 11, 11, 13
LINE = 14  # label line height


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config files (XML)")
    parser.add_argument("-o", "--output", required=True, help="output file: .svg, .png or .mmd (Mermaid)")
    parser.add_argument("--title", default=None, help="title written above the picture")


def run(args: argparse.Namespace) -> int:
    fabric = Fabric.load(args.configs)
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in (".svg", ".png", ".mmd"):
        raise ConfigError(f"-o {args.output}: unknown picture type {ext or '(none)'}; use .svg, .png or .mmd")
    write(fabric, args.output, title=args.title)
    layout = Layout.of(fabric)
    print(f"wrote {args.output}: {len(layout.nodes)} instances in {len(layout.group_order)} groups, "
          f"{len(layout.edges)} links")
    return 0


def write(fabric: Fabric, path: str, *, title: str | None = None) -> None:
    """Write the picture; the format follows the file extension."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".mmd":
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(mermaid(fabric))
        return
    canvas = draw(fabric, title=title)
    if ext == ".png":
        canvas.png(path)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(canvas.svg())


# --------------------------------------------------------------------------- model


@dataclass
class Node:
    name: str
    group: str
    lines: list[str]
    external: bool = False
    x: float = 0
    y: float = 0
    w: float = 0
    h: float = 0

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2


@dataclass
class Edge:
    src: str
    dst: str
    dest: Destination
    priority: int
    label: list[str] = field(default_factory=list)

    @property
    def color(self) -> str:
        return SYNC_COLOR if self.dest.sync_type == "sync" else ASYNC_COLOR

    @property
    def title(self) -> str:
        where = "preferred address" if self.priority == 1 else f"failover address {self.priority}"
        return f"{self.src} -> {self.dst}: destination {self.dest.name}, {self.dest.sync_type}, {where}"


def destination_label(dest: Destination, targets: list[str]) -> list[str]:
    lines = [f"{dest.name} · {dest.sync_type}"]
    if len(targets) > 1:
        lines.append("failover: " + " → ".join(targets))
    lines.append(f"PassThrough {dest.pass_through}" if dest.pass_through is not None else "no PassThrough")
    for t in dest.topics[:4]:
        excl = [c for c in VALIDATION_CHECKS if c in t.exclude_validation]
        lines.append(f"{t.name} {t.message_type}" + (f" · excl. {','.join(excl)}" if excl else ""))
        if t.filter:
            lines.append(f"  filter: {t.filter.text}")
    if len(dest.topics) > 4:
        lines.append(f"… {len(dest.topics) - 4} more topics")
    return lines


def _node_lines(cfg) -> list[str]:
    lines = []
    for k in cfg.kafka_transports:
        lines.append("publish: " + ", ".join(k.topics))
    txlog = ", ".join(f"{t.name}" for t in cfg.txlog_topics) or "none"
    lines.append(f"txlog: {txlog[:40]}")
    return lines


def _label_size(lines: list[str]) -> tuple[float, float]:
    if not lines:
        return 0, 0
    return max(text_width(s, LABEL_SIZE) for s in lines) + 16, len(lines) * LINE + 6


@dataclass
class Layout:
    nodes: dict[str, Node]
    edges: list[Edge]
    tiers: list[list[str]]
    """Groups per tier, top to bottom."""
    groups: dict[str, list[str]]
    group_order: list[str]

    @classmethod
    def of(cls, fabric: Fabric) -> Layout:
        nodes: dict[str, Node] = {}
        for cfg in fabric:
            nodes[cfg.name] = Node(cfg.name, cfg.group or cfg.name, _node_lines(cfg))
        edges: list[Edge] = []
        for cfg in fabric:
            for dest in cfg.destinations:
                links = fabric.links(cfg, dest)
                names = []
                for link in links:
                    if link.downstream is None:
                        ext = dest.name if len(links) == 1 and dest.name not in fabric else (
                            os.path.basename(link.address.rstrip("/")) or dest.name)
                        nodes.setdefault(ext, Node(ext, EXTERNAL_GROUP, [link.address or "(no address)"], True))
                        names.append(ext)
                    else:
                        names.append(link.downstream)
                for link, target in zip(links, names):
                    e = Edge(cfg.name, target, dest, link.priority)
                    if link.priority == 1:
                        e.label = destination_label(dest, names)
                    else:
                        e.label = [f"failover {link.priority}"]
                    edges.append(e)
        groups: dict[str, list[str]] = {}
        for n in nodes.values():
            groups.setdefault(n.group, []).append(n.name)
        tiers = _tiers(fabric, nodes, edges, groups)
        return cls(nodes, edges, tiers, groups, [g for tier in tiers for g in tier])


def _tiers(fabric: Fabric, nodes: dict[str, Node], edges: list[Edge], groups: dict[str, list[str]]) -> list[list[str]]:
    """Groups in tiers: breadth-first from the groups that take publishes, along the links."""
    order = list(groups)
    succ: dict[str, list[str]] = {g: [] for g in order}
    has_pred: set[str] = set()
    for e in edges:
        a, b = nodes[e.src].group, nodes[e.dst].group
        if a != b and b not in succ[a]:
            succ[a].append(b)
            has_pred.add(b)
    ingress = [g for g in order if any(fabric[n].kafka_transports for n in groups[g] if n in fabric)]
    level: dict[str, int] = {}
    seeds = ingress or [g for g in order if g not in has_pred] or order[:1]
    while True:
        queue = deque(s for s in seeds if s not in level)
        for s in queue:
            level[s] = 0 if not level else min(level.values())
        while queue:
            g = queue.popleft()
            for h in succ[g]:
                if h not in level:
                    level[h] = level[g] + 1
                    queue.append(h)
        rest = [g for g in order if g not in level]
        if not rest:
            break
        seeds = rest[:1]
    if EXTERNAL_GROUP in level:
        level[EXTERNAL_GROUP] = max(level.values()) + (0 if len(level) == 1 else 1)
    tiers: dict[int, list[str]] = {}
    for g in order:
        tiers.setdefault(level[g], []).append(g)
    return [tiers[k] for k in sorted(tiers)]


# --------------------------------------------------------------------------- drawing


def draw(fabric: Fabric, *, title: str | None = None) -> Canvas:
    lay = Layout.of(fabric)
    nodes, edges = lay.nodes, lay.edges
    for n in nodes.values():
        n.w = max(170.0, text_width(n.name, NAME_SIZE, bold=True) + 28,
                  *(text_width(s, SUB_SIZE) + 28 for s in n.lines))
        n.h = 30 + len(n.lines) * 15
    w_node = max(n.w for n in nodes.values())
    for n in nodes.values():
        n.w = w_node  # one width: columns line up across tiers
    h_node = max(n.h for n in nodes.values())
    for n in nodes.values():
        n.h = h_node

    gap_x, row_pad = 150.0, {}
    for g, _members in lay.groups.items():
        inner = [e for e in edges if nodes[e.src].group == g and nodes[e.dst].group == g]
        gap_x = max([gap_x] + [_label_size(e.label)[0] + 36 for e in inner])
        label_h = max([0.0] + [_label_size(e.label)[1] for e in inner])
        # room above and below the node row for the labels of arrows inside the group
        row_pad[g] = max(0.0, label_h + 14 - (h_node / 2 - 9)) if inner else 0.0
    pad, pad_top = 22.0, 34.0

    group_w = {g: pad * 2 + len(m) * w_node + (len(m) - 1) * gap_x for g, m in lay.groups.items()}
    group_h = {g: pad_top + 2 * row_pad[g] + h_node + pad for g in lay.groups}
    tier_w = [sum(group_w[g] for g in tier) + 90 * (len(tier) - 1) for tier in lay.tiers]
    between = [e for e in edges if nodes[e.src].group != nodes[e.dst].group]
    gap_y = max([170.0] + [_label_size(e.label)[1] * 2 + 40 for e in between if e.priority == 1])

    margin, top = 40.0, 100.0
    width = max(tier_w) + 2 * margin
    group_box: dict[str, tuple[float, float, float, float]] = {}
    y = top
    for tier, tw in zip(lay.tiers, tier_w):
        x = margin + (max(tier_w) - tw) / 2
        tier_h = max(group_h[g] for g in tier)
        for g in tier:
            top_g = y + (tier_h - group_h[g]) / 2  # groups of a tier share their node row
            group_box[g] = (x, top_g, group_w[g], group_h[g])
            for i, name in enumerate(lay.groups[g]):
                n = nodes[name]
                n.x = x + pad + i * (w_node + gap_x)
                n.y = top_g + pad_top + row_pad[g]
            x += group_w[g] + 90
        y += tier_h + gap_y
    legend_y = y - gap_y + 40
    height = legend_y + 70

    c = Canvas(width, height)
    n_groups = len([g for g in lay.groups if g != EXTERNAL_GROUP])
    c.text(margin, 38, title or "Replication topology", size=20, bold=True)
    instances = f"{len(fabric)} instance{'s' if len(fabric) != 1 else ''}"
    c.text(margin, 60, f"{instances} in {n_groups} group{'s' if n_groups != 1 else ''} "
           "· one arrow per destination address",
           size=12, color="#475569")
    c.text(margin, 76, "label on the preferred arrow: destination · ack type, failover order, PassThrough, "
           "topics (excluded validation checks)", size=12, color="#475569")
    for g, (x, y0, w, h) in group_box.items():
        external = g == EXTERNAL_GROUP
        c.rect(x, y0, w, h, fill="#f8fafc" if not external else "#ffffff", stroke="#94a3b8", width=1.2,
               radius=12, dash=external)
        ty = y0 + h - 10 if external else y0 + 22  # arrows come in from above
        c.text(x + 14, ty, ("Group " + g) if not external else g, size=GROUP_SIZE, bold=True, color="#334155")

    _draw_edges(c, nodes, edges)

    for n in nodes.values():
        c.rect(n.x, n.y, n.w, n.h, fill="#ffffff", stroke="#64748b" if n.external else "#1e293b", width=1.6,
               radius=8, dash=n.external, title=n.name)
        c.text(n.cx, n.y + 22, n.name, size=NAME_SIZE, bold=True, anchor="middle")
        for i, line in enumerate(n.lines):
            c.text(n.cx, n.y + 40 + i * 15, line, size=SUB_SIZE, color="#475569", anchor="middle")

    lx = margin
    for label, color, dash in (
        ("sync (acks wait for it)", SYNC_COLOR, False),
        ("async", ASYNC_COLOR, False),
        ("failover address (used when the ones before it are down)", "#475569", True),
    ):
        c.line([(lx, legend_y), (lx + 46, legend_y)], color=color, width=2, dash=dash)
        c.text(lx + 54, legend_y + 4, label, size=12, color="#334155")
        lx += 54 + text_width(label, 12) + 34
    c.fit(margin)
    return c


def _draw_edges(c: Canvas, nodes: dict[str, Node], edges: list[Edge]) -> None:
    pairs = {(e.src, e.dst) for e in edges}
    # attachment points spread along the bottom/top of a box, ordered by the other end's x
    down_out: dict[str, list[Edge]] = {}
    down_in: dict[str, list[Edge]] = {}
    up_out: dict[str, list[Edge]] = {}
    up_in: dict[str, list[Edge]] = {}
    for e in edges:
        a, b = nodes[e.src], nodes[e.dst]
        if abs(a.y - b.y) < 1:
            continue
        if b.y > a.y:
            down_out.setdefault(e.src, []).append(e)
            down_in.setdefault(e.dst, []).append(e)
        else:
            up_out.setdefault(e.src, []).append(e)
            up_in.setdefault(e.dst, []).append(e)

    def slot(groups: dict[str, list[Edge]], key_end: str) -> dict[int, float]:
        out = {}
        for name, es in groups.items():
            n = nodes[name]
            es = sorted(es, key=lambda e: nodes[e.dst if key_end == "dst" else e.src].cx)
            for k, e in enumerate(es):
                out[id(e)] = n.x + n.w * (k + 1) / (len(es) + 1)
        return out

    x_down_out, x_down_in = slot(down_out, "dst"), slot(down_in, "src")
    x_up_out, x_up_in = slot(up_out, "dst"), slot(up_in, "src")

    labels: list[tuple[float, float, list[str], str]] = []
    # failover arrows first, so the preferred ones are drawn on top
    for e in sorted(edges, key=lambda e: -e.priority):
        a, b = nodes[e.src], nodes[e.dst]
        dash = e.priority > 1
        width = 2.2 if not dash else 1.5
        group = {"class": "link", "data-from": e.src, "data-to": e.dst, "data-destination": e.dest.name,
                 "title": e.title}
        if abs(a.y - b.y) < 1:
            adjacent = not _between(nodes, a, b)
            if adjacent:
                left_to_right = b.x > a.x
                offset = (-9 if left_to_right else 9) if (e.dst, e.src) in pairs else 0
                y = a.cy + offset
                x0, x1 = (a.x + a.w, b.x) if left_to_right else (a.x, b.x + b.w)
                c.line([(x0, y), (x1, y)], color=e.color, width=width, dash=dash, group=group)
                lw, lh = _label_size(e.label)
                ly = y - 8 - lh if offset <= 0 else y + 8
                labels.append(((x0 + x1) / 2 - lw / 2, ly, e.label, e.color))
            else:
                lift = 46 + 14 * (abs(a.x - b.x) // (a.w * 2))
                x0, x1 = a.cx + (12 if b.x > a.x else -12), b.cx
                top = a.y - lift
                pts = [(x0, a.y), (x0, top), (x1, top), (x1, b.y)]
                c.line(pts, color=e.color, width=width, dash=dash, group=group)
                lw, lh = _label_size(e.label)
                labels.append(((x0 + x1) / 2 - lw / 2, top - lh - 4, e.label, e.color))
            continue
        if b.y > a.y:
            p0, p1 = (x_down_out[id(e)], a.y + a.h), (x_down_in[id(e)], b.y)
        else:
            p0, p1 = (x_up_out[id(e)], a.y), (x_up_in[id(e)], b.y + b.h)
        c.line([p0, p1], color=e.color, width=width, dash=dash, group=group)
        t = 0.5 if e.priority == 1 else 0.3
        mx, my = p0[0] + (p1[0] - p0[0]) * t, p0[1] + (p1[1] - p0[1]) * t
        lw, lh = _label_size(e.label)
        labels.append((mx - lw / 2, my - lh / 2, e.label, e.color))
    for x, y, lines, color in labels:
        lw, lh = _label_size(lines)
        c.rect(x, y, lw, lh, fill="#ffffff", stroke=color, width=0.8, radius=4)
        for i, line in enumerate(lines):
            c.text(x + 6, y + 15 + i * LINE, line, size=LABEL_SIZE, bold=(i == 0 and len(lines) > 1), color="#0f172a")


def _between(nodes: dict[str, Node], a: Node, b: Node) -> bool:
    lo, hi = sorted((a.x, b.x))
    return any(abs(n.y - a.y) < 1 and lo < n.x < hi for n in nodes.values())


# --------------------------------------------------------------------------- Mermaid


def _mid(name: str) -> str:
    return "n_" + "".join(ch if ch.isalnum() else "_" for ch in name)


def _mtext(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;").replace("<", "#lt;").replace(">", "#gt;")


def mermaid(fabric: Fabric) -> str:
    """The fabric as a Mermaid flowchart (paste into Markdown that renders Mermaid)."""
    lay = Layout.of(fabric)
    out = ["flowchart TB"]
    for tier in lay.tiers:
        for g in tier:
            out.append(f'  subgraph {_mid("group " + g)}["{_mtext(("Group " + g) if g != EXTERNAL_GROUP else g)}"]')
            out.append("    direction LR")
            for name in lay.groups[g]:
                n = lay.nodes[name]
                body = "<br/>".join([f"<b>{_mtext(n.name)}</b>"] + [_mtext(s) for s in n.lines])
                out.append(f'    {_mid(name)}["{body}"]')
            out.append("  end")
    styles = []
    for i, e in enumerate(lay.edges):
        text = "<br/>".join(_mtext(s) for s in e.label)
        arrow = "-.->" if e.priority > 1 else "-->"
        out.append(f'  {_mid(e.src)} {arrow}|"{text}"| {_mid(e.dst)}')
        styles.append(f"  linkStyle {i} stroke:{e.color},stroke-width:{2 if e.priority == 1 else 1.5}px")
    return "\n".join(out + styles) + "\n"
