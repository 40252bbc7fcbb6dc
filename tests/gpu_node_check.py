"""The GPU-only paths that no CPU run can show, checked on a real GPU node in about a minute (no vLLM needed).

    python tests/gpu_node_check.py      # prints one JSON line per check; exit 1 when one fails

1. fork after mentor's engine-platform check: a forked child initialises CUDA and allocates
   (it must work); the control: after ``torch.cuda.is_available()`` without vLLM's
   ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, the same fork fails ("Cannot re-initialize CUDA in forked
   subprocess"), which is what mentor's old check did to vLLM's EngineCore;
2. dask engine workers (`mentor.pipeline.executor.dask_client`) each see only their own
   ``CUDA_VISIBLE_DEVICES`` and can use that GPU;
3. ``mentor doctor --no-engine``: on a node without vLLM it must say so plainly.

Each check runs in a fresh interpreter, so one's CUDA state never leaks into the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

FORK = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys
    os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
    import torch
    if sys.argv[1] == "mentor":
        from mentor.pipeline.backends.vllm.engine import is_cpu_build
        on_cpu = is_cpu_build()
    else:
        on_cpu = not torch.cuda.is_available()  # the old check: initialises the CUDA driver here
    def child(q):
        try:
            x = torch.ones(1024, device="cuda")
            q.put(f"ok {float(x.sum())}")
        except Exception as exc:
            q.put(f"{type(exc).__name__}: {exc}")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); p.join(120)
    print(json.dumps({"on_cpu": on_cpu, "parent_cuda_initialized": torch.cuda.is_initialized(), "child": q.get(timeout=5)}))
""")

DASK = textwrap.dedent("""
    import json, torch
    from mentor.pipeline.devices import local_gpus
    from mentor.pipeline.executor import dask_client
    def seen():
        import os, torch
        x = torch.ones(8, device="cuda")
        return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
                "sum": float(x.sum()), "name": torch.cuda.get_device_name(0)}
    if __name__ == "__main__":
        n = len(local_gpus())
        with dask_client(workers=n) as client:
            print(json.dumps({"gpus": n, "workers": client.run(seen)}))
""")


def run(name: str, cmd: list[str], timeout: int = 300) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
    out = {"check": name, "exit": proc.returncode}
    if lines:
        out["got"] = json.loads(lines[-1])
    else:
        out["stderr"] = proc.stderr[-1500:]
    return out


def main() -> int:
    results = [
        run("fork after mentor's check", [sys.executable, "-c", FORK, "mentor"]),
        run("fork after torch.cuda.is_available (control)", [sys.executable, "-c", FORK, "torch"]),
        run("dask engine workers' GPUs", [sys.executable, "-c", DASK]),
        run("mentor doctor", [sys.executable, "-m", "mentor.workflows.cli", "doctor", "--no-engine", "--json", "--out", "/tmp"]),
    ]
    for r in results:
        print(json.dumps(r), flush=True)
    mentor_fork, control, workers, doc = results
    ok = (str(mentor_fork.get("got", {}).get("child", "")).startswith("ok")
          and "re-initialize CUDA" in str(control.get("got", {}).get("child", ""))
          and all(w.get("count") == 1 for w in workers.get("got", {}).get("workers", {}).values())
          and any(c["name"] == "vLLM" for c in doc.get("got", [])))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
