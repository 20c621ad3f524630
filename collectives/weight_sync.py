"""Run a weight-sync schedule on a transport: the API trainers and generation engines call.

Design note
-----------
Each rank walks its own steps of the schedule (:meth:`collectives.schedule.Schedule.program`). In a
step it posts every receive, packs or forwards every send, then waits for all of them; chunks
received in step ``s`` are verified (header and checksum) and written to the rank's tensors, and
forwarded unchanged in step ``s + 1``. So a rank holds at most two steps of chunk buffers
(double buffering) besides its own parameter slices, and a slice streams down a Phase B tree while
it is still arriving. A completed parameter goes to the user's ``load_weights`` on a separate
*loader* thread, so a slow engine loader neither stalls forwarding nor stops heartbeats.

Transport waits block and cannot be interrupted, so they run on a helper thread while
:class:`collectives.liveness.Liveness` heartbeats from its own thread; a dead or stalled peer, a
checksum mismatch (:class:`IntegrityError`) or a failed transfer anywhere ends the sync on every
rank with an error naming the peer and the phase. After a failure the transport's connections are
aborted and the helper thread is idle before the error reaches the caller, so the process can go
on (the next call starts a new round, and a replaced rank can rejoin) or exit cleanly.

Usage (every rank; rank 0 plans and hosts the store)::

    sync = WeightSync.connect(schedule if rank == 0 else None, host, port, rank, backend="nccl")
    sync.send(model.named_parameters())                 # trainer: its own shards, trainer names
    handle = sync.send_async(model.named_parameters())  # ... or snapshot now, overlap with training
    sync.receive(load_weights=engine.load_weights)      # generator: called with [(name, tensor)]
"""

from __future__ import annotations

import atexit
import contextlib
import re
import threading
import time
import weakref
import zlib
from datetime import timedelta
from typing import Iterable, Mapping

import torch
import torch.distributed as dist

from orchestrl.collectives.codec import TORCH_DTYPES, ChunkCodec, ParamBuffer
from orchestrl.collectives.coords import check_coords, megatron_coords  # noqa: F401 (megatron_coords: re-exported)
from orchestrl.collectives.errors import WeightSyncError
from orchestrl.collectives.executor import Loader, LoadWeights, StreamExecutor
from orchestrl.collectives.liveness import _NO_ABORT, Liveness, StoreClients
from orchestrl.collectives.report import SyncHandle, SyncReport
from orchestrl.collectives.schedule import Op, Schedule
from orchestrl.collectives.store import tcp_store
from orchestrl.collectives.targets import check_tensor, resolve_targets
from orchestrl.fabric.errors import ConfigError

__all__ = ["SyncReport", "SyncHandle", "WeightSync", "LoadWeights"]

_LIVE: "weakref.WeakSet[WeightSync]" = weakref.WeakSet()


class WeightSync:
    """Executes a :class:`Schedule` for one rank over a transport.

    Parameters
    ----------
    schedule : Schedule
        The same schedule on every rank (checked by digest and world size when a round starts).
    transport : Transport
        Point-to-point transport for this rank (``transport.rank`` is the schedule rank).
    timeout_s : float
        Liveness timeout: a peer that stops heartbeating (dead, stopped) for this long fails the sync
        on every rank. Give the transport a longer timeout (2x, as :meth:`connect` does): its timeout
        bounds a transfer that makes no progress while every process is alive, and a shorter one
        would blame the live rank waiting behind a dead one instead of the dead one.
    join_timeout_s : float
        How long a round waits for every rank to join (ranks reach the sync at different times). The
        round after a failed one waits ``join_timeout_s`` plus the transport's timeout: before joining
        it, each rank waits for the failed round's pending transfers to end, which may take that long.
    load_timeout_s : float
        How long one ``load_weights`` callback may run before the round fails naming it.
    trace : bool
        Record per-step timings in the report.
    rejoin : bool
        This process replaces a rank that died: its first call joins the round the job is in (or the
        next one, if that round already failed) instead of round 1.
    """

    def __init__(self, schedule: Schedule, transport, *, timeout_s: float = 60.0, join_timeout_s: float = 300.0,
                 load_timeout_s: float = 600.0, trace: bool = False, rejoin: bool = False) -> None:
        if transport.world_size != schedule.world_size:
            raise ConfigError("WeightSync", "transport.world_size",
                              f"{transport.world_size} ranks but the schedule has {schedule.world_size} "
                              f"({schedule.trainer.world_size} trainers + {schedule.generator.world_size} generators)",
                              "a transport built for the schedule's world size")
        self.schedule = schedule
        self.transport = transport
        self.rank = transport.rank
        self.timeout_s = float(timeout_s)
        self.join_timeout_s = float(join_timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self.trace = trace
        self.rejoin = rejoin
        self.window = 2  # transfers each peer stream keeps posted (see collectives.executor)
        self.lookahead = 4  # steps a stream may run ahead of the rank's slowest one
        self._round = 0
        self._failed = False  # this rank's last round failed: the next one is a retry (see _join_window_s)
        self._clients: StoreClients | None = None  # liveness clients of the store, kept across rounds
        self._peers = sorted({op.peer for _, ops in schedule.program(self.rank) for op in ops})
        self._executor: StreamExecutor | None = None
        self._pending: SyncHandle | None = None
        _LIVE.add(self)

    @classmethod
    def connect(cls, schedule: Schedule | None, host: str, port: int, rank: int, *, backend: str = "gloo",
                timeout_s: float = 60.0, join_timeout_s: float = 300.0, load_timeout_s: float = 600.0,
                group_name: str = "orchestrl-weight-sync", trace: bool = False, rejoin: bool = False) -> "WeightSync":
        """Connect rank ``rank`` to the job's store at ``host:port`` and return its ``WeightSync``.

        Schedule rank 0 hosts the store and passes the schedule it planned; every other rank passes
        None and receives that schedule from the store, so the job plans once. Rank 0 may pass
        ``port=0`` to listen on a port the kernel picks (no race for a port chosen ahead of time) and
        hand :attr:`store_port` to the other ranks. A rank that passes its
        own schedule is checked against the others by digest when a round starts. A process that
        replaces a dead rank connects the same way with ``rejoin=True`` and joins the round the job
        is in; the other ranks keep their ``WeightSync`` and only rebuild their connections to it.

        ``backend`` is ``"gloo"`` (CPU tensors over TCP), ``"nccl"`` (one GPU per rank) or ``"ipc"`` for
        colocated ranks on one host: CUDA IPC handles when CUDA is available (trainer and engine
        sharing GPUs), POSIX shared memory otherwise (:mod:`collectives.transport.colocated`).

        Raises
        ------
        ConfigError
            If ``rank`` is outside the schedule, or rank 0 has no schedule to publish.
        WeightSyncError
            If no schedule appears in the store within ``join_timeout_s``.
        """
        from orchestrl.collectives.transport.torch_dist import TorchTransport

        store = tcp_store(host, port, is_master=rank == 0, timeout_s=join_timeout_s)
        ctl = dist.PrefixStore(f"{group_name}/ctl/", store)
        if schedule is not None and rank == 0:
            ctl.set("schedule", zlib.compress(schedule.canonical_json(), 1))
            ctl.set("schedule-digest", schedule.digest)
        elif schedule is None:
            if rank == 0:
                raise ConfigError("WeightSync.connect", "schedule", "is None on rank 0, which publishes it",
                                  "the planned Schedule on rank 0 (None on the other ranks)")
            schedule = _fetch(ctl, f"rank {rank}", f"{host}:{port}", join_timeout_s)
        if not 0 <= rank < schedule.world_size:
            raise ConfigError("WeightSync.connect", "rank", f"{rank} is outside the schedule's {schedule.world_size} "
                              f"ranks ({schedule.trainer.world_size} trainers + {schedule.generator.world_size} "
                              "generators)", f"0..{schedule.world_size - 1}")
        if backend == "ipc":  # colocated ranks: CUDA IPC handles on a GPU, shared memory on CPU
            from orchestrl.collectives.transport.colocated import ColocatedTransport
            transport = ColocatedTransport(store, rank, schedule.world_size, timeout_s=2 * timeout_s,
                                           device="cuda" if torch.cuda.is_available() else "cpu",
                                           group_name=group_name)
        else:
            transport = TorchTransport(store, rank, schedule.world_size, backend=backend, timeout_s=2 * timeout_s,
                                       group_name=group_name)
        return cls(schedule, transport, timeout_s=timeout_s, join_timeout_s=join_timeout_s,
                   load_timeout_s=load_timeout_s, trace=trace, rejoin=rejoin)

    @staticmethod
    def fetch_schedule(host: str, port: int, *, timeout_s: float = 300.0,
                       group_name: str = "orchestrl-weight-sync") -> Schedule:
        """Return the schedule rank 0 published at ``host:port`` (e.g. to learn one's schedule rank)."""
        store = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        return _fetch(dist.PrefixStore(f"{group_name}/ctl/", store), "this process", f"{host}:{port}", timeout_s)

    @property
    def store_port(self) -> int:
        """The port of the job's coordination store: on rank 0, the one the kernel picked for ``port=0``."""
        store = self.transport.store
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        return store.port

    # -- public API ----------------------------------------------------------------------------
    def send(self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *,
             coords: Mapping[str, int] | None = None) -> SyncReport:
        """Trainer side: send this rank's shards (its TP slice of its PP stage's parameters).

        ``named_params`` is what ``model.named_parameters()`` yields, under the trainer's names
        (:attr:`ParamSpec.source_name`) and dtypes; only parameters this rank holds are looked up,
        each is checked for shape, dtype and device, and nothing is copied unless a piece is not
        contiguous or has to be cast.

        ``coords`` is this process's place in the training job as its framework knows it
        (``{"tp": .., "pp": .., "ep": .., "expert_tp": ..}``); by default it is read from
        megatron-core's parallel state when that is initialised. Before any byte moves it is checked
        against the place the schedule's :class:`TrainerLayout` gives this rank: shards of the same
        shape on swapped ranks would otherwise arrive "verified" and wrong. A layout with TP, PP and
        EP all 1 has nothing to prove; any other needs one of the two.
        """
        self._wait_pending()
        return self._run(self._trainer_buffers(named_params, coords), None, snapshot=False)

    def send_async(self, named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *,
                   coords: Mapping[str, int] | None = None) -> SyncHandle:
        """Trainer side: snapshot this rank's shards now and send them in the background.

        Returns as soon as the bytes this rank sends (its shard, cast to the engine's dtype) are
        copied, so the optimizer may update the weights while the sync runs (one-step-async RL).
        A previous handle is waited for first (its error, if any, is raised here). ``coords`` as
        for :meth:`send`.
        """
        self._wait_pending()
        buffers = self._trainer_buffers(named_params, coords)
        codec = self._codec(0)  # the round number is set when the round starts
        snapshots = codec.snapshot(buffers)
        box: dict = {}

        def run() -> None:
            try:
                box["report"] = self._run({}, None, snapshot=(codec, snapshots))
            except BaseException as exc:  # handed to the caller of wait()
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"weight-sync-send-{self.rank}", daemon=True)
        thread.start()
        self._pending = SyncHandle(thread, box)
        return self._pending

    def receive(self, load_weights: LoadWeights | None = None, *,
                into: Mapping[str, torch.Tensor] | None = None) -> SyncReport:
        """Generator side: receive this rank's slices, forwarding chunks down the schedule's trees.

        Parameters
        ----------
        load_weights : callable, optional
            Called (on a loader thread) with ``[(name, tensor)]`` as soon as a parameter's slice is
            complete and verified, once per engine name (aliases of tied weights included).
        into : mapping name -> tensor, optional
            Pre-allocated destination tensors (e.g. the engine's own parameters) written in place;
            each must have the parameter's dtype, this rank's shard shape and the transport's device.

        Raises
        ------
        ConfigError
            If a target has the wrong dtype, shape or device, or a parameter has no target and
            there is no ``load_weights``. The other ranks fail the round naming this rank.
        """
        if self.schedule.is_trainer(self.rank):
            raise ValueError(f"{self.schedule.rank_name(self.rank)} sends; call send()")
        sch = self.schedule
        try:
            targets = resolve_targets(sch, self.rank, into or {}, self.transport.device,
                                      required=load_weights is None)
        except ConfigError as exc:
            self._refuse(exc)
        return self._run(self._generator_buffers(targets), load_weights, targets=targets)

    def close(self) -> None:
        """Drop the transport's connections (pending transfers of a failed round are abandoned)."""
        self.transport.close()

    # -- buffers -------------------------------------------------------------------------------
    def _check_coords(self, coords: Mapping[str, int] | None) -> None:
        """Raise ConfigError unless this process holds the shards the schedule expects of its rank."""
        check_coords(self.schedule, self.rank, coords)

    def _trainer_buffers(self, named_params, coords: Mapping[str, int] | None = None) -> dict[int, ParamBuffer]:
        sch, rank = self.schedule, self.rank
        if not sch.is_trainer(rank):
            raise ValueError(f"{sch.rank_name(rank)} receives; call receive()")
        items = named_params.items() if isinstance(named_params, Mapping) else named_params
        local = dict(items)
        out: dict[int, ParamBuffer] = {}
        try:
            self._check_coords(coords)
            for i, spec in enumerate(sch.params):
                runs, init = sch.runs(rank, i), sch.initial_runs(rank, i)
                if runs is None:
                    continue
                if init is None:  # gathers a parameter of another stage (the flat baseline's rank 0)
                    tensor = torch.zeros(sch.local_shape(rank, i), dtype=TORCH_DTYPES[spec.dtype],
                                         device=self.transport.device)
                    out[i] = ParamBuffer(spec, runs, tensor, sum(hi - lo for lo, hi in runs[0]) * spec.row_bytes)
                    continue
                where = f"{sch.rank_name(rank)}: send()"
                if spec.source_name not in local:
                    raise ConfigError(where, spec.source_name, "is missing from the tensors given",
                                      f"this rank's shard of shape {sch.local_shape(rank, i, initial=True)}")
                given = check_tensor(local[spec.source_name].detach(), where=where, name=spec.source_name,
                                     shape=sch.local_shape(rank, i, initial=True), dtype=spec.trainer_dtype,
                                     device=self.transport.device, contiguous=False)
                if runs == init:
                    out[i] = ParamBuffer(spec, runs, given)
                    continue
                # Holds more at the end than it brings (the flat baseline's gathering rank).
                tensor = torch.zeros(sch.local_shape(rank, i), dtype=TORCH_DTYPES[spec.dtype],
                                     device=self.transport.device)
                buf = ParamBuffer(spec, runs, tensor)
                row = 0
                for lo, hi in init[0]:
                    buf.narrow(lo, hi).copy_(given.narrow(spec.split_dim, row, hi - lo))
                    row += hi - lo
                buf.missing_bytes = sum(hi - lo for lo, hi in runs[0]) * spec.row_bytes - row * spec.row_bytes
                out[i] = buf
        except ConfigError as exc:
            self._refuse(exc)
        return out

    def _generator_buffers(self, targets: dict[int, list[torch.Tensor]]) -> dict[int, ParamBuffer]:
        sch, rank = self.schedule, self.rank
        out: dict[int, ParamBuffer] = {}
        for i, spec in enumerate(sch.params):
            runs = sch.runs(rank, i)
            if runs is None:
                continue
            if i in targets:
                tensor = targets[i][0]
            else:
                alloc = torch.zeros if runs[1] else torch.empty  # padding rows read as zeros
                tensor = alloc(sch.local_shape(rank, i), dtype=TORCH_DTYPES[spec.dtype], device=self.transport.device)
            out[i] = ParamBuffer(spec, runs, tensor, sum(hi - lo for lo, hi in runs[0]) * spec.row_bytes)
        return out

    def _refuse(self, exc: ConfigError) -> None:
        """Fail the next round for every rank with this rank's argument error, then raise it here."""
        sch = self.schedule
        n = self._next_round()
        live = Liveness(self._store_clients().prefixed(f"round/{n}/"), self.rank, sch.world_size, sch.digest,
                        timeout_s=self.timeout_s,
                        join_timeout_s=self.join_timeout_s, load_timeout_s=self.load_timeout_s,
                        rank_name=sch.rank_name)
        live.fail(self.rank, f"{sch.rank_name(self.rank)} refused its arguments: {exc}", kind="config")
        self._failed = True
        self._clients = None  # the failure record may have timed out on them
        self._round = n
        raise exc

    def _codec(self, round_id: int) -> ChunkCodec:
        return ChunkCodec(self.schedule, self.rank, self.transport.device, self.transport.checksum, round_id)

    # -- rounds ------------------------------------------------------------------------------
    def _next_round(self) -> int:
        """The round this call joins: the next one, or for a rejoining process the one the job is in."""
        if self._round or not self.rejoin:
            return self._round + 1
        store = self.transport.store
        if not store.check(["latest-round"]):
            return 1
        latest = int(store.get("latest-round"))
        rnd = dist.PrefixStore(f"round/{latest}/", store)
        deadline = time.monotonic() + 4 * self.timeout_s
        while time.monotonic() < deadline:
            if self._round_failed(latest):
                return latest + 1  # that round failed; the survivors start the next one
            if rnd.check(["release"]):
                return latest + 1
            if not rnd.check(["go"]):
                return latest  # the others are waiting for this rank to join
            time.sleep(0.05)  # the round runs without this rank: it will fail; join the next one
        return latest + 1

    def _store_clients(self) -> StoreClients:
        """This rank's liveness clients of the store: opened once, kept across successful rounds."""
        if self._clients is None:
            self._clients = StoreClients.open(self.transport.store, self.timeout_s)
        return self._clients

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.wait()

    def _run(self, buffers: dict[int, ParamBuffer], load_weights: LoadWeights | None, *,
             snapshot: tuple[ChunkCodec, dict] | bool = False,
             targets: dict[int, list[torch.Tensor]] | None = None) -> SyncReport:
        sch, rank = self.schedule, self.rank
        self._settle()
        n = self._next_round()
        self._round = n
        self.transport.store.set("latest-round", str(n))
        live = Liveness(self._store_clients().prefixed(f"round/{n}/"), rank, sch.world_size, sch.digest,
                        timeout_s=self.timeout_s,
                        join_timeout_s=self._join_window_s(n), load_timeout_s=self.load_timeout_s,
                        rank_name=sch.rank_name, peers=self._peers, generation=self.transport.generation)
        loader = Loader(load_weights, live, sch, targets or {}, self.schedule.is_trainer(rank))
        try:
            live.join()
            self._connect(live)
            started = time.time()
            codec, snaps = snapshot if isinstance(snapshot, tuple) else (self._codec(n), None)
            codec.round_id = n
            executor = StreamExecutor(sch, rank, self.transport, codec, buffers, snaps, loader.complete, self._label,
                                      window=self.window, lookahead=self.lookahead, trace=self.trace)
            self._executor = executor
            executor.run(live, loader.check)
            loader.drain()
            missing = [sch.params[p].name for p, b in buffers.items() if b.missing_bytes]
            if missing:
                raise live.fail(rank, f"{sch.rank_name(rank)} ended without {len(missing)} parameter slice(s) "
                                      f"(first: {missing[0]!r}); the schedule does not cover its layout")
            data_done = time.time()
            live.finish()
        except WeightSyncError as err:
            self._failed = True
            self._after_failure()
            raise self._with_targets(err, buffers, targets)
        except Exception as exc:  # a failing load_weights or an internal error: end the round everywhere
            err = live.fail(rank, f"{sch.rank_name(rank)} raised {type(exc).__name__}: {exc}")
            self._failed = True
            self._after_failure()
            raise self._with_targets(err, buffers, targets) from exc
        finally:
            live.close()
        self._failed = False
        return SyncReport(rank, "trainer" if sch.is_trainer(rank) else "generator", started, data_done,
                          time.time(), executor.sent, executor.received, executor.verified, loader.loaded, True,
                          tuple(sorted(executor.step_times)), n)

    def _with_targets(self, err: WeightSyncError, buffers: dict[int, ParamBuffer],
                      targets: dict[int, list[torch.Tensor]] | None) -> WeightSyncError:
        """Say in ``err`` what a failed round left in the caller's ``into=`` tensors (written in place as chunks came).

        A failed round is not rolled back (that would need a second copy of the model): each target holds this
        round's weights, still the previous ones, or a mix. ``err.targets`` maps each state to the names.
        """
        if not targets:
            return err
        sch = self.schedule
        state: dict[str, list[str]] = {"complete": [], "untouched": [], "partial": []}
        for i in targets:
            buf = buffers[i]
            total = sum(hi - lo for lo, hi in buf.runs[0]) * buf.spec.row_bytes
            kind = "complete" if buf.missing_bytes == 0 else "untouched" if buf.missing_bytes >= total else "partial"
            state[kind].append(sch.params[i].name)
        err.targets = state  # type: ignore[attr-defined]
        mixed = state["partial"]
        err.args = (f"{err.args[0]}; in-place targets of {sch.rank_name(self.rank)}: {len(state['complete'])} hold this "
                    f"round's weights, {len(state['untouched'])} the previous ones, {len(mixed)} a mix of both"
                    + (f" (first: {mixed[0]!r})" if mixed else "")
                    + ": serve from none of them until a round succeeds; retrying the round rewrites every target",)
        return err

    def _settle(self) -> None:
        """Before a new round: let the transfers a failed round left pending end (at most their timeout)."""
        executor = self._executor
        if executor is not None and not executor.idle():
            executor.stop()
            if not executor.join(self.transport_timeout_s):
                raise WeightSyncError(f"{self.schedule.rank_name(self.rank)}: transfers of the failed round "
                                      f"{self._round} are still pending after {self.transport_timeout_s:.0f} s; "
                                      "discard this WeightSync and connect a new one", peer=self.rank)

    def _join_window_s(self, n: int) -> float:
        """How long round ``n`` waits for every rank to join.

        After a failed round every rank first waits for that round's pending transfers (``_settle``), and one
        may only end at the transport's timeout. A rank whose transfers ended at once joins the retry early;
        with the plain ``join_timeout_s`` it could name a peer that is still settling as one that "never
        joined" (the cause of a retry-test failure with a 120 s window and a 2 x 60 s transport timeout, seen
        in py-spy dumps of the hung runs), so a retry's window adds the transport's timeout. Whether round ``n - 1`` failed is read
        from the store, so a process that replaces a dead rank (``rejoin``) waits as long as the survivors;
        this process's own last round counts too, where the store does not answer.
        """
        failed = self._failed
        if not failed and n > 1:
            with contextlib.suppress(Exception):
                failed = self._round_failed(n - 1)
        return self.join_timeout_s + (self.transport_timeout_s if failed else 0.0)

    def _round_failed(self, n: int) -> bool:
        """Whether the store holds a failure record for round ``n``."""
        rnd = dist.PrefixStore(f"round/{n}/", self.transport.store)
        return bool(rnd.check(["abort"])) and rnd.get("abort").decode() not in ("", _NO_ABORT)

    @property
    def transport_timeout_s(self) -> float:
        """Longest one transfer may block in the transport."""
        return float(getattr(self.transport, "timeout_s", 2 * self.timeout_s))

    def _connect(self, live: Liveness) -> None:
        """Connect to this rank's peers, raising as soon as liveness names a peer that died or was cut off.

        Building a connection blocks in the transport (gloo's rendezvous) up to its own timeout; it runs
        on a thread of its own so that the heartbeats, which see a silent peer after ``timeout_s``, decide
        when this rank gives up and whom it names.
        """
        box: dict[str, BaseException] = {}

        def work() -> None:
            try:
                self.transport.prepare(live.generations)
            except BaseException as exc:  # handed to the calling thread below
                box["exc"] = exc

        thread = threading.Thread(target=work, name=f"weight-sync-connect-{self.rank}", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            live.poll("connecting to peers")
        if "exc" in box:
            exc = box["exc"]
            raise live.fail(-1, f"{self.schedule.rank_name(self.rank)} could not connect to its peers: "
                                f"{_short(exc)}") from exc

    def _after_failure(self) -> None:
        """End this rank's pending transfers and let its stream threads return before the error surfaces."""
        executor = self._executor
        self._clients = None  # a call of the failed round may have timed out on them: the next round opens new ones
        if executor is not None:
            executor.stop()
        # a transport that cannot reset is discarded by the caller (documented)
        with contextlib.suppress(Exception):
            self.transport.reset()
        if executor is not None:
            # Most pending transfers end at once on the reset; one whose peer vanished without a word (a pulled
            # cable) may only end at the transport's own timeout. The error is not held back for it: the next
            # round waits for it before it starts (_settle), and so does the process at exit (_quiesce).
            executor.join(SETTLE_S)

    def _label(self, op: Op, step: int) -> str:
        sch = self.schedule
        verb = "sending" if op.kind == "send" else "receiving"
        prep = "to" if op.kind == "send" else "from"
        return (f"phase {op.phase}: {verb} block {op.block} chunk {op.chunk + 1}/{sch.chunks(op.block)} "
                f"{prep} {sch.rank_name(op.peer)} (step {step})")


#: After a failure, how long the error waits for this rank's transfer threads to end (seconds).
SETTLE_S = 1.0


def _short(exc: BaseException) -> str:
    """The transport's message without source paths and boilerplate advice."""
    text = re.sub(r"\[/[^\]]*\] ?", "", str(exc)).split(" This is typically")[0].strip()
    return text or type(exc).__name__


def _fetch(ctl, who: str, where: str, timeout_s: float) -> Schedule:
    try:
        ctl.wait(["schedule-digest"], timedelta(seconds=timeout_s))
    except Exception as exc:
        raise WeightSyncError(f"{who}: no schedule was published at {where} within {timeout_s:.0f} s; rank 0 "
                              "publishes it in WeightSync.connect", peer=0, phase="connecting") from exc
    schedule = Schedule.from_canonical_json(zlib.decompress(ctl.get("schedule")))  # digest of the bytes received
    if schedule.digest != ctl.get("schedule-digest").decode():
        raise WeightSyncError(f"{who}: the schedule at {where} does not match its digest", peer=0, phase="connecting")
    return schedule


@atexit.register
def _quiesce() -> None:
    """At exit, abort connections a failed round left pending, so no helper thread is inside a wait.

    A daemon thread still blocked in a transport wait when the interpreter finalizes makes libstdc++
    call ``std::terminate`` (exit status -6, which torchrun and Ray read as a crash).
    """
    for sync in list(_LIVE):
        executor = sync._executor
        if executor is not None and not executor.idle():
            sync._after_failure()
            executor.join(sync.transport_timeout_s)  # a transfer to a vanished peer ends at its own timeout
