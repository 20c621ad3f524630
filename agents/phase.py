"""Phase runtime for co-executed RL jobs (RollMux §5.1): run permits over HTTP, warm starts from host memory.

Design note
-----------
A job marks its phase functions with ``@runtime.phase("rollout")`` / ``@runtime.phase("train")``.
Calling one blocks until the group's scheduler grants a run permit (the round-robin turn of
:class:`compute_sched.groups.permits.PermitTable`), loads the job's resident state from host memory
onto the device (a *warm start*: torch tensors kept in pinned host memory when a GPU exists), runs,
copies the updated state back, releases the permit and returns; between phases the process simply
waits, so its communicators and handles stay alive. A cold start, by contrast, reads the state from
disk (:func:`measure_warm_vs_cold` compares the two).

Scheduler and jobs talk JSON over HTTP on a local socket (:class:`PhaseServer`, a FastAPI app on
the same uvicorn server as the control proxy, :mod:`agents.http.server`; :class:`PhaseClient`
keeps one httpx connection open). Every wait is
bounded: a job's long-poll for a permit returns every few seconds, and a permit expires
``permit_timeout_s`` after it was granted, so a job that crashes or hangs inside a phase loses its
permit and the rest of its group continues. torch is imported only where tensors are handled.

A warm start is timed until the state is on the device, not until the copies are queued: the
host-to-device copies are ``non_blocking`` (pinned memory), so they return as soon as they are
enqueued, and :meth:`PhaseRuntime.warm_start` synchronises the device before it reads the clock.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Mapping, Sequence

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from orchestrl.agents.http.server import HttpServer
from orchestrl.compute_sched.groups.permits import PermitRevoked, PermitTable
from orchestrl.fabric.errors import ConfigError, OrchestrlError

__all__ = ["PhaseServer", "PhaseClient", "PhaseRuntime", "PhaseContext", "PhaseTimeout", "measure_warm_vs_cold"]


class PhaseTimeout(OrchestrlError):
    """A job waited longer than its ``acquire_timeout_s`` for a permit, or the scheduler did not answer."""


# ------------------------------------------------------------------------------------------ server
class PhaseServer:
    """The intra-group scheduler as a local HTTP service; ``with PhaseServer(...) as s:`` runs it."""

    def __init__(self, order: Sequence[str], placement: Mapping[str, Sequence[int]], *, permit_timeout_s: float = 600.0,
                 turn_timeout_s: float | None = None, tail_threshold: float = 0.8, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.table = PermitTable(order, placement, permit_timeout_s=permit_timeout_s, turn_timeout_s=turn_timeout_s,
                                 tail_threshold=tail_threshold, now=time.monotonic())
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self.app = self._make_app()
        self.http = HttpServer(self.app, host, port, max_connections=1024, head_timeout_s=60.0, idle_timeout_s=60.0,
                               name="phase-server")
        self._ticker_thread = threading.Thread(target=self._ticker, daemon=True)

    def _make_app(self) -> FastAPI:
        app = FastAPI(title="orchestrl phase scheduler", docs_url=None, redoc_url=None, openapi_url=None)
        server = self

        @app.get("/state")
        def state() -> dict:
            return server.state()

        @app.post("/{endpoint}")
        def call(endpoint: str, body: dict) -> Any:  # long-polls run on the worker threads, never on the loop
            try:
                return server.handle("/" + endpoint, body)
            except PermitRevoked as exc:
                return JSONResponse({"error": str(exc)}, status_code=409)
            except (ConfigError, KeyError, ValueError, TypeError) as exc:
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)

        @app.exception_handler(404)
        async def missing(request: Request, exc: Exception) -> JSONResponse:
            return JSONResponse({"error": f"no resource {request.url.path}"}, status_code=404)

        return app

    @property
    def url(self) -> str:
        return self.http.url

    def start(self) -> "PhaseServer":
        self._ticker_thread.start()
        self.http.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.cond:
            self.cond.notify_all()  # long-polls return at once
        self.http.shutdown()

    def __enter__(self) -> "PhaseServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _ticker(self) -> None:
        # Expiries and absent turns must fire even when no job calls in (a crashed holder never will).
        while not self._stop.is_set():
            with self.cond:
                self.table.tick(time.monotonic())
                self.cond.notify_all()
                deadline = self.table.next_deadline()
                wait = 0.5 if deadline is None else min(0.5, max(0.01, deadline - time.monotonic()))
                self.cond.wait(wait)

    def handle(self, path: str, body: dict) -> dict:
        """Serve one request (also usable in-process, without HTTP)."""
        with self.cond:
            now = time.monotonic()
            if path == "/acquire":
                deadline = now + min(float(body.get("wait_s", 5.0)), 30.0)
                while True:
                    permit = self.table.request(str(body["job"]), str(body["phase"]), time.monotonic())
                    if permit is not None or time.monotonic() >= deadline or self._stop.is_set():
                        break
                    self.cond.wait(max(0.0, deadline - time.monotonic()))
                self.cond.notify_all()
                return {"permit": asdict(permit) if permit else None}
            if path == "/progress":
                return {"migrate": self.table.progress(str(body["permit_id"]), float(body["fraction"]), now)}
            if path == "/release":
                self.table.release(str(body["permit_id"]), now)
            elif path == "/finish":
                self.table.finish(str(body["job"]), now)
            elif path == "/fail":
                self.table.fail(str(body["job"]), str(body.get("reason", "reported failed")), now)
            else:
                raise ConfigError("phase server", "path", f"unknown endpoint {path!r}",
                                  "/acquire, /progress, /release, /finish, /fail")
            self.cond.notify_all()
            return {}

    def state(self) -> dict:
        with self.cond:
            t = self.table
            return {"grants": [list(g) for g in t.grants], "failed": dict(t.failed), "finished": sorted(t.finished),
                    "permits": [asdict(p) for p in t.permits.values()],
                    "waiting": [list(k) for k in t.waiting]}


# ------------------------------------------------------------------------------------------ client
class PhaseClient:
    """Talks to a :class:`PhaseServer`; every call has a timeout."""

    def __init__(self, url: str, job_id: str, timeout_s: float = 40.0) -> None:
        self.url = url.rstrip("/")
        self.job_id = job_id
        self.timeout_s = timeout_s
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)))

    def call(self, path: str, body: dict) -> dict:
        try:
            resp = self._http.post(path, json=body)
        except (httpx.TransportError, OSError) as exc:
            raise PhaseTimeout(f"phase scheduler at {self.url} did not answer {path}: {exc}") from None
        if resp.status_code == 409:
            raise PermitRevoked(resp.json().get("error", resp.text))
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("error", resp.text)
            except ValueError:
                msg = resp.text
            raise ConfigError(self.url + path, "request", msg)
        return resp.json()

    def close(self) -> None:
        self._http.close()

    def acquire(self, phase: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PhaseTimeout(f"job {self.job_id!r} got no {phase} permit within {timeout_s:g} s")
            permit = self.call("/acquire", {"job": self.job_id, "phase": phase, "wait_s": min(5.0, left)})["permit"]
            if permit is not None:
                return permit

    def progress(self, permit_id: str, fraction: float) -> bool:
        return bool(self.call("/progress", {"permit_id": permit_id, "fraction": fraction})["migrate"])

    def release(self, permit_id: str) -> None:
        self.call("/release", {"permit_id": permit_id})

    def finish(self) -> None:
        self.call("/finish", {"job": self.job_id})


# ------------------------------------------------------------------------------------------ runtime
class PhaseContext:
    """What a phase function receives: its device-resident state and the runtime hook for progress."""

    def __init__(self, runtime: "PhaseRuntime", permit: dict, state: dict) -> None:
        self.runtime = runtime
        self.permit = permit
        self.state = state  # name -> tensor on the device; mutate in place or assign new tensors
        self.migrate = threading.Event()  # set once the scheduler asked to consolidate the tail

    def report_progress(self, fraction: float) -> bool:
        """Report the share of responses done (runtime hook, §5.1); True means "consolidate your tail now"."""
        if not self.migrate.is_set() and self.runtime.client.progress(self.permit["permit_id"], fraction):
            self.migrate.set()
        return self.migrate.is_set()


class PhaseRuntime:
    """Per-job shim: permits, warm starts and offloads around each decorated phase.

    Parameters
    ----------
    job_id, url : str
        This job's name in its group and the scheduler's address.
    state : mapping of str to torch.Tensor, optional
        The job's resident working set; it is kept in host memory between phases (pinned when a GPU
        is present) and loaded onto ``device`` for each phase.
    device : str, optional
        ``"cuda"`` when available, else ``"cpu"`` (the copy is then host-to-host, still a real load).
    acquire_timeout_s : float
        Longest wait for one permit before :class:`PhaseTimeout`.
    """

    def __init__(self, job_id: str, url: str, state: Mapping[str, Any] | None = None, *, device: str | None = None,
                 acquire_timeout_s: float = 3600.0) -> None:
        self.job_id = job_id
        self.client = PhaseClient(url, job_id)
        self.acquire_timeout_s = acquire_timeout_s
        self.host: dict[str, Any] = {}
        self.device = device
        self.warm_start_s: list[float] = []
        self._device_buf: dict[str, Any] = {}
        self._synchronize: Callable[[], None] = _no_sync  # waits for the device's queued copies
        self._hook: Callable[[], float] | None = None
        self.hook_interval_s = 0.1
        self.phases_run: list[str] = []
        if state:
            import torch

            self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
            pin = self.device.startswith("cuda")
            self.host = {k: (v.detach().to("cpu").pin_memory() if pin else v.detach().to("cpu").clone())
                         for k, v in state.items()}
            self._synchronize = _device_sync(self.device)

    def phase(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate ``fn(ctx, *args, **kwargs)`` as the job's ``name`` phase (``"rollout"`` or ``"train"``)."""
        if name not in ("rollout", "train"):
            raise ConfigError("@phase", "name", f"unknown phase {name!r}", "rollout, train")

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                permit = self.client.acquire(name, self.acquire_timeout_s)
                try:
                    state, seconds = self.warm_start()
                    self.warm_start_s.append(seconds)
                    ctx = PhaseContext(self, permit, state)
                    done = threading.Event()
                    if name == "rollout" and self._hook is not None:
                        threading.Thread(target=self._poll_hook, args=(ctx, done), daemon=True).start()
                    try:
                        result = fn(ctx, *args, **kwargs)
                    finally:
                        done.set()
                    self._offload(state)
                finally:
                    with contextlib.suppress(PermitRevoked):
                        self.client.release(permit["permit_id"])
                self.phases_run.append(name)
                return result

            run.__name__ = getattr(fn, "__name__", "phase")
            run.__doc__ = fn.__doc__
            return run

        return wrap

    def runtime_hook(self, fn: Callable[[], float]) -> Callable[[], float]:
        """Register ``fn() -> float``, the share of the batch's responses done (RollMux's runtime hook).

        It is polled while a rollout runs; when the scheduler answers that the rollout is tail-bound
        and the next job waits, ``ctx.migrate`` is set and the phase should consolidate its tail.
        """
        self._hook = fn
        return fn

    def _poll_hook(self, ctx: PhaseContext, done: threading.Event) -> None:
        while not done.wait(self.hook_interval_s) and not ctx.migrate.is_set():
            try:
                ctx.report_progress(float(self._hook()))
            except (PermitRevoked, PhaseTimeout):
                return

    def finish(self) -> None:
        """Tell the scheduler this job is done, so its turns pass to the others."""
        self.client.finish()

    def warm_start(self) -> tuple[dict, float]:
        """Load the resident state onto the device; return it and the seconds until it is there.

        The clock is read after the device is synchronised, so the time covers the copies
        themselves, not only enqueueing them (``non_blocking`` copies return at once).
        """
        t0 = time.perf_counter()
        state = self._load()
        self._synchronize()
        return state, time.perf_counter() - t0

    def _load(self) -> dict:
        if not self.host:
            return {}
        if self.device != "cpu":
            return {k: v.to(self.device, non_blocking=True) for k, v in self.host.items()}
        # Without a GPU the "device" copy lives in buffers reused across phases, as the CUDA caching
        # allocator reuses its segments; the copy itself is still a full pass over the state.
        for k, v in self.host.items():
            buf = self._device_buf.get(k)
            if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                self._device_buf[k] = buf = v.clone()
            else:
                buf.copy_(v)
        return dict(self._device_buf)

    def _offload(self, state: dict) -> None:
        for k, v in state.items():
            if k in self.host and self.host[k].shape == v.shape:
                self.host[k].copy_(v.detach())
            else:
                self.host[k] = v.detach().to("cpu")
        if self.device and self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _no_sync() -> None:
    """Copies between host buffers are done when ``copy_`` returns: nothing to wait for."""


def _device_sync(device: str) -> Callable[[], None]:
    """What waits until ``device`` has finished its queued work (``torch.cuda.synchronize`` for CUDA)."""
    if not device.startswith("cuda"):
        return _no_sync
    import torch

    return lambda: torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------ measurement
def cold_load(path: str, device: str = "cpu") -> dict:
    """Load a saved state the cold way: evict its pages from the page cache, read it from disk, place it."""
    import torch

    with open(path, "rb+") as handle:
        if hasattr(os, "posix_fadvise"):  # dirty pages stay cached: flush them first
            os.fsync(handle.fileno())
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v.to(device) for k, v in state.items()}


def measure_warm_vs_cold(directory: str, state_mb: int = 256, repeats: int = 3) -> dict:
    """Return median warm-start and cold-load times of ``state_mb`` MB of tensors, and their ratio."""
    import statistics

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    chunks = 8
    state = {f"w{i}": torch.randn(state_mb * 2 ** 20 // 4 // chunks) for i in range(chunks)}
    path = os.path.join(directory, "state.pt")
    torch.save(state, path)
    runtime = PhaseRuntime("bench", "http://127.0.0.1:9", state, device=device)
    runtime._offload(runtime._load())  # first touch of the device buffers, as a job's first phase does
    warm, cold = [], []
    for _ in range(repeats):
        loaded, seconds = runtime.warm_start()
        warm.append(seconds)
        runtime._offload(loaded)
        t0 = time.perf_counter()
        cold_load(path, device)
        runtime._synchronize()  # the same finish line as the warm start
        cold.append(time.perf_counter() - t0)
    w, c = statistics.median(warm), statistics.median(cold)
    return {"state_mb": state_mb, "device": device, "warm_s": w, "cold_s": c, "ratio": c / w}
