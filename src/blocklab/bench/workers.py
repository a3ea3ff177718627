"""The bench's worker processes: each serves JSON jobs from stdin (train, matmul, gemm_floor, train_batched) and answers
on stdout, so that a lane's processes live through the whole bench and every lane is timed in the same rounds."""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..model.fastpath import FastPath, tune_allocator
from ..params_file import load_params
from ..runtime import set_threads
from ..training.batched import train_copy_group_batched
from .flops import capture_step_gemms, matmul_gflops, time_gemm_floor
from .lanes import train_copy_steps

RESULT_TAG = "BLOCKLAB-BENCH-RESULT "  # worker replies are the stdout lines that start with this; anything else is noise


def _worker_main(argv) -> None:
    """Serve JSON commands from stdin, one per line, until EOF. Started by the coordinator, never by hand."""
    fast = FastPath(**json.loads(argv[0]))
    threads = int(argv[1])
    allocator = tune_allocator() if fast.allocator else False
    if threads > 0:
        set_threads(threads)
    params_cache = {}
    _reply({"ready": True, "threads": torch.get_num_threads(), "allocator_tuned": allocator})
    for line in sys.stdin:
        job = json.loads(line)
        if job["op"] == "matmul":
            _reply({"gflops": matmul_gflops(job["seconds"], job["device"])})
        elif job["op"] == "train":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            _reply(train_copy_steps(params, job["norm"], job["warmup"], job["seed"], job["steps"], fast, job["device"],
                                    job.get("model", "blocklab"), job.get("precision", "fp32"),
                                    job.get("diagnostics", False)))
        elif job["op"] == "gemm_floor":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            calls = capture_step_gemms(params, job["norm"], fast, job["device"])
            _reply(time_gemm_floor(calls, job["repeats"], job["device"]))
        elif job["op"] == "train_batched":
            params = params_cache.setdefault(job["params"], load_params(job["params"]))
            replies = []
            for norm in dict.fromkeys(n for n, _, _ in job["runs"]):  # one stacked model per architecture
                group = [(w, s) for n, w, s in job["runs"] if n == norm]
                for reply in train_copy_group_batched(params, norm, group, job["steps"], job["device"], fast,
                                                      job.get("precision", "fp32")):
                    reply.pop("weights")
                    replies.append(reply)
            _reply({"runs": replies})


def _reply(obj) -> None:
    sys.stdout.write(RESULT_TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    """One worker process of a path, driven line by line over pipes."""

    def __init__(self, fast: FastPath, threads: int, env: dict, log: Path):
        began = time.perf_counter()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "blocklab.bench.workers", "--worker", json.dumps(fast.__dict__), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )
        hello = self.receive()
        self.startup_s = time.perf_counter() - began  # python + torch + blocklab imports: paid once per pipeline job
        self.threads, self.allocator_tuned = hello["threads"], hello["allocator_tuned"]

    def send(self, **job) -> None:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
        raise RuntimeError(f"bench worker {self.proc.pid} exited (rc={self.proc.wait()}); see {self.log.name}")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()



if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
