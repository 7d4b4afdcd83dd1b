#!/usr/bin/env python3
"""Draw a convweave Chrome trace (cw_plan_write_trace) as an SVG timeline.

One lane per stream (trace tid) with a box per task coloured by category, a time axis in
ms, and below it the "temp bytes" counter as a step curve. Stdlib only.

    python3 tools/trace_svg.py trace.json -o timeline.svg
    python3 tools/trace_svg.py trace.json -o timeline.png   # needs rsvg-convert or cairosvg
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from html import escape

# Category colours (the stage kinds of cw_plan_stats; unknown ones cycle through EXTRA).
COLORS = {
    "conv": "#4c78a8",
    "prep": "#54a24b",
    "epilogue": "#f58518",
    "stats": "#b279a2",
    "attention": "#e45756",
    "other": "#9d9d9d",
    "run": "#72b7b2",
}
EXTRA = ["#eeca3b", "#ff9da6", "#9d755d", "#bab0ac", "#88d27a", "#83bcb6"]
ORDER = ["conv", "prep", "epilogue", "stats", "attention", "other", "run"]

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
CHAR_W = 6.1  # mean glyph width at 10.5 px, for fitting labels into boxes
COUNTER_NAME = "temp bytes"


class TraceError(Exception):
    pass


def load(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise TraceError(f"cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise TraceError(f"{path} is not JSON: {e}")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents array")
    title, lanes, tasks, counter = None, {}, [], []
    for e in events:
        if not isinstance(e, dict):
            continue
        ph, name, args = e.get("ph"), e.get("name"), e.get("args") or {}
        if ph == "M" and name == "process_name":
            title = args.get("name", title)
        elif ph == "M" and name == "thread_name":
            lanes[e.get("tid", 0)] = str(args.get("name", ""))
        elif ph == "X":
            try:
                ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                continue
            tasks.append({"name": str(name or ""), "cat": str(e.get("cat") or "other"),
                          "tid": e.get("tid", 0), "ts": ts, "dur": max(dur, 0.0), "args": args})
        elif ph == "C" and name == COUNTER_NAME:
            try:
                counter.append((float(e["ts"]), float(args["bytes"])))
            except (KeyError, TypeError, ValueError):
                continue
    counter.sort(key=lambda p: p[0])
    return title, lanes, tasks, counter


def nice_step(span, target):
    """A 1/2/5 x 10^k step giving about `target` intervals over span."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_num(v, step):
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{decimals}f}"


def byte_unit(peak):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if peak >= scale:
            return unit, float(scale)
    return "B", 1.0


def color_of(cat, extra):
    if cat in COLORS:
        return COLORS[cat]
    if cat not in extra:
        extra[cat] = EXTRA[len(extra) % len(EXTRA)]
    return extra[cat]


def text_on(hexcolor):
    r, g, b = (int(hexcolor[i:i + 2], 16) for i in (1, 3, 5))
    return "#1a1a1a" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def pack_rows(items):
    """Greedy sub-rows within a lane so overlapping (nested) events do not hide each other."""
    ends = []
    for t in sorted(items, key=lambda t: (t["ts"], -t["dur"])):
        for i, end in enumerate(ends):
            if t["ts"] >= end - 1e-9:
                t["row"], ends[i] = i, t["ts"] + t["dur"]
                break
        else:
            t["row"] = len(ends)
            ends.append(t["ts"] + t["dur"])
    return max(1, len(ends))


def render(title, lanes, tasks, counter, width=1400):
    if not tasks and not counter:
        raise TraceError("the trace has no task events and no temp-bytes counter")
    left, right, top = 170.0, 30.0, 64.0
    row_h, lane_gap = 22.0, 8.0
    plot_w = width - left - right
    t_end = max([t["ts"] + t["dur"] for t in tasks] + [p[0] for p in counter] + [0.0])
    t_start = min([t["ts"] for t in tasks] + [p[0] for p in counter] + [0.0])
    # 1% slack on the right so a last step of the counter (the final free) stays visible
    span_us = max(t_end - t_start, 1e-3) * 1.01

    def x_of(ts):
        return left + (ts - t_start) / span_us * plot_w

    tids = sorted(set(lanes) | {t["tid"] for t in tasks}, key=lambda v: (str(type(v)), v))
    by_lane = {tid: [t for t in tasks if t["tid"] == tid] for tid in tids}
    rows = {tid: pack_rows(by_lane[tid]) for tid in tids}

    out, extra = [], {}
    y = top
    lane_y = {}
    for tid in tids:
        lane_y[tid] = y
        y += rows[tid] * row_h + lane_gap
    lanes_bottom = y - lane_gap
    axis_y = lanes_bottom + 10
    counter_top = axis_y + 46
    counter_h = 150.0 if counter else 0.0
    height = counter_top + counter_h + (44 if counter else 0) + 10

    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
               f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">')
    out.append(f'<rect width="100%" height="100%" fill="#ffffff"/>')
    heading = title or "convweave trace"
    n_streams = len(tids)
    out.append(f'<text x="{left:.1f}" y="26" font-size="17" font-weight="bold" fill="#222">{escape(heading)}</text>')
    out.append(f'<text x="{left:.1f}" y="45" font-size="11.5" fill="#666">{len(tasks)} tasks on {n_streams} '
               f'stream{"s" if n_streams != 1 else ""}, {span_us / 1000:.3f} ms</text>')

    # legend (categories present, in stage order), right-aligned on the title line
    cats = [c for c in ORDER if any(t["cat"] == c for t in tasks)]
    cats += sorted({t["cat"] for t in tasks} - set(cats))
    lx = width - right
    for c in reversed(cats):
        w = 16 + len(c) * CHAR_W + 14
        lx -= w
        out.append(f'<rect x="{lx:.1f}" y="17" width="11" height="11" rx="2" fill="{color_of(c, extra)}"/>')
        out.append(f'<text x="{lx + 15:.1f}" y="26.5" font-size="11" fill="#333">{escape(c)}</text>')

    # time grid + axis
    step_ms = nice_step(span_us / 1000.0, 10)
    first = math.ceil(t_start / 1000.0 / step_ms) * step_ms
    ticks, v = [], first
    while v <= t_end / 1000.0 + step_ms * 1e-6:
        ticks.append(v)
        v += step_ms
    grid_bottom = counter_top + counter_h if counter else axis_y
    for v in ticks:
        x = x_of(v * 1000.0)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4:.1f}" x2="{x:.1f}" y2="{grid_bottom:.1f}" '
                   f'stroke="#e6e6e6" stroke-width="1"/>')

    # lanes
    for i, tid in enumerate(tids):
        ly, lh = lane_y[tid], rows[tid] * row_h
        if i % 2 == 0:
            out.append(f'<rect x="{left:.1f}" y="{ly - 2:.1f}" width="{plot_w:.1f}" height="{lh + 4:.1f}" '
                       f'fill="#f6f7f9"/>')
        label = lanes.get(tid) or f"tid {tid}"
        out.append(f'<text x="{left - 10:.1f}" y="{ly + lh / 2 + 4:.1f}" font-size="12" fill="#333" '
                   f'text-anchor="end">{escape(label)}</text>')
        for t in by_lane[tid]:
            x0 = x_of(t["ts"])
            w = max((t["dur"]) / span_us * plot_w, 0.8)
            by = ly + t["row"] * row_h + 1
            bh = row_h - 3
            fill = color_of(t["cat"], extra)
            tip = f'{t["name"]} [{t["cat"]}] {t["ts"] / 1000:.3f} ms + {t["dur"] / 1000:.3f} ms'
            out.append(f'<g><title>{escape(tip)}</title>'
                       f'<rect x="{x0:.2f}" y="{by:.1f}" width="{w:.2f}" height="{bh:.1f}" rx="2" fill="{fill}" '
                       f'stroke="#ffffff" stroke-width="0.6"/>')
            fit = int((w - 6) / CHAR_W)
            if fit >= 4:
                name = t["name"] if len(t["name"]) <= fit else t["name"][:fit - 1] + "\u2026"
                out.append(f'<text x="{x0 + 3:.2f}" y="{by + bh / 2 + 3.8:.1f}" font-size="10.5" '
                           f'fill="{text_on(fill)}">{escape(name)}</text>')
            out.append("</g>")

    # time axis
    out.append(f'<line x1="{left:.1f}" y1="{axis_y:.1f}" x2="{left + plot_w:.1f}" y2="{axis_y:.1f}" '
               f'stroke="#555" stroke-width="1"/>')
    for v in ticks:
        x = x_of(v * 1000.0)
        out.append(f'<line x1="{x:.1f}" y1="{axis_y:.1f}" x2="{x:.1f}" y2="{axis_y + 5:.1f}" stroke="#555"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 18:.1f}" font-size="11" fill="#333" '
                   f'text-anchor="middle">{fmt_num(v, step_ms)}</text>')
    out.append(f'<text x="{left + plot_w:.1f}" y="{axis_y + 33:.1f}" font-size="11" fill="#555" '
               f'text-anchor="end">time (ms)</text>')

    # temp-bytes counter: step curve (a value holds until the next sample)
    if counter:
        peak = max(b for _, b in counter)
        unit, scale = byte_unit(peak)
        top_val = peak / scale if peak > 0 else 1.0
        ystep = nice_step(top_val, 4)
        ymax = math.ceil(top_val / ystep) * ystep if top_val > 0 else 1.0
        if ymax <= 0:
            ymax = 1.0
        cy0 = counter_top + counter_h

        def y_of(b):
            return cy0 - (b / scale) / ymax * counter_h

        out.append(f'<text x="{left - 10:.1f}" y="{counter_top - 12:.1f}" font-size="12" fill="#333" '
                   f'text-anchor="end">temp in use</text>')
        v = 0.0
        while v <= ymax + ystep * 1e-6:
            yy = cy0 - v / ymax * counter_h
            out.append(f'<line x1="{left:.1f}" y1="{yy:.1f}" x2="{left + plot_w:.1f}" y2="{yy:.1f}" '
                       f'stroke="#e6e6e6"/>')
            out.append(f'<text x="{left - 8:.1f}" y="{yy + 4:.1f}" font-size="11" fill="#333" '
                       f'text-anchor="end">{fmt_num(v, ystep)} {unit}</text>')
            v += ystep
        pts = []
        prev = None
        for ts, b in counter:
            x = x_of(ts)
            if prev is not None:
                pts.append((x, y_of(prev)))
            pts.append((x, y_of(b)))
            prev = b
        pts.append((x_of(t_end), y_of(prev)))
        line = " ".join(f"{x:.2f},{yy:.2f}" for x, yy in pts)
        area = f"{pts[0][0]:.2f},{cy0:.2f} " + line + f" {pts[-1][0]:.2f},{cy0:.2f}"
        out.append(f'<polygon points="{area}" fill="#4c78a8" fill-opacity="0.18"/>')
        out.append(f'<polyline points="{line}" fill="none" stroke="#2f5f8f" stroke-width="1.6"/>')
        py = y_of(peak)
        out.append(f'<line x1="{left:.1f}" y1="{py:.1f}" x2="{left + plot_w:.1f}" y2="{py:.1f}" '
                   f'stroke="#d62728" stroke-width="1" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{left + plot_w - 4:.1f}" y="{py - 5:.1f}" font-size="11" fill="#d62728" '
                   f'text-anchor="end">peak {peak / scale:.3g} {unit}</text>')
        out.append(f'<line x1="{left:.1f}" y1="{cy0:.1f}" x2="{left + plot_w:.1f}" y2="{cy0:.1f}" '
                   f'stroke="#555"/>')
        out.append(f'<line x1="{left:.1f}" y1="{counter_top:.1f}" x2="{left:.1f}" y2="{cy0:.1f}" stroke="#555"/>')
        for v in ticks:
            x = x_of(v * 1000.0)
            out.append(f'<line x1="{x:.1f}" y1="{cy0:.1f}" x2="{x:.1f}" y2="{cy0 + 5:.1f}" stroke="#555"/>')
            out.append(f'<text x="{x:.1f}" y="{cy0 + 18:.1f}" font-size="11" fill="#333" '
                       f'text-anchor="middle">{fmt_num(v, step_ms)}</text>')
        out.append(f'<text x="{left + plot_w:.1f}" y="{cy0 + 33:.1f}" font-size="11" fill="#555" '
                   f'text-anchor="end">time (ms)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_png(svg_text, png_path):
    """Returns a sentence saying how the PNG was made, or raises TraceError."""
    exe = shutil.which("rsvg-convert")
    if exe:
        r = subprocess.run([exe, "-f", "png", "-o", png_path], input=svg_text.encode("utf-8"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode == 0:
            return f"rendered with {exe}"
        raise TraceError(f"rsvg-convert failed: {r.stderr.decode(errors='replace').strip()}")
    try:
        import cairosvg  # optional, not stdlib
    except ImportError:
        raise TraceError("no PNG renderer: install rsvg-convert (apt librsvg2-bin) or the cairosvg module")
    cairosvg.svg2png(bytestring=svg_text.encode("utf-8"), write_to=png_path)
    return "rendered with cairosvg"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Draw a convweave Chrome trace as an SVG (or PNG) timeline.")
    ap.add_argument("trace", help="trace JSON written by cw_plan_write_trace")
    ap.add_argument("-o", "--output", required=True, help="output .svg, or .png (needs rsvg-convert or cairosvg)")
    ap.add_argument("--width", type=int, default=1400, help="image width in px (default 1400)")
    ap.add_argument("--title", help="title (default: the trace's process_name)")
    a = ap.parse_args(argv)
    if a.width < 400:
        ap.error("--width must be at least 400")
    try:
        title, lanes, tasks, counter = load(a.trace)
        svg = render(a.title or title, lanes, tasks, counter, a.width)
        if a.output.lower().endswith(".png"):
            svg_path = os.path.splitext(a.output)[0] + ".svg"
            with open(svg_path, "w", encoding="utf-8") as f:
                f.write(svg)
            try:
                how = to_png(svg, a.output)
            except TraceError as e:
                print(f"trace_svg: {e}; wrote {svg_path} only", file=sys.stderr)
                return 3
            print(f"trace_svg: wrote {a.output} ({how}) and {svg_path}")
        else:
            with open(a.output, "w", encoding="utf-8") as f:
                f.write(svg)
            print(f"trace_svg: wrote {a.output}: {len(tasks)} tasks, {len(set(t['tid'] for t in tasks))} "
                  f"streams, {len(counter)} counter samples")
    except TraceError as e:
        print(f"trace_svg: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"trace_svg: cannot write {a.output}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
