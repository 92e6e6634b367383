#!/usr/bin/env python3
"""Peak memory of a process tree, and the JSON line of one scale run (used by scale-runs.sh).

  procpeak.py PID
      Samples /proc once a second while PID lives: VmHWM (peak resident set) and VmRSS of PID and
      of every descendant JVM, by role (driver, executor, other). Prints one JSON object at the end.

  procpeak.py --report NAME RC WALL_S LOAD_START LOAD_END NAIVE_BYTES LOG PEAK_JSON [EVENT_LOG...]
      Prints the run's JSON line: the sampled peaks, the job's own summary parsed from LOG, the
      Spark event log summarised (largest task's peak execution memory and shuffle read, spill,
      shuffle and input totals, largest task result sent to the driver), and the naive T x T bytes.
"""
import json
import os
import re
import sys
import time


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            kids.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError):
            pass
    return kids


def tree(root):
    kids, out, todo = children_map(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def status(pid):
    r = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "Name"):
                    r[k] = v.strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace")
    except OSError:
        return None
    if r.get("Name") != "java" or "VmHWM" not in r:  # not a JVM, or a zombie (no memory figures)
        return None
    role = "executor" if "CoarseGrainedExecutorBackend" in cmd else (
        "driver" if "LongctxMain" in cmd else "other-jvm")
    xmx = re.findall(r"-Xmx(\w+)", cmd)
    return {"role": role, "hwm_kb": int(r["VmHWM"].split()[0]), "rss_kb": int(r["VmRSS"].split()[0]),
            "xmx": xmx[-1] if xmx else None}


def sample(root):
    peaks, max_total = {}, 0
    while os.path.exists(f"/proc/{root}"):
        total = 0
        for p in tree(root):
            s = status(p)
            if s is None:
                continue
            total += s["rss_kb"]
            old = peaks.get(p)
            if old is None or s["hwm_kb"] >= old["hwm_kb"]:
                peaks[p] = s
        max_total = max(max_total, total)
        time.sleep(1)
    print(json.dumps({"jvms": [dict(pid=p, role=s["role"], xmx=s["xmx"], peak_rss_mb=round(s["hwm_kb"] / 1024, 1))
                               for p, s in sorted(peaks.items())],
                      "peak_sum_rss_mb": round(max_total / 1024, 1)}))


def parse_log(path):
    text = open(path, errors="replace").read()
    r = {}
    pats = {
        "tokens": r"^\s*tokens\s+(\d+)", "queries": r"^\s*queries\s+(\d+)", "chunks": r"^\s*chunks\s+(\d+)",
        "pairs_computed": r"chunk pairs\s+(\d+) computed", "pairs_skipped": r"computed, (\d+) skipped",
        "job_wall_s": r"^\s*(?:wall time|job wall time)\s+([\d.]+) s", "tokens_per_s": r"^\s*tokens/s\s+([\d.]+)",
        "kernel_only_s": r"kernel-only time\s+([\d.]+) s", "kernel_gflops": r"pairs, ([\d.]+) GFLOP/s",
        "spark_overhead": r"Spark overhead\s+([\d.]+)x", "gen_s": r"longctx gen: .*\(([\d.]+) s\)",
        "split_above": r"^\s*split above\s+(\d+)", "split_chunks": r"split into (\d+) chunks",
        "shuffle_bytes_per_token_layer": r"shuffle ([\d.]+) bytes/token/layer",
        "layer_slowest_task_s": r"the slowest task takes ([\d.]+) s", "layer_task_spread": r"s, ([\d.]+)x the mean task",
    }
    for k, p in pats.items():
        m = re.findall(p, text, re.M)
        if m:
            r[k] = float(m[-1]) if "." in m[-1] else int(m[-1])
    err = [l for l in text.splitlines() if "error:" in l or "failed:" in l or "OutOfMemoryError" in l]
    if err:
        r["error"] = err[0][:300]
    return r


def parse_events(files):
    agg = {"tasks": 0, "failed_tasks": 0, "stages": set(), "max_task_peak_exec_mem_mb": 0.0,
           "max_task_shuffle_read_mb": 0.0, "max_task_result_kb": 0.0, "shuffle_written_mb": 0.0,
           "spilled_disk_mb": 0.0, "spilled_mem_mb": 0.0, "input_mb": 0.0, "max_task_input_mb": 0.0}
    mb = 1 / (1 << 20)
    paths = []
    for path in files:  # Spark 4 writes a rolling log: a directory eventlog_v2_<app> of events_N_<app> files
        if os.path.isdir(path):
            paths += sorted((os.path.join(path, n) for n in os.listdir(path) if n.startswith("events_")),
                            key=lambda p: int(re.search(r"events_(\d+)_", p).group(1)))
        elif os.path.isfile(path):
            paths.append(path)
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                if '"SparkListenerTaskEnd"' not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:  # the last line of a log still being written
                    continue
                m = e.get("Task Metrics") or {}
                agg["tasks"] += 1
                if e.get("Task End Reason", {}).get("Reason") != "Success":
                    agg["failed_tasks"] += 1
                agg["stages"].add(e.get("Stage ID"))
                sr = m.get("Shuffle Read Metrics", {})
                read = (sr.get("Remote Bytes Read", 0) + sr.get("Local Bytes Read", 0)) * mb
                agg["max_task_shuffle_read_mb"] = max(agg["max_task_shuffle_read_mb"], read)
                agg["max_task_peak_exec_mem_mb"] = max(agg["max_task_peak_exec_mem_mb"],
                                                       m.get("Peak Execution Memory", 0) * mb)
                agg["max_task_result_kb"] = max(agg["max_task_result_kb"], m.get("Result Size", 0) / 1024)
                agg["shuffle_written_mb"] += m.get("Shuffle Write Metrics", {}).get("Shuffle Bytes Written", 0) * mb
                agg["spilled_disk_mb"] += m.get("Disk Bytes Spilled", 0) * mb
                agg["spilled_mem_mb"] += m.get("Memory Bytes Spilled", 0) * mb
                inp = m.get("Input Metrics", {}).get("Bytes Read", 0) * mb
                agg["input_mb"] += inp
                agg["max_task_input_mb"] = max(agg["max_task_input_mb"], inp)
    if agg["tasks"] == 0:
        return None
    agg["stages"] = len(agg["stages"])
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in agg.items()}


def report(argv):
    name, rc, wall, load0, load1, naive, log, peak = argv[:8]
    r = {"run": name, "rc": int(rc), "wall_s": float(wall), "load1_start": float(load0), "load1_end": float(load1),
         "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    r.update(parse_log(log))
    try:
        r.update(json.load(open(peak)))
    except (OSError, ValueError):
        pass
    ev = parse_events(argv[8:])
    if ev:
        r["spark"] = ev
    if int(naive) > 0:
        r["naive_scores_gib"] = round(int(naive) / (1 << 30), 2)
    print(json.dumps(r))


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2:])
    else:
        sample(int(sys.argv[1]))
