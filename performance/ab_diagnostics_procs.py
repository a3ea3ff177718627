"""Same-process vs separate-process A/B of the training diagnostics' cost: why the bench measures more.

`performance/ab_diagnostics.py` alternates a fast step and a diagnostics step inside one process; `blocklab bench` trains
each lane in its own processes. This script does both at once, steps alternating (rotated order every round), one
thread everywhere: worker ``shared`` holds a fast model and a diagnostics model (the A/B's layout), worker ``fast``
only a fast model, worker ``diag`` only a diagnostics model (the bench's layout). Every step reports the thread's
CPU time (``time.thread_time``: robust to load, not to memory contention), wall time, the thread's minor page
faults and context switches (``getrusage(RUSAGE_THREAD)``) and the time spent in Python's garbage collector.
Each model: the sweep's copy-task model of params.yaml (fast path, fused Adam, its batch; post-norm, seed 0) trained
through ``train._make_step``; every diagnostic at every step (``every`` 1); all four see the same batches and must give
bit-identical losses. `python performance/ab_diagnostics_procs.py [rounds]`, from the repository root.

`... ROUNDS --profile`: the two separate processes only, each under torch.profiler; prints the diagnostics' own
labels and every op's self CPU time in both (largest differences first): which ops a diagnostics process spends more
on, inside and outside the metrics' reads. `... ROUNDS --concurrent`: the bench's own layout, two processes of a lane
stepping at the same time, against the same processes stepping alone (meaningful on an idle machine only).
"""
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

LANES = {"shared": ("fast", "diag"), "fast": ("fast",), "diag": ("diag",)}
PROFILE_LANES = {"fast": ("fast",), "diag": ("diag",)}  # --profile: the bench's layout only, each under torch.profiler


def worker(kinds: list[str], profiled: bool = False) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from blocklab.model.fastpath import FastPath, apply_fast_path, tune_allocator
    from blocklab.params_file import load_params
    from blocklab.training import diagnostics, sweep
    from blocklab.training.tasks import copy_batch, copy_loss
    from blocklab.training.train import _make_step

    torch.set_num_threads(1)
    tune_allocator()
    if profiled:  # each metric's read and the Recorder's moments under their own record_function labels
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from profile_diagnostics import instrument
        instrument(diagnostics)
    params = load_params("params.yaml")
    task = params["copy_task"]
    gc_time = [0.0, None]

    def on_gc(phase, info):
        if phase == "start":
            gc_time[1] = time.thread_time()
        elif gc_time[1] is not None:
            gc_time[0] += time.thread_time() - gc_time[1]

    gc.callbacks.append(on_gc)
    steps, gens, counts = {}, {}, {}
    for kind in kinds:
        model = apply_fast_path(sweep.build_copy_model(sweep.copy_model_config(params, "post"), 0), FastPath())
        opt = torch.optim.Adam(model.parameters(), lr=params["sweep"]["lr"], fused=True)
        recorder = None
        if kind == "diag":
            settings = diagnostics.check_settings({**params["diagnostics"], "enabled": True, "every": 1})
            recorder = diagnostics.Recorder(model, settings["metrics"], 1)
        steps[kind] = _make_step(model, lambda m, b: copy_loss(m(b[0]).float(), b[1]), opt, False, "fp32", recorder)
        gens[kind], counts[kind] = torch.Generator().manual_seed(0), 0
    print(json.dumps({"ready": True}), flush=True)
    prof = None
    for line in sys.stdin:
        job = json.loads(line)
        if profiled and job.get("start_profile") and prof is None:
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        kind = job["kind"]
        batch = copy_batch(task["batch_size"], task["seq_len"], task["vocab_size"], gens[kind])
        counts[kind] += 1
        ru0, gc0, w0, c0 = resource.getrusage(resource.RUSAGE_THREAD), gc_time[0], time.perf_counter(), time.thread_time()
        if prof is not None:
            with record_function(f"step:{kind}"):
                loss = steps[kind](batch, counts[kind])
        else:
            loss = steps[kind](batch, counts[kind])
        c1, w1, ru1 = time.thread_time(), time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
        print(json.dumps({"loss": loss, "cpu": c1 - c0, "wall": w1 - w0, "minflt": ru1.ru_minflt - ru0.ru_minflt,
                          "sys": ru1.ru_stime - ru0.ru_stime, "ivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw,
                          "gc": gc_time[0] - gc0}), flush=True)
    if prof is not None:
        prof.__exit__(None, None, None)
        ops = {e.key: [e.self_cpu_time_total, e.cpu_time_total, e.count] for e in prof.key_averages()}
        print(json.dumps({"ops": ops}), flush=True)


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main(rounds: int, profiled: bool = False) -> None:
    procs, lane_set = {}, PROFILE_LANES if profiled else LANES
    for name, kinds in lane_set.items():
        procs[name] = subprocess.Popen([sys.executable, __file__, "--worker" + ("-profiled" if profiled else ""), *kinds],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for p in procs.values():
        assert json.loads(p.stdout.readline())["ready"]
    lanes = [(name, kind) for name, kinds in lane_set.items() for kind in kinds]
    data = {lane: [] for lane in lanes}
    for r in range(rounds + 2):
        order = lanes[r % len(lanes):] + lanes[:r % len(lanes)]
        line = []
        for name, kind in order:
            procs[name].stdin.write(json.dumps({"kind": kind, "start_profile": r >= 2}) + "\n")
            procs[name].stdin.flush()
            got = json.loads(procs[name].stdout.readline())
            if r >= 2:
                data[name, kind].append(got)
            line.append(f"{name}.{kind} {got['cpu']:.3f} CPU ({got['minflt']} flt, gc {got['gc'] * 1e3:.0f} ms)")
        print(f"round {r + 1}{' (warm-up)' if r < 2 else ''}: " + ", ".join(line), flush=True)
    ops = {}
    for name, p in procs.items():
        p.stdin.close()
        if profiled:
            ops[name] = json.loads(p.stdout.readline())["ops"]
        p.wait()
    losses = {lane: [d["loss"] for d in v] for lane, v in data.items()}
    same = all(v == losses["fast", "fast"] for v in losses.values())
    print(f"losses bit-identical in all four lanes over the timed steps: {same}")
    print(f"one thread, {rounds} rounds; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for lane, v in data.items():
        print(f"{'.'.join(lane):>12}: CPU median {statistics.median(d['cpu'] for d in v):.3f} s, wall median "
              f"{statistics.median(d['wall'] for d in v):.3f} s, sys median {statistics.median(d['sys'] for d in v):.3f} s,"
              f" minor faults median {statistics.median(d['minflt'] for d in v):.0f}, gc {sum(d['gc'] for d in v) / len(v) * 1e3:.1f} ms/step")
    pairs = [("separate processes (bench layout)", ("diag", "diag"), ("fast", "fast"))]
    if not profiled:
        pairs.insert(0, ("same process (A/B layout)", ("shared", "diag"), ("shared", "fast")))
    for label, diag, fast in pairs:
        for clock in ("cpu", "wall"):
            ratios = [d[clock] / f[clock] - 1 for d, f in zip(data[diag], data[fast])]
            lo, mid, hi = quartiles(ratios)
            print(f"{label}, {clock}: diagnostics overhead {mid:+.1%} (quartiles {lo:+.1%} / {hi:+.1%}; ratio of medians "
                  f"{statistics.median(d[clock] for d in data[diag]) / statistics.median(f[clock] for f in data[fast]) - 1:+.1%})")
    if profiled:
        report_ops(ops, rounds)


def main_concurrent(rounds: int) -> None:
    """The bench's layout exactly: two fast processes stepping at the same time, then two diagnostics processes at
    the same time (the bench's lanes: 2 processes x 1 thread each), against the same processes stepping alone, all
    alternating (rotated order every round). What the pair adds over the alone figure is what running the same passes
    side by side (the shared L3 and memory) costs: on an idle machine only."""
    names = {"fast0": "fast", "fast1": "fast", "diag0": "diag", "diag1": "diag"}
    procs = {name: subprocess.Popen([sys.executable, __file__, "--worker", kind], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True) for name, kind in names.items()}
    for p in procs.values():
        assert json.loads(p.stdout.readline())["ready"]
    slots = {"pair.fast": ("fast0", "fast1"), "pair.diag": ("diag0", "diag1"), "alone.fast": ("fast0",),
             "alone.diag": ("diag0",)}
    data, losses = {slot: [] for slot in slots}, {name: [] for name in procs}
    order0 = list(slots)
    for r in range(rounds + 2):
        order, line = order0[r % len(order0):] + order0[:r % len(order0)], []
        for slot in order:
            began = time.perf_counter()
            for name in slots[slot]:
                procs[name].stdin.write(json.dumps({"kind": names[name]}) + "\n")
                procs[name].stdin.flush()
            got = [json.loads(procs[name].stdout.readline()) for name in slots[slot]]
            wall = time.perf_counter() - began
            for name, g in zip(slots[slot], got):
                losses[name].append(g["loss"])
            cpu = statistics.mean(g["cpu"] for g in got)
            if r >= 2:
                data[slot].append({"cpu": cpu, "wall": wall})
            line.append(f"{slot} {cpu:.3f} CPU {wall:.3f} wall")
        print(f"round {r + 1}{' (warm-up)' if r < 2 else ''}: " + ", ".join(line), flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    same = losses["fast0"] == losses["diag0"] and losses["fast1"] == losses["diag1"]
    print(f"losses bit-identical (fast vs diagnostics, each batch sequence): {same}")
    print(f"one thread a process, {rounds} rounds; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for slot, v in data.items():
        print(f"{slot:>10}: CPU median {statistics.median(d['cpu'] for d in v):.3f} s (mean of its processes), "
              f"wall median {statistics.median(d['wall'] for d in v):.3f} s")
    for how in ("pair", "alone"):
        for clock in ("cpu", "wall"):
            ratios = [d[clock] / f[clock] - 1 for d, f in zip(data[f"{how}.diag"], data[f"{how}.fast"])]
            lo, mid, hi = quartiles(ratios)
            print(f"{how}, {clock}: diagnostics overhead {mid:+.1%} (quartiles {lo:+.1%} / {hi:+.1%})")


def report_ops(ops: dict, rounds: int) -> None:
    """Per op (self CPU time, ms a step): the diagnostics process against the fast one, largest differences first;
    the ``diag*`` labels (the metrics' own reads, inclusive time) apart."""
    fast, diag = ops["fast"], ops["diag"]
    step = {k: v[1] / 1e3 / rounds for k, v in (("fast", fast["step:fast"]), ("diag", diag["step:diag"]))}
    print(f"profiled step (CPU ms, mean of {rounds}): fast {step['fast']:.1f}, diag {step['diag']:.1f} "
          f"({step['diag'] / step['fast'] - 1:+.1%})")
    labelled = sum(v[1] for k, v in diag.items() if k.startswith("diag-moment:") or k == "diag:stream_norm"
                   or k.startswith("diag:attn")) / 1e3 / rounds
    print("the diagnostics' own labels (inclusive CPU ms a step, % of the fast step):")
    for k in sorted(k for k in diag if k.startswith("diag")):
        ms = diag[k][1] / 1e3 / rounds
        print(f"  {k:<40} {ms:8.2f} {ms / step['fast']:7.2%}")
    print(f"  (moments + forward reads, roughly: {labelled:.1f} ms)")
    print(f"{'op (self CPU)':<44} {'fast ms':>9} {'diag ms':>9} {'diff ms':>9} {'calls f/d':>12}")
    keys = set(fast) | set(diag)
    diffs = sorted(keys, key=lambda k: -abs(diag.get(k, [0, 0, 0])[0] - fast.get(k, [0, 0, 0])[0]))
    for k in diffs[:30]:
        f, d = fast.get(k, [0, 0, 0]), diag.get(k, [0, 0, 0])
        print(f"{k[:44]:<44} {f[0] / 1e3 / rounds:9.2f} {d[0] / 1e3 / rounds:9.2f} "
              f"{(d[0] - f[0]) / 1e3 / rounds:+9.2f} {f[2] // rounds:>5}/{d[2] // rounds:<6}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("--worker"):
        worker(sys.argv[2:], profiled=sys.argv[1] == "--worker-profiled")
    elif "--concurrent" in sys.argv[2:]:
        main_concurrent(int(sys.argv[1]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 12, "--profile" in sys.argv[2:])
