"""The peer experiment's torch worker and its protocol: the torch arms run in their OWN process
(`python -m lab.measure.peer_worker`), because once torch has run kernels in a process every
later CUDA graph node in it (numba's too) replays about 0.18 us slower.

Protocol, JSON lines: the worker says {"event": "imported", "torch"} (or an import error), reads
one setup line, builds and warms up its arms, says {"event": "ready", ...info}; then for each
{"cmd": "rep", "rep": i} it answers {"event": "rep", "order", "data"}, and for {"cmd": "quit"}
{"event": "bye", "compile_counters"}. Any failure is {"event": "error", "kind", "message"}.
"""
from __future__ import annotations

import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from lab.model import load_model
from lab.measure.peer_torch import (TORCH_ARMS, CompileRunner, GraphRunner, build_torch_decoder,
                                    compile_counters, inductor_graph_runner, keep_cudagraph_skips,
                                    torch_settings)
from lab.measure.stats import collector_off, rotated

REPO = Path(__file__).resolve().parents[2]


class TorchPeer:
    """The worker's side: the decoder, the arms, their warm-up, and one rep at a time."""

    def __init__(self, setup: dict, log):
        import torch
        self.torch, self.log = torch, log
        torch.set_grad_enabled(False)
        self.settings = torch_settings(torch)
        dev = torch.device(setup["device"])
        self.dev = dev
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (torch.cuda.is_available() is False)")
        model = load_model(setup["weights"])
        self.tokens = int(setup["tokens"])
        self.contexts = [int(c) for c in setup["contexts"]]
        self.prompts = {int(c): np.asarray(ids, np.int64) for c, ids in setup["prompts"].items()}
        self.dec = build_torch_decoder(model, dev, setup["buckets"])
        try:
            limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") \
                else "cache_size_limit"
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 16))
        except Exception:
            pass
        self.failed: dict[str, str] = {}
        self.warmup_s: dict[str, dict[str, float]] = {}
        self.build_s: dict[str, float] = {}      # building an arm: its captures, its compiles
        self.runners: dict[str, object] = {}
        last = max(self.contexts) + self.tokens - 1
        for key in setup["arms"]:
            name = TORCH_ARMS[key]
            t0 = time.perf_counter()
            try:
                if key == "eager":
                    self.runners[name] = self.dec
                elif key == "graph":
                    self.runners[name] = GraphRunner(self.dec, self.dec.lengths_for(last))
                elif key == "compile":
                    keep_cudagraph_skips()
                    self.runners[name] = CompileRunner(self.dec)
                elif key == "inductor":
                    self.runners[name] = inductor_graph_runner(self.dec, self.dec.lengths_for(last))
            except Exception as exc:
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                log(f"{name} could not be built: {self.failed[name]}")
                continue
            self.build_s[name] = time.perf_counter() - t0
            log(f"{name} built in {self.build_s[name]:.1f} s")
        # the prefill replays a graph arm's graphs when there are some, else runs eager steps
        self.prefill = self.runners.get(TORCH_ARMS["graph"]) or \
            self.runners.get(TORCH_ARMS["inductor"]) or self.dec
        for name in list(self.runners):
            self.warmup_s[name] = {}
            for c in self.contexts:
                t0 = time.perf_counter()
                try:
                    self._prefill(c)
                    self.dec.rewind()
                    self.runners[name].run(self.tokens)
                    self.sync()
                except Exception as exc:
                    self.failed[name] = f"warm-up at context {c}: {type(exc).__name__}: {exc}"
                    log(f"{name} failed: {self.failed[name]}")
                    if self.prefill is self.runners.pop(name):
                        self.prefill = self.dec
                    break
                self.warmup_s[name][str(c)] = time.perf_counter() - t0
                log(f"{name} warmed up at context {c} in {self.warmup_s[name][str(c)]:.1f} s")

    def compile_s(self) -> dict[str, float]:
        """Seconds spent where torch compiles, per compiled arm: the inductor arm's bucket
        warm-ups (compile + 3 steps each, before its captures), torch.compile's first runs at
        each context (compile + prefill + one window each: reduce-overhead compiles lazily)."""
        out = {}
        for name, runner in self.runners.items():
            if name == TORCH_ARMS["inductor"]:
                out[name] = sum(runner.warmup_s.values())
            elif name == TORCH_ARMS["compile"]:
                out[name] = sum(self.warmup_s.get(name, {}).values())
        return out

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def _prefill(self, context: int) -> None:
        ids = self.prompts[context]
        self.dec.reset(ids)
        self.prefill.run(ids.size - 1)
        self.sync()

    def info(self) -> dict:
        torch = self.torch
        dev_name = (torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda"
                    else platform.processor() or "cpu")
        return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                "device": str(self.dev), "device_name": dev_name, "settings": self.settings,
                "arms": list(self.runners), "failed": dict(self.failed),
                "warmup_s": self.warmup_s, "build_s": self.build_s,
                "compile_s": self.compile_s(),
                "cudagraph_buckets": sorted(getattr(self.runners.get(TORCH_ARMS["graph"]),
                                                    "graphs", {})),
                "compile_counters": compile_counters(), "python": platform.python_version()}

    def rep(self, rep: int) -> dict:
        out: dict[str, dict] = {name: {} for name in self.runners}
        order = rotated(list(self.runners), rep)
        for c in self.contexts:
            self._prefill(c)
            for name in order:
                self.dec.rewind()
                self.sync()
                with collector_off():
                    t0 = time.perf_counter()
                    self.runners[name].run(self.tokens)
                    t_host = time.perf_counter()     # the host has issued every step
                    self.sync()
                    ms = 1000.0 * (time.perf_counter() - t0) / self.tokens
                out[name][str(c)] = {"ms": ms, "host_ms": 1000.0 * (t_host - t0) / self.tokens,
                                     "tokens": self.dec.generated(self.tokens)}
        return {"order": order, "data": out}


def worker_main() -> int:
    """--torch-worker: JSON lines on the original stdout (the protocol); anything else printed,
    by us or by torch, goes to stderr (fd 1 is pointed there)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    def log(msg):
        print(f"[torch worker] {msg}", file=sys.stderr, flush=True)

    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising at import
        send({"event": "error", "kind": "import", "message": f"{type(exc).__name__}: {exc}"})
        return 3
    send({"event": "imported", "torch": torch.__version__})
    line = sys.stdin.readline()
    if not line:
        return 0
    setup = json.loads(line)
    try:
        t0 = time.perf_counter()
        peer = TorchPeer(setup, log)
        log(f"ready in {time.perf_counter() - t0:.1f} s "
            f"(arms: {', '.join(peer.runners) or 'none'})")
    except Exception as exc:
        send({"event": "error", "kind": "setup", "message": f"{type(exc).__name__}: {exc}",
              "traceback": traceback.format_exc()})
        return 1
    send({"event": "ready", **peer.info()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "rep":
            try:
                res = peer.rep(int(cmd["rep"]))
            except Exception as exc:
                send({"event": "error", "kind": "rep", "message": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()})
                return 1
            send({"event": "rep", "rep": cmd["rep"], **res})
        elif cmd.get("cmd") == "quit":
            send({"event": "bye", "compile_counters": compile_counters()})
            return 0
    return 0


class Worker:
    """The parent's handle on the torch worker: JSON lines both ways, a reader thread so that
    every wait has a timeout: `python -m lab.measure.peer_worker` runs worker_main."""

    def __init__(self, python: str):
        self.proc = subprocess.Popen([python, "-m", "lab.measure.peer_worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, cwd=str(REPO))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float, expect: str) -> dict:
        """The next message; WorkerError when the worker ended, timed out or reported an error
        (kind and message kept on the exception)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WorkerError("timeout", f"no '{expect}' from the torch worker in {timeout:.0f} s")
        if line is None:
            rc = self.proc.wait()
            raise WorkerError("exit", f"the torch worker ended (exit {rc}) before '{expect}'")
        msg = json.loads(line)
        if msg.get("event") == "error":
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            if msg.get("traceback"):
                print(msg["traceback"], file=sys.stderr, flush=True)
            raise WorkerError(msg.get("kind", "error"), msg["message"])
        return msg

    def stop(self) -> None:
        """Ask the worker to quit (if it still runs), wait for it, kill it if it hangs."""
        if self.proc.poll() is not None:
            return
        try:
            self.send({"cmd": "quit"})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class WorkerError(RuntimeError):
    """The worker timed out, ended, or reported an error; `kind` says which (import, setup,
    rep, timeout, exit)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


if __name__ == "__main__":
    sys.exit(worker_main())
