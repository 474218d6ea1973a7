"""`ResumableRun`: what a training script adds to become movable and preemptible.

    run = ResumableRun(model, optimizer, scheduler)      # job id, store, cadence from env
    with run:
        start = run.restore()                            # 0, or the step to resume from
        data_state = run.data_state or {"epoch": 0, "position": 0}
        for step in range(start, total_steps):
            ...one optimizer step...; data_state = ...
            run.step_done(step, data_state)              # checkpoints when due / on notice
        run.finish()                                     # final checkpoint

A checkpoint taken at `step_done(step, ...)` holds the state after `step` completed, so
its store step is `step + 1` and `restore()` returns `step + 1`. It holds the model,
optimizer and scheduler state dicts, the RNG states of Python, numpy and torch, and
`data_state` (plain values: where the data loader is).

Preemption: SIGTERM, SIGUSR1, a cloud notice (AWS IMDSv2, GCE metadata; polled on a daemon
thread when HELIOTROPE_NOTICE_SOURCE says so) or the local notice file all set one flag;
the next `step_done` writes a checkpoint at once and exits the process with status 0.

Async checkpointing (`async_checkpoint=True`): `step_done` only copies the state into
reusable host buffers (pinned, and enqueued without waiting, for CUDA tensors); a
background thread serializes and writes it. The next checkpoint waits for the previous
write. A write that fails with an I/O or transient error is logged and retried at the next
due step (up to 3 in a row); a failure of the preemption or final checkpoint raises.

Distributed jobs (DDP, FSDP2; inside torch.distributed, after `init_process_group`): every
rank makes its own ResumableRun, at the same point of the script, and calls the same
methods with the same steps. A notice seen by any rank (a signal to one process, the
node's notice file, the cloud's metadata) is agreed by all ranks: the ranks all-reduce their
flags on a gloo group of their own, issued without waiting and collected at the next
`step_done` (so the agreement runs while that step computes), about once a second (rank 0
times its steps and sets the number of steps to the next agreement, carried in the same
all-reduce; or every `agree_every_steps` steps when given), and at every step where a
checkpoint is due by steps. All ranks then
checkpoint the same step and exit 0 together. Checkpoints are sharded
(torch.distributed.checkpoint, see `orchestrator.training.sharded`): each rank writes its
shards, rank 0 publishes the manifest, and `restore()` on every rank loads the newest one
that verifies on all of them, whatever world size wrote it. Every rank gets back its own
RNG states and `data_state` when the world size is unchanged; at another world size each
rank gets those of the same rank if it existed, else rank 0's (`restored_world_size`
tells the script which case it is). Async checkpointing works in a gang too: each rank
copies its shards into reusable host buffers at the agreed step and a writer thread saves
and publishes them on a gloo group of its own (so its collectives never meet the notice
agreement's) while training goes on; the next checkpoint, a preemption and `finish` wait
for it on every rank at the same step, so a failed write is seen by all ranks at once.

Environment (each overridden by the matching argument):
HELIOTROPE_JOB_ID, HELIOTROPE_CHECKPOINT_URI, HELIOTROPE_CHECKPOINT_STORAGE_OPTIONS (JSON
object for fsspec), HELIOTROPE_CHECKPOINT_EVERY_STEPS, HELIOTROPE_CHECKPOINT_EVERY_MINUTES
(neither set: every 30 minutes), HELIOTROPE_CHECKPOINT_ASYNC (1/0), HELIOTROPE_NOTICE_SOURCE
(aws | gcp | local), HELIOTROPE_METADATA_URL, HELIOTROPE_NOTICE_POLL_S,
HELIOTROPE_PREEMPT_FILE, HELIOTROPE_NOTICE_AGREE_EVERY_STEPS (distributed runs; unset: about
once a second).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any, Final

import torch

from orchestrator.checkpoints import (
    CheckpointExists,
    CheckpointRef,
    CheckpointStore,
    CorruptCheckpoint,
    WriteFn,
)
from orchestrator.errors import InputError, PermanentError, TransientError
from orchestrator.training.boot import wait_until_ready
from orchestrator.training.gang import Agreement, Gang
from orchestrator.training.notices import (
    FileNotices,
    NoticeSource,
    NoticeWatcher,
    PreemptionNotice,
    notice_source_from_env,
    poll_interval_from_env,
)
from orchestrator.training.progress import report_kept
from orchestrator.training.rng import capture_rng, restore_rng
from orchestrator.training.shard_layout import SHARDED_FORMAT, rank_file
from orchestrator.training.state_io import FORMAT, load_state_files, map_tensors, save_state_files

logger = logging.getLogger(__name__)

STATE_FILE: Final = "state"
DEFAULT_EVERY_MINUTES: Final = 30.0
AGREE_EVERY_S: Final = 1.0
"""Distributed runs: the target time between two notice agreements (unless fixed in steps)."""
MAX_AGREE_INTERVAL: Final = 10_000
MAX_CONSECUTIVE_FAILURES: Final = 3
_RETRYABLE = (OSError, TransientError, TimeoutError)


class ResumableRun:
    """Checkpoint/restore for one training job; see the module docstring for the contract.

    `store` and `notice_sources` replace what the environment would give (tests, custom
    setups). `handle_signals` installs SIGTERM/SIGUSR1 handlers (main thread only) for the
    life of the run. `exit_on_preemption=False` makes `step_done` return after the
    preemption checkpoint with `preempted` set, instead of raising SystemExit(0).
    `distributed`: None (default) works with all ranks whenever torch.distributed is
    initialized (then every rank must make its ResumableRun at the same point: that is a
    collective); False keeps to this process alone (a script where only rank 0 owns the
    whole state and checkpoints it)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        *,
        job_id: str | None = None,
        checkpoint_uri: str | None = None,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        async_checkpoint: bool | None = None,
        store: CheckpointStore | None = None,
        notice_sources: Sequence[NoticeSource] | None = None,
        handle_signals: bool = True,
        exit_on_preemption: bool = True,
        agree_every_steps: int | None = None,
        distributed: bool | None = None,
        environ: Mapping[str, str] | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.job_id = job_id or _env_str(env, "HELIOTROPE_JOB_ID", "the job id (or job_id=)")
        if store is None:
            uri = checkpoint_uri or _env_str(
                env, "HELIOTROPE_CHECKPOINT_URI", "the checkpoint store URI (or checkpoint_uri=)"
            )
            store = CheckpointStore(uri, **_storage_options(env))
        self.store = store
        self.store.list(self.job_id)  # validates the job id and reaches the store early
        self.every_steps = (
            every_steps
            if every_steps is not None
            else _env_number(env, "HELIOTROPE_CHECKPOINT_EVERY_STEPS", int)
        )
        self.every_minutes = (
            every_minutes
            if every_minutes is not None
            else _env_number(env, "HELIOTROPE_CHECKPOINT_EVERY_MINUTES", float)
        )
        if self.every_steps is not None and self.every_steps <= 0:
            raise InputError("ResumableRun", "every_steps", "an integer > 0", got=self.every_steps)
        if self.every_minutes is not None and self.every_minutes <= 0:
            raise InputError("ResumableRun", "every_minutes", "minutes > 0", got=self.every_minutes)
        if self.every_steps is None and self.every_minutes is None:
            self.every_minutes = DEFAULT_EVERY_MINUTES
        self.async_checkpoint = (
            async_checkpoint
            if async_checkpoint is not None
            else _env_bool(env, "HELIOTROPE_CHECKPOINT_ASYNC")
        )
        self.agree_every_steps: int | None = (
            agree_every_steps
            if agree_every_steps is not None
            else _env_number(env, "HELIOTROPE_NOTICE_AGREE_EVERY_STEPS", int)
        )
        """Steps between notice agreements; None: about every AGREE_EVERY_S seconds."""
        if self.agree_every_steps is not None and self.agree_every_steps <= 0:
            raise InputError(
                "ResumableRun", "agree_every_steps", "an integer > 0", got=self.agree_every_steps
            )
        self.exit_on_preemption = exit_on_preemption
        self._gang = Gang.current() if distributed is not False else None
        """The ranks of a distributed job (None in a single process)."""
        if distributed and self._gang is None:
            raise InputError(
                "ResumableRun",
                "distributed",
                "torch.distributed initialized first",
                got="no process group",
                fix="call torch.distributed.init_process_group() before",
            )
        self._save_gang: Gang | None = None
        """Async sharded saves: the gloo group the writer thread's collectives go on (its
        own, so they never interleave with the notice agreement's)."""
        self._stager: Any = None
        if self._gang is not None and self.async_checkpoint:
            self._save_gang = Gang.current()  # a collective, like making the run
        self._wall_clock = wall_clock
        self._monotonic = monotonic

        self.data_state: dict[str, Any] = {}
        self.restored_from: CheckpointRef | None = None
        self.last_checkpoint: CheckpointRef | None = None
        self.checkpoints: list[CheckpointRef] = []
        self.stall_s: list[float] = []
        """Seconds `step_done` blocked the loop for each checkpoint it started."""
        self.preempted: PreemptionNotice | None = None
        self.restored_world_size: int | None = None
        """World size of the run that wrote the restored checkpoint (1: single process)."""

        self._notice: PreemptionNotice | None = None
        self._notice_event = threading.Event()
        self._restored = False
        self._closed = False
        self._last_step: int | None = None  # steps completed at the last step_done
        self._last_data_state: Any = None
        self._ckpt_step: int | None = None  # steps completed at the last checkpoint started
        self._ckpt_mono = monotonic()
        self._failures = 0
        self._corrupt: dict[int, CheckpointRef] = {}
        self._buffers: list[torch.Tensor] = []
        self._buffers_ready: Future[list[torch.Tensor]] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[CheckpointRef | None] | None = None
        self._agreement: Agreement | None = None
        self._agree_interval = self.agree_every_steps or 1
        self._next_agree = 0  # completed steps at which the next agreement is issued
        self._step_mono: float | None = None
        self._step_s = 0.0  # rank 0's moving average of the time between step_done calls

        sources = (
            list(notice_sources)
            if notice_sources is not None
            else [s for s in [notice_source_from_env(env)] if s is not None]
        )
        self._inline_sources = [s for s in sources if isinstance(s, FileNotices)]
        interval = poll_interval_from_env(env)
        self._watchers = [
            NoticeWatcher(s, self.notify_preemption, interval_s=interval).start()
            for s in sources
            if not isinstance(s, FileNotices)
        ]
        self._old_handlers: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    # -- notices ------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.notify_preemption(PreemptionNotice(signal.Signals(signum).name, "signal"))

    def notify_preemption(self, notice: PreemptionNotice) -> None:
        """Record a preemption notice (thread- and signal-safe); the next `step_done`
        checkpoints and exits."""
        if self._notice is None:
            self._notice = notice
        self._notice_event.set()

    @property
    def notice(self) -> PreemptionNotice | None:
        return self._notice

    # -- restore ------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the newest checkpoint that verifies (falling back past corrupt ones) into
        the model, optimizer, scheduler and RNGs; set `data_state`; return the number of
        steps already done (0 with no checkpoint). In a distributed run, every rank calls
        it and all load the same checkpoint. Then it waits for the instance's start-up to
        end where the provider emulates one (`orchestrator.training.boot`)."""
        step = self._restore_gang(self._gang) if self._gang is not None else self._restore()
        waited = wait_until_ready()
        if waited:
            logger.info("job %s: waited %.1f s for the instance's start-up", self.job_id, waited)
            self._ckpt_mono = self._monotonic()
        return step

    def _restore(self) -> int:
        for ref in reversed(self.store.list(self.job_id)):
            try:
                if self.store.metadata(ref).get("format") == SHARDED_FORMAT:
                    self._load_sharded(ref, None)
                else:
                    self._apply(ref, self._load(ref))
            except CorruptCheckpoint as exc:
                logger.warning(
                    "checkpoint %s is corrupt, trying the previous one: %s", ref.uri, exc
                )
                self._corrupt[ref.step] = ref
                continue
            return self._restored_at(ref)
        return self._restored_at(None)

    def _apply(self, ref: CheckpointRef, tree: Any) -> None:
        self.model.load_state_dict(tree["model"])
        self.optimizer.load_state_dict(tree["optimizer"])
        if self.scheduler is not None and tree.get("scheduler") is not None:
            self.scheduler.load_state_dict(tree["scheduler"])
        restore_rng(tree["rng"])
        self.data_state = tree["data_state"] if tree["data_state"] is not None else {}
        self.restored_world_size = 1

    def _restored_at(self, ref: CheckpointRef | None) -> int:
        self._restored = True
        self._ckpt_mono = self._monotonic()
        if ref is None:
            self._ckpt_step = 0
            logger.info(
                "job %s: no checkpoint in %s, starting at step 0", self.job_id, self.store.root_uri
            )
            return 0
        self.restored_from = self.last_checkpoint = ref
        self._ckpt_step = ref.step
        logger.info("restored job %s from %s: resuming at step %d", self.job_id, ref.uri, ref.step)
        return ref.step

    def _restore_gang(self, gang: Gang) -> int:
        refs: list[CheckpointRef] = gang.broadcast(
            self.store.list(self.job_id) if gang.is_leader else None
        )
        for ref in reversed(refs):
            corrupt: BaseException | None = None
            failed: BaseException | None = None
            try:
                fmt = self.store.metadata(ref).get("format")
                if fmt != SHARDED_FORMAT:
                    failed = PermanentError(
                        f"{ref.uri}: written by a single-process run ({fmt}); a distributed run "
                        "restores sharded checkpoints only: resume it in one process first, "
                        "or start the job afresh"
                    )
            except CorruptCheckpoint as exc:
                corrupt = exc
            except Exception as exc:
                failed = exc
            if self._agreed_failure(gang, ref, corrupt, failed):
                continue
            try:
                self._load_sharded(ref, gang)
            except CorruptCheckpoint as exc:
                corrupt = exc
            except Exception as exc:
                failed = exc
            if self._agreed_failure(gang, ref, corrupt, failed):
                continue
            return self._restored_at(ref)
        return self._restored_at(None)

    def _agreed_failure(
        self,
        gang: Gang,
        ref: CheckpointRef,
        corrupt: BaseException | None,
        failed: BaseException | None,
    ) -> bool:
        """Whether `ref` is corrupt on any rank (all ranks then try the previous one);
        raises on every rank if it failed otherwise on any."""
        any_corrupt, any_failed = map(bool, gang.agree([corrupt is not None, failed is not None]))
        if any_failed:
            if failed is not None:
                raise failed
            raise PermanentError(
                f"{ref.uri}: could not be restored on another rank (its log says why)"
            )
        if any_corrupt:
            logger.warning(
                "checkpoint %s is corrupt%s, trying the previous one: %s",
                ref.uri,
                "" if corrupt is not None else " on another rank",
                corrupt,
            )
            self._corrupt[ref.step] = ref
        return any_corrupt

    def _load_sharded(self, ref: CheckpointRef, gang: Gang | None) -> None:
        """Load a sharded checkpoint (a collective in a distributed run, as it is for DCP)."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        from orchestrator.training.sharded import SafeLoadPlanner, StoreReader

        saved_world = int(self.store.metadata(ref).get("world_size", "1"))
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single
                warnings.filterwarnings(  # process": it is, without a gang
                    "ignore", message="torch.distributed is disabled", category=UserWarning
                )
                dcp_load(
                    state,
                    storage_reader=StoreReader(self.store, ref),
                    planner=SafeLoadPlanner(),
                    no_dist=gang is None,
                    process_group=gang.group if gang is not None else None,
                )
        except CheckpointException as exc:
            raise _unwrap(exc, ref) from None
        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd
        )
        rank = gang.rank if gang is not None else 0
        world = gang.world_size if gang is not None else 1
        name = rank_file(rank if rank < saved_world else 0)
        extras = load_state_files(lambda n: self.store.open_file(ref, n), name=name)
        if not isinstance(extras, dict) or extras.get("format") != SHARDED_FORMAT:
            raise PermanentError(f"{ref.uri}/{name}: not a ResumableRun rank file")
        if self.scheduler is not None and extras.get("scheduler") is not None:
            self.scheduler.load_state_dict(extras["scheduler"])
        restore_rng(extras["rng"])
        self.data_state = extras["data_state"] if extras["data_state"] is not None else {}
        self.restored_world_size = saved_world
        if saved_world != world:
            logger.info(
                "job %s: checkpoint %s was written by %d ranks, restored into %d",
                self.job_id,
                ref.uri,
                saved_world,
                world,
            )

    def _load(self, ref: CheckpointRef) -> Any:
        try:
            tree = load_state_files(lambda name: self.store.open_file(ref, name), name=STATE_FILE)
        except CorruptCheckpoint:
            raise
        except Exception as exc:  # a damaged header can fail anywhere in unpickling
            self.store.verify(ref)  # raises CorruptCheckpoint if that is the reason
            raise PermanentError(f"{ref.uri}: verifies but cannot be loaded: {exc}") from exc
        if not isinstance(tree, dict) or tree.get("format") != FORMAT:
            raise PermanentError(f"{ref.uri}: not a ResumableRun checkpoint")
        return tree

    # -- the loop -----------------------------------------------------------------------

    def step_done(self, step: int, data_state: Mapping[str, Any] | None = None) -> None:
        """Call after optimizer step number `step` (0-based) with where the data is.
        Checkpoints when due, or at once (then exits 0) when a preemption notice is pending."""
        if self.preempted is not None:
            return  # exit_on_preemption=False: the loop should stop; nothing more is saved
        if not self._restored:
            raise PermanentError(
                "ResumableRun.step_done() before restore(): call restore() "
                "first, so checkpoints continue the stored ones"
            )
        if self._closed:
            raise PermanentError("ResumableRun.step_done() after close() or finish()")
        if self._gang is None:  # a gang collects a background write where all ranks do
            self._collect_pending(block=False)
        completed = step + 1
        self._last_step, self._last_data_state = completed, data_state
        for source in self._inline_sources:
            if not self._notice_event.is_set() and (notice := source.poll()) is not None:
                self.notify_preemption(notice)
        if self._gang is not None:
            self._gang_step(self._gang, completed, data_state)
            return
        if self._notice_event.is_set():
            self._preempt(completed, data_state)
            return
        if self.async_checkpoint and self._buffers_ready is None:
            self._prepare_buffers(completed, data_state)
        if self._due(completed):
            self._checkpoint(
                completed, data_state, reason="periodic", sync=not self.async_checkpoint
            )
        if self._notice_event.is_set():  # arrived while checkpointing
            self._preempt(completed, data_state)

    def _gang_step(self, gang: Gang, completed: int, data_state: Mapping[str, Any] | None) -> None:
        """`step_done` of a distributed run: act on what all ranks agreed."""
        now = self._monotonic()
        if self._step_mono is not None:
            took = now - self._step_mono
            self._step_s = took if self._step_s == 0.0 else 0.8 * self._step_s + 0.2 * took
        self._step_mono = now
        notice = time_due = False
        if self._agreement is not None:  # issued at the previous step_done, on every rank
            flags = self._agreement.result()
            self._agreement = None
            notice, time_due = bool(flags[0]), bool(flags[1])
            if self.agree_every_steps is None:  # rank 0's proposal, the same on every rank
                self._agree_interval = max(1, flags[2])
        step_due = self._due_steps(completed)
        if step_due and not notice:  # the checkpoint syncs the ranks anyway: agree now
            flags = gang.agree([self._notice_event.is_set(), self._due_time(completed)])
            notice, time_due = bool(flags[0]), time_due or bool(flags[1])
        if notice:
            if self._notice is None:
                self._notice = PreemptionNotice("gang", "a notice on another rank")
            self._preempt(completed, data_state)
            return
        if step_due or (time_due and completed > (self._ckpt_step or 0)):
            self._checkpoint(
                completed, data_state, reason="periodic", sync=not self.async_checkpoint
            )
        if completed >= self._next_agree:
            self._agreement = gang.start_agree(
                [
                    self._notice_event.is_set(),
                    self._due_time(completed),
                    self._proposed_interval(gang),
                ]
            )
            self._next_agree = completed + self._agree_interval

    def _proposed_interval(self, gang: Gang) -> int:
        """Rank 0's steps to the next agreement: about AGREE_EVERY_S of its steps (the
        all-reduce takes the largest proposal: the other ranks propose 0)."""
        if not gang.is_leader:
            return 0
        if self.agree_every_steps is not None or self._step_s <= 0:
            return self._agree_interval
        return int(min(MAX_AGREE_INTERVAL, max(1, AGREE_EVERY_S / self._step_s)))

    def _due(self, completed: int) -> bool:
        return self._due_steps(completed) or self._due_time(completed)

    def _due_steps(self, completed: int) -> bool:
        last = self._ckpt_step if self._ckpt_step is not None else 0
        return (
            self.every_steps is not None
            and completed > last
            and completed - last >= self.every_steps
        )

    def _due_time(self, completed: int) -> bool:
        last = self._ckpt_step if self._ckpt_step is not None else 0
        return (
            self.every_minutes is not None
            and completed > last
            and self._monotonic() - self._ckpt_mono >= self.every_minutes * 60.0
        )

    def finish(self) -> CheckpointRef | None:
        """Checkpoint the last completed step (unless already done), wait for every write,
        and close. Returns the last checkpoint."""
        if not self._closed:
            self._collect_pending(block=True)  # a failed background write is redone here
            if self._last_step is not None and not self._saved(self._last_step):
                self._checkpoint(self._last_step, self._last_data_state, reason="final", sync=True)
        self.close()
        return self.last_checkpoint

    def _preempt(self, completed: int, data_state: Mapping[str, Any] | None) -> None:
        notice = self._notice or PreemptionNotice("unknown")
        self._collect_pending(block=True)  # a failed background write is redone here
        if not self._saved(completed):
            self._checkpoint(completed, data_state, reason="preemption", sync=True)
        self.close()
        self.preempted = notice
        ref = self.last_checkpoint
        if ref is not None and (self._gang is None or self._gang.is_leader):
            report_kept(ref.step)  # what the preemption keeps, for the controller
        logger.warning(
            "preempted (%s%s): checkpoint %s holds step %d; %s",
            notice.source,
            f": {notice.detail}" if notice.detail else "",
            ref.uri if ref else "(none)",
            ref.step if ref else 0,
            "exiting with status 0" if self.exit_on_preemption else "stopping",
        )
        if self.exit_on_preemption:
            raise SystemExit(0)

    # -- checkpointing ------------------------------------------------------------------

    def _saved(self, completed: int) -> bool:
        """Whether a checkpoint of this step was written (or restored) successfully."""
        return self.last_checkpoint is not None and self.last_checkpoint.step == completed

    def _state_tree(self, completed: int, data_state: Mapping[str, Any] | None) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "step": completed,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": capture_rng(),
            "data_state": dict(data_state) if data_state is not None else None,
        }

    def _checkpoint(
        self, completed: int, data_state: Mapping[str, Any] | None, *, reason: str, sync: bool
    ) -> None:
        critical = reason != "periodic"
        started = time.perf_counter()
        if self._gang is not None:
            self._checkpoint_gang(self._gang, completed, data_state, reason, sync=sync)
            self.stall_s.append(time.perf_counter() - started)
            return
        self._collect_pending(block=True)  # one write at a time; reuses its buffers after
        tree = self._state_tree(completed, data_state)
        self._ckpt_step, self._ckpt_mono = completed, self._monotonic()
        if sync:
            try:
                self._write(completed, tree, reason)
            except _RETRYABLE as exc:
                self._write_failed(exc, critical)
            finally:
                self.stall_s.append(time.perf_counter() - started)
            return
        snapshot, events = self._snapshot(tree)
        self._pending = self._writer().submit(
            self._write_async, completed, snapshot, events, reason
        )
        self.stall_s.append(time.perf_counter() - started)

    def _prepare_buffers(self, completed: int, data_state: Mapping[str, Any] | None) -> None:
        """Allocate and touch the host buffers on the writer thread, once the state has its
        final shapes (after the first optimizer step), so that the first snapshot does not
        pay for page faults on fresh memory."""
        specs: list[tuple[torch.Size, torch.dtype, bool]] = []

        def spec(t: torch.Tensor) -> torch.Tensor:
            specs.append((t.shape, t.dtype, t.is_cuda and torch.cuda.is_available()))
            return t

        map_tensors(self._state_tree(completed, data_state), spec)

        def allocate() -> list[torch.Tensor]:
            return [
                torch.empty(shape, dtype=dtype, pin_memory=pin).zero_()
                for shape, dtype, pin in specs
            ]

        self._buffers_ready = self._writer().submit(allocate)

    def _writer(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        return self._pool

    def _snapshot(self, tree: dict[str, Any]) -> tuple[Any, list[Any]]:
        """Copy every tensor into this run's reusable host buffers (the loop's only stall)."""
        if self._buffers_ready is not None and not self._buffers:
            self._buffers = self._buffers_ready.result()
        index = 0
        devices: set[torch.device] = set()

        def copy(t: torch.Tensor) -> torch.Tensor:
            nonlocal index
            src = t.detach()
            buf = self._buffers[index] if index < len(self._buffers) else None
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(
                    src.shape, dtype=src.dtype, pin_memory=src.is_cuda and torch.cuda.is_available()
                )
                if index < len(self._buffers):
                    self._buffers[index] = buf
                else:
                    self._buffers.append(buf)
            if src.is_cuda:
                devices.add(src.device)
                buf.copy_(src, non_blocking=True)
            else:
                buf.copy_(src)
            index += 1
            return buf

        snapshot = map_tensors(tree, copy)
        del self._buffers[index:]
        events = []
        for device in devices:  # the writer waits for these copies, the loop does not
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return snapshot, events

    def _write_async(
        self, completed: int, snapshot: Any, events: list[Any], reason: str
    ) -> CheckpointRef | None:
        for event in events:
            event.synchronize()
        return self._write(completed, snapshot, reason)

    def _write(self, completed: int, tree: Any, reason: str) -> CheckpointRef:
        def files(open_file: WriteFn) -> None:
            save_state_files(tree, open_file, name=STATE_FILE)

        metadata = {"format": FORMAT, "reason": reason, "torch": torch.__version__}
        now_s = self._wall_clock()
        try:
            ref = self.store.write(self.job_id, completed, files, now_s=now_s, metadata=metadata)
        except CheckpointExists:
            # Only a corrupt checkpoint that restore() skipped may stand in the way.
            stale = self._corrupt.pop(completed, None)
            if stale is None:
                raise
            self.store.quarantine(stale)
            ref = self.store.write(self.job_id, completed, files, now_s=now_s, metadata=metadata)
        self.last_checkpoint = ref
        self.checkpoints.append(ref)
        self._failures = 0
        return ref

    def _checkpoint_gang(
        self,
        gang: Gang,
        completed: int,
        data_state: Mapping[str, Any] | None,
        reason: str,
        *,
        sync: bool,
    ) -> None:
        """A sharded checkpoint, taken on every rank at the same step. Async: the state is
        copied into host buffers here (the loop's only stall) and a writer thread saves and
        publishes it on the run's own gloo group while training goes on; a write still in
        flight is waited for first, on every rank at this same step."""
        self._collect_pending(block=True)
        self._ckpt_step, self._ckpt_mono = completed, self._monotonic()
        try:
            state, extras = self._sharded_state(gang, completed, data_state)
            stale = self._corrupt.pop(completed, None)  # the same on every rank
            if sync or self._save_gang is None:
                self._save_sharded(self._save_gang or gang, completed, state, extras, reason, stale)
                return
            staged = self._stage(state)
            self._pending = self._writer().submit(
                self._save_sharded, self._save_gang, completed, staged, extras, reason, stale
            )
        except _RETRYABLE as exc:
            self._write_failed(exc, reason != "periodic")

    def _sharded_state(
        self, gang: Gang, completed: int, data_state: Mapping[str, Any] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What DCP saves (model and optimizer, sharded as they are held) and this rank's
        own small file (RNG states, data position, scheduler)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        extras = {
            "format": SHARDED_FORMAT,
            "step": completed,
            "rank": gang.rank,
            "world_size": gang.world_size,
            "rng": capture_rng(),
            "data_state": dict(data_state) if data_state is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }
        return {"model": model_sd, "optimizer": optim_sd}, copy.deepcopy(extras)

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A host copy of `state` (DTensors stay DTensors over their local shards) in
        buffers reused from one checkpoint to the next."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None:
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=cuda,
                )
            )
        staged: dict[str, Any] = self._stager.stage(state)
        return staged

    def _save_sharded(
        self,
        gang: Gang,
        completed: int,
        state: dict[str, Any],
        extras: dict[str, Any],
        reason: str,
        stale: CheckpointRef | None,
    ) -> CheckpointRef:
        """Every rank writes its part; rank 0 publishes (the manifest last); every rank
        gets the same outcome (the ref, or the same error type: TransientError when
        retrying may help). Collectives on `gang` only: in a writer thread, the run's own
        group."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        from orchestrator.training.sharded import StoreWriter

        if stale is not None:  # a corrupt checkpoint of this step that restore() skipped
            if gang.is_leader:
                self.store.quarantine(stale)
            gang.barrier()

        def extra(open_file: WriteFn) -> None:
            save_state_files(extras, open_file, name=rank_file(gang.rank))

        writer = StoreWriter(self.store, self.job_id, completed, extra=extra)
        try:
            dcp_save(state, storage_writer=writer, process_group=gang.group)
        except CheckpointException as exc:  # raised on every rank
            if gang.is_leader:
                self.store.discard_unpublished(self.job_id, completed)
            raise _unwrap(exc, None) from None
        parts = gang.gather(writer.entries)
        outcome: tuple[str, Any] | None = None
        if gang.is_leader:
            outcome = self._publish_parts(gang, completed, parts, reason)
        outcome = gang.broadcast(outcome)
        assert outcome is not None
        if outcome[0] == "transient":
            raise TransientError(f"publishing the checkpoint of step {completed}: {outcome[1]}")
        if outcome[0] != "ok":
            raise PermanentError(f"publishing the checkpoint of step {completed}: {outcome[1]}")
        ref: CheckpointRef = outcome[1]
        self.last_checkpoint = ref
        self.checkpoints.append(ref)
        self._failures = 0
        return ref

    def _publish_parts(
        self, gang: Gang, completed: int, parts: list[Any], reason: str
    ) -> tuple[str, Any]:
        """Rank 0: publish every rank's files as one checkpoint; ("ok", ref), or the kind of
        failure and its message (the unpublished files removed)."""
        entries = {name: entry for part in parts for name, entry in part.items()}
        metadata = {
            "format": SHARDED_FORMAT,
            "reason": reason,
            "torch": torch.__version__,
            "world_size": str(gang.world_size),
        }
        try:
            published = self.store.publish(
                self.job_id, completed, entries, now_s=self._wall_clock(), metadata=metadata
            )
        except Exception as exc:
            self.store.discard_unpublished(self.job_id, completed)
            kind = "transient" if isinstance(exc, _RETRYABLE) else "permanent"
            return (kind, f"{type(exc).__name__}: {exc}")
        return ("ok", published)

    def _write_failed(self, exc: BaseException, critical: bool) -> None:
        self._failures += 1
        # due again from the last checkpoint that made it: retried at the next step_done
        self._ckpt_step = self.last_checkpoint.step if self.last_checkpoint else 0
        if critical or self._failures >= MAX_CONSECUTIVE_FAILURES:
            raise exc
        logger.error(
            "checkpoint write failed (%d in a row; training goes on): %s", self._failures, exc
        )

    def _collect_pending(self, *, block: bool) -> None:
        pending = self._pending
        if pending is None or (not block and not pending.done()):
            return
        self._pending = None
        exc = pending.exception()
        if exc is None:
            return
        if isinstance(exc, _RETRYABLE):
            self._write_failed(exc, critical=False)
        else:
            raise exc

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Wait for a pending write (raising its error), stop watchers, restore signals."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._agreement is not None:  # every rank issued it: every rank collects it
                agreement, self._agreement = self._agreement, None
                agreement.result()
            self._collect_pending(block=True)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            for watcher in self._watchers:
                watcher.stop()
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
            self._buffers.clear()
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def __enter__(self) -> ResumableRun:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except Exception:
            logger.exception("while closing after an error")


def _unwrap(exc: BaseException, ref: CheckpointRef | None) -> Exception:
    """What a DCP CheckpointException (raised on every rank, carrying each failed rank's
    exception) means for the caller: the CorruptCheckpoint if a rank read a corrupt file,
    a TransientError if every failure was an I/O or transient error, else a
    PermanentError."""
    failures: dict[int, Any] = getattr(exc, "failures", {}) or {}
    errors = [
        (rank, pair[0] if isinstance(pair, tuple) else pair)
        for rank, pair in sorted(failures.items())
    ]
    for _rank, error in errors:
        if isinstance(error, CorruptCheckpoint):
            return error
    summary = "; ".join(f"rank {rank}: {type(e).__name__}: {e}" for rank, e in errors[:4])
    where = f"{ref.uri}: " if ref is not None else ""
    if errors and all(isinstance(e, _RETRYABLE) for _r, e in errors):
        return TransientError(f"{where}sharded checkpoint I/O failed ({summary})")
    return PermanentError(f"{where}sharded checkpoint failed ({summary or exc})")


def _env_str(env: Mapping[str, str], name: str, what: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise InputError(
            "environment",
            name,
            what,
            got="unset",
            fix=f"set {name} (the orchestrator sets it when it launches the job)",
        )
    return value


def _env_number(env: Mapping[str, str], name: str, kind: type[int] | type[float]) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if not value > 0:
        raise InputError("environment", name, f"a {kind.__name__} > 0", got=repr(raw))
    return value


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise InputError("environment", name, "1 or 0", got=repr(raw))


def _storage_options(env: Mapping[str, str]) -> dict[str, Any]:
    raw = env.get("HELIOTROPE_CHECKPOINT_STORAGE_OPTIONS", "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InputError(
            "environment",
            "HELIOTROPE_CHECKPOINT_STORAGE_OPTIONS",
            "a JSON object of fsspec storage options",
            got=raw[:80],
        )
    return value
