#!/usr/bin/env python3
"""dsplot end to end: two runs of CSV monitor files -> one SVG. Checks that the
SVG is well-formed XML (Python's expat parser), that every plotted series'
data coordinates equal the CSV values, that its pixel points invert (through
the panel's axis ranges and box) to those values, that input errors exit 1
with one line naming the input and leave no output behind, and that the
outputs are written all or none.
    svg_check.py DSPLOT"""
import csv
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def write_run(d, name, losses, valid):
    os.makedirs(os.path.join(d, name))
    with open(os.path.join(d, name, "train.csv"), "w") as f:
        f.write("iteration,consumed_samples,lr,loss,grad_norm,loss_scale,ms_per_iter,tokens_per_s,tflops\n")
        for i, loss in enumerate(losses, 1):
            f.write("%d,%d,%.8e,%.8e,%.6e,65536,120.500,%.1f,0.0120\n"
                    % (10 * i, 160 * i, 1e-3 * min(i, 3) / 3, loss, 1.0 / i, 20000.0 + 37 * i))
    with open(os.path.join(d, name, "valid.csv"), "w") as f:
        f.write("iteration,loss,ppl\n")
        for it, loss in valid:
            f.write("%d,%.8e,%.8e\n" % (it, loss, math.exp(loss)))
    return os.path.join(d, name)


def csv_columns(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return rows


def run(args):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr


def main():
    dsplot = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        a = write_run(d, "single", [6.2, 5.1, 4.4, 4.05, 3.9, 3.81], [(30, 4.5), (60, 3.95)])
        b = write_run(d, "tp2pp2", [6.2, 5.1000001, 4.4, 4.05, 3.9, 3.8100002], [(30, 4.5), (60, 3.95)])
        out = os.path.join(d, "curves.svg")
        code, stdout, stderr = run([dsplot, a, os.path.join(b, "train.csv"), "--label", "single process",
                                    "--label", "TP2xPP2 <&>", "--metrics", "loss,lr,tokens_per_s", "-o", out])
        check(code == 0, "dsplot exits 0 (%s)" % stderr.strip())
        if code != 0:
            return
        root = ET.parse(out).getroot()  # raises on malformed XML
        check(root.tag == SVG + "svg", "the root element is <svg>")
        panels = root.findall(".//%sg[@class='panel']" % SVG)
        check([p.get("data-metric") for p in panels] == ["loss", "lr", "tokens_per_s"], "one panel per metric")
        check(len({(p.get("data-x0"), p.get("data-x1")) for p in panels}) == 1, "the panels share the x axis")
        legend = "".join(t.text or "" for t in root.iter(SVG + "text"))
        check("TP2xPP2 <&>" in legend and "single process" in legend, "the legend names both runs (escaped)")
        seen = 0
        for panel in panels:
            x0, x1, y0, y1 = (float(panel.get(k)) for k in ("data-x0", "data-x1", "data-y0", "data-y1"))
            left, top, w, h = (float(panel.get(k)) for k in ("data-left", "data-top", "data-width", "data-height"))
            for s in panel.findall("%spolyline" % SVG):
                label, curve = s.get("data-run"), s.get("data-curve")
                src = a if label == "single process" else b
                if curve == "valid_loss":
                    rows = csv_columns(os.path.join(src, "valid.csv"))
                    want_x = [float(r["iteration"]) for r in rows]
                    want_y = [float(r["loss"]) for r in rows]
                else:
                    rows = csv_columns(os.path.join(src, "train.csv"))
                    col = {"train_loss": "loss"}.get(curve, curve)
                    want_x = [float(r["iteration"]) for r in rows]
                    want_y = [float(r[col]) for r in rows]
                xs = [float(v) for v in s.get("data-x").split()]
                ys = [float(v) for v in s.get("data-y").split()]
                check(xs == want_x and ys == want_y, "%s/%s: the plotted values are the CSV values" % (label, curve))
                pts = [tuple(map(float, p.split(","))) for p in s.get("points").split()]
                back = [(x0 + (px - left) / w * (x1 - x0), y0 + (top + h - py) / h * (y1 - y0)) for px, py in pts]
                tol_x, tol_y = 0.006 * (x1 - x0) / w, 0.006 * (y1 - y0) / h  # points carry 2 decimals
                check(len(back) == len(want_x) and all(
                    abs(bx - wx) <= tol_x and abs(by - wy) <= tol_y
                    for (bx, by), wx, wy in zip(back, want_x, want_y)),
                    "%s/%s: the pixel points invert to the CSV values" % (label, curve))
                seen += 1
        check(seen == 2 * 4, "train + valid loss, lr and tokens/s for both runs (got %d series)" % seen)

        # Input errors: exit 1, one line naming the input, no output written.
        bad = os.path.join(d, "bad.svg")
        for args, names in [([os.path.join(d, "missing")], "missing"),
                            ([a, "--metrics", "loss,perplexity"], "perplexity"),
                            ([a, "--x", "tokens"], "--seq-length"),
                            ([a, "--label", "x", "--label", "y"], "--label")]:
            code, stdout, stderr = run([dsplot] + args + ["-o", bad])
            lines = stderr.strip().splitlines()
            check(code == 1 and len(lines) == 1 and names in lines[0] and lines[0].startswith("dsplot: error:"),
                  "%s: one error line naming %s (exit %d: %r)" % (args, names, code, stderr))
            check(not os.path.exists(bad), "%s: nothing written" % args)
        code, _, stderr = run([dsplot, a, "-o", os.path.join(d, "curves.pdf")])
        check(code == 1 and "curves.pdf" in stderr, "an unknown output format is refused by name")
        # All outputs or none: a second output that cannot be written leaves no first one.
        first, second = os.path.join(d, "first.svg"), os.path.join(d, "no", "such", "dir", "second.svg")
        code, _, stderr = run([dsplot, a, "-o", first, "-o", second])
        check(code == 1 and "second.svg" in stderr and len(stderr.strip().splitlines()) == 1,
              "an output that cannot be written is one error line naming it (%r)" % stderr)
        check(not os.path.exists(first), "no output is written when another one fails")
        check(not [f for f in os.listdir(d) if ".tmp." in f], "no temporary files are left")
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("svg_check: all checks passed")


if __name__ == "__main__":
    main()
