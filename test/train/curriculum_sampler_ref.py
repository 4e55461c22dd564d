#!/usr/bin/env python3
"""The data-sampling curriculum's sample order against an independent
transcription of DeepSpeed's DeepSpeedDataSampler (clusters per difficulty
change, choice() over the clusters weighted by size, reshuffle of a cluster
run dry, the batch shuffle, chunks of micro x DP with drop_last), on numpy's
default_rng. Cases: the data-efficiency scripts' pair (vocabulary rarity by
percentile, schedule_based, with seqlen_truncate as a single cluster), a
value-based metric, two schedule_based metrics (intersection), tiny clusters
that run dry, a replayed start, and the errors.
  curriculum_sampler_ref.py PROBE
Exit 77 without numpy."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    sys.exit(77)

PROBE = sys.argv[1]


def schedule_value(m, step):
    """DeepSpeed's CurriculumScheduler.get_difficulty for the schedules used here."""
    lo, hi = m["min_difficulty"], m["max_difficulty"]
    sc = m["schedule_config"]
    if m["schedule_type"] == "fixed_discrete":
        for d, last in zip(sc["difficulty"], sc["max_step"]):
            if step <= last:
                return d
        return sc["difficulty"][-1]
    degree = 1 if m["schedule_type"] == "fixed_linear" else sc["root_degree"]
    v = (float(step) / sc["total_curriculum_step"]) ** (1.0 / degree)
    v = int(np.floor(v * (hi - lo) + lo))
    v -= v % sc["difficulty_step"]
    return min(v, hi)


class Reference:
    def __init__(self, spec):
        de = spec["data_efficiency"]
        cl = de["data_sampling"]["curriculum_learning"]
        self.metrics = cl["curriculum_metrics"]
        self.names = sorted(self.metrics)  # dstrain's order (the samples do not depend on it)
        self.n = spec["one_epoch"]
        self.gb, self.chunk = spec["global_batch"], spec["chunk"]
        self.drop_last = spec.get("drop_last", True)
        self.index = spec.get("index", {})
        self.rng = np.random.default_rng(de.get("seed", 1234))
        self.total = self.n * de["data_sampling"].get("num_epochs", 1000)
        self.cur = {}
        self.sched_cur = {k: self.metrics[k]["min_difficulty"] for k in self.names}
        self.step = 0
        self.clusters = []  # [array, size, pos]
        self.epoch_size = None
        self.batch = []
        self.consumed = 0

    def rows(self, name):
        return [np.array(r, dtype=np.int64) for r in self.index[name]["rows"]]

    def by_value(self, name, above, upto):
        out = [r for r, v in zip(self.rows(name), self.index[name]["metric"]) if above < v <= upto]
        return np.concatenate(out) if out else np.array([], dtype=np.int64)

    def by_percentile(self, name, a, b):
        rows = self.rows(name)
        if self.epoch_size is None:
            self.epoch_size = sum(len(r) for r in rows)
        top = self.metrics[name]["max_difficulty"]
        per = self.epoch_size // top
        lo, hi = per * a, (self.epoch_size if b == top else per * b)
        out, seen = [], 0
        for r in rows:
            if seen + len(r) > lo:
                out.append(r[max(0, lo - seen):(len(r) if seen + len(r) <= hi else hi - seen)])
            seen += len(r)
            if seen >= hi:
                break
        return np.concatenate(out) if out else np.array([], dtype=np.int64)

    def cumulative(self, name):
        m = self.metrics[name]
        if m["clustering_type"] == "single_cluster":
            return np.arange(self.n)
        if m["difficulty_type"] == "value":
            return self.by_value(name, float("-inf"), self.cur[name])
        return self.by_percentile(name, 0, self.cur[name])

    def new_cluster(self, prev):
        clustered = [k for k in self.names if self.metrics[k]["clustering_type"] != "single_cluster"]
        fresh = None
        if len(clustered) > 1:
            for k in self.names:
                part = self.cumulative(k)
                fresh = part if fresh is None else np.intersect1d(fresh, part, assume_unique=True)
            for c in self.clusters:
                fresh = np.setdiff1d(fresh, c[0], assume_unique=True)
        else:
            if not self.clusters:
                fresh = np.arange(self.n)
            for k in clustered:
                if self.metrics[k]["difficulty_type"] == "value":
                    fresh = self.by_value(k, prev[k], self.cur[k])
                else:
                    fresh = self.by_percentile(k, prev[k], self.cur[k])
        if fresh is not None and len(fresh) > 0:
            fresh = np.array(fresh)
            self.rng.shuffle(fresh)
            self.clusters.append([fresh, len(fresh), 0])

    def take(self, c, k):
        arr, _, pos = c
        got = list(arr[pos:pos + k])
        c[2] = pos + k
        if len(got) < k:
            rest = k - len(got)
            arr = np.copy(arr)
            self.rng.shuffle(arr)
            c[0] = arr
            got += list(arr[:rest])
            c[2] = rest
        return got

    def global_batch(self):
        self.step += 1
        changed, prev = False, {}
        for k in self.names:
            m = self.metrics[k]
            if self.sched_cur[k] < m["max_difficulty"]:
                self.sched_cur[k] = schedule_value(m, self.step)
            nxt = self.sched_cur[k]
            if k not in self.cur or nxt != self.cur[k]:
                changed = True
            if k in self.cur:
                prev[k] = self.cur[k]
            else:
                prev[k] = float("-inf") if m["difficulty_type"] == "value" else 0
            self.cur[k] = nxt
        if changed:
            self.new_cluster(prev)
        sizes = [c[1] for c in self.clusters]
        w = [s / sum(sizes) for s in sizes]
        counts = np.bincount(self.rng.choice(len(self.clusters), self.gb, replace=True, p=w),
                             minlength=len(self.clusters))
        batch = []
        for c, k in zip(self.clusters, counts):
            batch += self.take(c, k)
        self.rng.shuffle(batch)
        self.batch = [int(x) for x in batch]

    def chunks(self, count):
        out = []
        while len(out) < count and self.consumed <= self.total:
            if not self.batch:
                self.global_batch()
            cur, self.batch = self.batch[:self.chunk], self.batch[self.chunk:]
            if len(cur) == self.chunk:
                out.append((self.step, [self.cur[k] for k in self.names], cur))
                self.consumed += len(cur)
        return out


def probe(spec):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        r = subprocess.run([PROBE, f.name], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stdout


def parse(out):
    res = []
    for line in out.strip().splitlines():
        if not line.startswith("chunk "):
            continue  # the sampler's log lines
        head, samples = line[len("chunk "):].split("|")
        head = [int(x) for x in head.split()]
        res.append((head[0], head[1:], [int(x) for x in samples.split()]))
    return res


def metric(kind, clustering, lo, hi, schedule="fixed_linear", total=10, step=1, root=None, **paths):
    sc = {"total_curriculum_step": total, "difficulty_step": step}
    if root is not None:
        sc["root_degree"] = root
    m = {"difficulty_type": kind, "clustering_type": clustering, "min_difficulty": lo, "max_difficulty": hi,
         "schedule_type": schedule, "schedule_config": sc}
    m.update(paths)
    return m


def section(metrics, seed=1234, epochs=1000):
    return {"enabled": True, "seed": seed,
            "data_sampling": {"enabled": True, "num_epochs": epochs, "num_workers": 0,
                              "curriculum_learning": {"enabled": True, "data_cluster_path": "/tmp/unused",
                                                      "curriculum_metrics": metrics}}}


def analysis(n, values, rows_per_value=None, seed=0):
    """Synthetic index files: sample -> metric value, grouped by ascending value."""
    g = np.random.default_rng(seed)
    v = g.integers(0, values, size=n)
    uniq = sorted(set(v.tolist()))
    rows = [[int(s) for s in np.nonzero(v == u)[0]] for u in uniq]
    return {"rows": rows, "metric": uniq}


def merged(ix, parts):
    """index_to_sample_percentile_merged: consecutive rows concatenated."""
    step = max(1, len(ix["rows"]) // parts)
    return {"rows": [sum(ix["rows"][i:i + step], []) for i in range(0, len(ix["rows"]), step)]}


failures = []


def check(name, spec, count):
    rc, out = probe(dict(spec, chunks=count))
    if rc != 0:
        failures.append(f"{name}: probe failed: {out.strip()}")
        return
    ours = parse(out)
    start = spec.get("start", 0)
    ref = Reference(spec).chunks(count)[start:]
    if ours != ref:
        first = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        failures.append(f"{name}: chunk {first + start} differs: ours {ours[first] if first < len(ours) else None} "
                        f"reference {ref[first] if first < len(ref) else None}")
    else:
        print(f"ok {name}: {len(ours)} chunks")


N = 500
voc = analysis(N, 37, seed=1)
# The scripts' pair: vocabulary rarity by percentile (schedule_based, fixed_root) and seqlen_truncate.
pair = {"voc": metric("percentile", "schedule_based", 1, 100, "fixed_root", total=30, step=1, root=2,
                      index_to_sample_path="x", index_to_metric_path="y"),
        "seqlen_truncate": metric("value", "single_cluster", 8, 64, total=25, step=8)}
base = {"one_epoch": N, "global_batch": 16, "chunk": 4, "drop_last": True, "index": {"voc": merged(voc, 100)}}
check("voc percentile + seqlen_truncate", dict(base, data_efficiency=section(pair)), 200)
check("same, seed 7", dict(base, data_efficiency=section(pair, seed=7)), 120)
check("replayed start", dict(base, data_efficiency=section(pair), start=57), 90)
# A value-based schedule_based metric (index_to_metric rows) alone.
val = {"rarity": metric("value", "schedule_based", 3, 36, total=40, step=3, index_to_sample_path="x",
                        index_to_metric_path="y")}
check("value-based", dict(base, data_efficiency=section(val), index={"rarity": voc}), 200)
# Two schedule_based metrics: the intersection of their cumulative sets, less earlier clusters.
two = {"a": metric("value", "schedule_based", 5, 36, total=20, step=1, index_to_sample_path="x",
                   index_to_metric_path="y"),
       "b": metric("percentile", "schedule_based", 2, 10, "fixed_discrete", index_to_sample_path="x")}
two["b"]["schedule_config"] = {"difficulty": [2, 5, 10], "max_step": [6, 12]}
other = analysis(N, 23, seed=2)
check("two schedule_based metrics", dict(base, data_efficiency=section(two), index={"a": voc, "b": merged(other, 10)}),
      160)
# Tiny clusters that run dry and reshuffle (a global batch larger than a cluster).
tiny_ix = {"rows": [[0, 1, 2], [3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]], "metric": [1, 2, 3]}
tiny = {"t": metric("value", "schedule_based", 1, 3, total=30, step=1, index_to_sample_path="x",
                    index_to_metric_path="y")}
check("tiny clusters", {"one_epoch": 20, "global_batch": 8, "chunk": 2, "index": {"t": tiny_ix},
                        "data_efficiency": section(tiny, seed=3)}, 120)
# A single cluster only (seqlen_truncate alone): every sample in one shuffled cluster, reshuffled per epoch.
only = {"seqlen_truncate": metric("value", "single_cluster", 16, 64, total=10, step=16)}
check("seqlen_truncate alone", {"one_epoch": 37, "global_batch": 12, "chunk": 6, "data_efficiency": section(only)}, 60)

# Errors: the stream used up, and a global batch too small for a micro-step.
rc, out = probe({"one_epoch": 10, "global_batch": 4, "chunk": 2, "chunks": 30,
                 "data_efficiency": section(only, epochs=2)})
if rc != 1 or "used up" not in out:
    failures.append(f"used-up stream: rc {rc}, {out.strip()[-200:]}")
rc, out = probe({"one_epoch": 20, "global_batch": 8, "chunk": 4, "chunks": 3, "drop_last": False,
                 "index": {"t": {"rows": [[5], [6, 7, 8, 9, 10, 11, 12, 13, 14]], "metric": [1, 9]}},
                 "data_efficiency": section({"t": metric("value", "schedule_based", 1, 9, total=1000,
                                                         step=1, index_to_sample_path="x",
                                                         index_to_metric_path="y")})})
if rc != 1 or "micro-step" not in out:
    failures.append(f"short batch without drop_last: rc {rc}, {out.strip()[-200:]}")

for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
