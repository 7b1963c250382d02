"""The ``Distributed`` API family: ``torch.distributed`` collectives and point-to-point calls.

Entries are ``Distributed.{api}.{n}.forward`` (spec sections 2.1, 7.1) with the keys of an
API forward entry (spec 3.2): ``input_args``, ``input_kwargs``, ``is_recompute``,
``output``. Following spec 3.2 for collectives, ``output`` is not the return value (None or
a ``Work`` handle) but **all positional arguments followed by the keyword-argument values,
read after the collective completed**: the in-place buffers after the call
(``dist.all_reduce(t)`` → ``output[0]`` is ``t`` holding the reduced values). The inputs
are recorded before the call runs (spec 9, fix 6), so an in-place collective shows the
tensor before (``input_args``) and after (``output``).

Values (spec 3.3 with fixes 4/13 of section 9):

* ``ReduceOp``: ``{"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"}``;
* ``ProcessGroup``: ``{"type": "torch.distributed.ProcessGroup", "value": [0, 1],
  "group_ranks": [0, 1], "group_id": "<md5 hex of str(ranks)>"}`` (``value`` = the global
  ranks of the group; the two extra keys keep upstream's spelling);
* ``P2POp`` (``batch_isend_irecv``): an object ``{"class_type": {"type": "str", "value":
  "torch.distributed.P2POp"}, "op": {"type": "str", "value": "isend"}, "tensor": {...},
  "peer": {...}, "tag": {...}, "group": ...}``;
* source/destination ranks, tags, ``async_op``: ordinary int/bool values.

Asynchronous calls (``async_op=True``, ``isend``, ``irecv``, ``batch_isend_irecv``) stay
asynchronous (spec 9, fix 29): the call returns at once; the inputs are recorded at call
time and the output when the work completes. Where the backend gives the work a future
(gloo and NCCL collectives) a done-callback on that future records the output, on the
thread that completes the work; the caller gets the very ``Work`` object the backend
returned. Where it does not (gloo ``isend``/``irecv``: "Work::getFuture not implemented"),
the caller gets a :class:`RecordingWork`, a ``torch.distributed.Work`` subclass that
forwards every method to the backend's work and records the output when ``wait()``
returns successfully (work only polled with ``is_completed()`` and never waited for
leaves its entry without ``output``). Nothing here waits or synchronises.

The wrappers are :class:`DistributedWrapper` objects that compare equal to the function
they wrap, so torch's own identity checks keep working whichever of the two a script
holds (``P2POp(dist.isend, ...)`` checks ``op in [isend, irecv]`` against the originals). The output rows arrive in the log later than the input rows, under the same
entry name; the exporter and the ``calls`` view merge them, so the entry keeps its place
(the call order) in dump.json. Work that completes after its step was finished
(``step()``) is not recorded (the step is already exported), and work that never
completes leaves the entry without ``output``.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import threading
from typing import Any, Callable, Optional

import torch

from msprobe.pytorch.compiled import is_compiling
from store import schema
from store.records import Call, Leaf

logger = logging.getLogger("msprobe")

FAMILY = "Distributed"


def distributed_module() -> Any:
    """``torch.distributed`` when this torch build has it, else None (family skipped)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    return dist


# --- values -----------------------------------------------------------------------------
def group_ranks(group: Any) -> Optional[list[int]]:
    """Global ranks of ``group`` (a ``ProcessGroup``), or None where they cannot be told
    (the process is not a member, or the default group is not initialised)."""
    dist = distributed_module()
    try:
        return list(dist.get_process_group_ranks(group))
    except Exception:
        return None


def distributed_value(obj: Any) -> Optional[dict]:
    """The JSON record of a ``ReduceOp`` or ``ProcessGroup`` value; None for other objects.

    >>> distributed_value(torch.distributed.ReduceOp.SUM)
    {'type': 'torch.distributed.ReduceOp', 'value': 'RedOpType.SUM'}
    """
    dist = distributed_module()
    if dist is None:
        return None
    if isinstance(obj, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        op = obj if isinstance(obj, dist.ReduceOp.RedOpType) else getattr(obj, "op", obj)
        text = str(op)
        if not text.startswith("RedOpType."):
            name = getattr(op, "name", None)
            text = f"RedOpType.{name}" if name else text
        return {"type": "torch.distributed.ReduceOp", "value": text}
    if isinstance(obj, dist.ProcessGroup):
        ranks = group_ranks(obj)
        gid = hashlib.md5(str(ranks).encode(), usedforsecurity=False).hexdigest() if ranks is not None else None
        return {"type": "torch.distributed.ProcessGroup", "value": ranks, "group_ranks": ranks, "group_id": gid}
    return None


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` with every ``P2POp`` turned into a dict the leaf builder walks."""
    dist = distributed_module()
    if dist is None:
        return value
    if isinstance(value, dist.P2POp):
        op = getattr(value.op, "__name__", None) or str(value.op)
        return {"class_type": "torch.distributed.P2POp", "op": op, "tensor": value.tensor,
                "peer": value.peer, "tag": value.tag, "group": value.group}
    if depth < 4 and isinstance(value, list) and any(isinstance(v, dist.P2POp) for v in value):
        return [_plain(v, depth + 1) for v in value]
    return value


def _works(out: Any) -> list:
    """The ``Work`` handles a call returned (one, a list of them, or none)."""
    dist = distributed_module()
    if isinstance(out, dist.Work):
        return [out]
    if isinstance(out, list) and out and all(isinstance(w, dist.Work) for w in out):
        return list(out)
    return []


# --- the recorder of the family ------------------------------------------------------------
class DistributedCalls:
    """Records ``torch.distributed`` calls for one :class:`msprobe.pytorch.recorder.Recorder`.

    Args:
        recorder: the debugger's recorder (its session, leaf builder, module stack).
    """

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder
        self.session = recorder.session

    def record(self, original: Callable, family: str, key: str, args: tuple, kwargs: dict) -> Any:
        """Run ``original(*args, **kwargs)`` recording it as ``{key}.{n}.forward``.

        Returns what ``original`` returned; for asynchronous work without a future, a
        :class:`RecordingWork` (or a list of them) in place of each ``Work``. Exceptions
        of ``original`` propagate unchanged; internal errors are logged and stop
        recording, never raised.
        """
        s = self.session
        tls = s._tls
        tls.busy = True
        memo = self.recorder.leaves.memo
        memo.clear()
        try:
            plan = None
            try:
                plan = self._before(key, args, kwargs)
            except Exception as exc:
                self.recorder.internal_error(exc)
            memo.clear()  # the inputs' statistics are stale once the collective wrote them
            out = original(*args, **kwargs)
            if plan is None:
                return out
            try:
                return self._after(plan, args, kwargs, out)
            except Exception as exc:
                self.recorder.internal_error(exc)
                return out
        finally:
            # collectives write tensors without bumping version counters, maybe later
            # (async work): nothing recorded around one is reused (msprobe.pytorch.stats_memo)
            memo.clear()
            tls.busy = False

    def _before(self, key: str, args: tuple, kwargs: dict) -> Optional[Call]:
        s, dm, rec = self.session, self.recorder.dm, self.recorder
        n = s.api_counter.next(key)
        name = f"{key}.{n}.forward"
        if not (dm.forward and s.accepts(name)):
            return None
        leaves: list[Leaf] = []
        keys: list[str] = []
        if dm.allows("forward", "input"):
            rec.leaves.for_entry(name)
            rec.leaves.sequence("input_args", [_plain(a) for a in args], leaves)
            rec.leaves.mapping("input_kwargs", {k: _plain(v) for k, v in kwargs.items()}, leaves)
            keys += ["input_args", "input_kwargs"]
        keys.append("is_recompute")
        from msprobe.pytorch.recorder import in_recompute  # local: recorder -> leaves -> this module
        return Call(step=s.step, kind=schema.API_FORWARD, name=name, api_type=FAMILY,
                    parent=rec.parent(), stack_id=s.stacks.capture(), is_recompute=in_recompute(),
                    keys=tuple(keys), leaves=tuple(leaves))

    def _after(self, plan: Call, args: tuple, kwargs: dict, out: Any) -> Any:
        want_out = self.recorder.dm.allows("forward", "output")
        works = _works(out)
        if not works:
            if want_out:
                plan = Call(step=plan.step, kind=plan.kind, name=plan.name, api_type=plan.api_type,
                            parent=plan.parent, stack_id=plan.stack_id, is_recompute=plan.is_recompute,
                            keys=plan.keys + ("output",), leaves=plan.leaves + self._output_leaves(plan.name, args, kwargs))
            self.recorder.emit(plan)
            return out
        self.recorder.emit(plan)
        if not want_out:
            return out
        done = _Countdown(len(works), lambda: self._emit_output(plan, args, kwargs))
        futures = []
        try:
            futures = [w.get_future() for w in works]
        except RuntimeError:
            futures = []
        if futures:
            for fut in futures:
                fut.add_done_callback(done.on_future)
            return out
        wrapped = [RecordingWork(w, done) for w in works]
        return wrapped[0] if len(works) == 1 and not isinstance(out, list) else wrapped

    def _output_leaves(self, name: str, args: tuple, kwargs: dict) -> tuple[Leaf, ...]:
        leaves: list[Leaf] = []
        self.recorder.leaves.memo.clear()  # maybe completed later, on another thread
        self.recorder.leaves.for_entry(name)
        self.recorder.leaves.sequence("output", [_plain(v) for v in (*args, *kwargs.values())], leaves)
        return tuple(leaves)

    def _emit_output(self, plan: Call, args: tuple, kwargs: dict) -> None:
        """Record the output of completed asynchronous work (any thread)."""
        s = self.session
        if not s.open_step(plan.step):
            return
        with self.recorder.guarded():
            self.recorder.emit(Call(step=plan.step, kind=plan.kind, name=plan.name, api_type=plan.api_type,
                                    keys=("output",), leaves=self._output_leaves(plan.name, args, kwargs)))


class DistributedWrapper:
    """The wrapper installed in place of one ``torch.distributed`` function.

    Calls ``record(original, family, key, args, kwargs)`` while ``session`` records and
    the thread is not inside msprobe or another recorded call; otherwise calls
    ``original`` directly (one attribute test and two flag reads: a rank that records
    nothing pays only that). Compares equal to (and hashes like) ``original``.

    Args:
        original: the function replaced.
        key: ``Distributed.{api}``.
        record: the recording entry point (:meth:`DistributedCalls.record`).
        session: the debugger's session.
        memo: the recorder's :class:`~msprobe.pytorch.stats_memo.StatsMemo`, emptied when a
            call runs unrecorded (a collective writes tensors without bumping versions).
    """

    def __init__(self, original: Callable, key: str, record: Callable, session: Any, memo: Any) -> None:
        functools.update_wrapper(self, original)
        self._key = key
        self._record = record
        self._session = session
        self._memo = memo
        self._memo_entries = memo.entries
        self.__msprobe_original__ = original
        self.__msprobe_disabled__ = False

    def __call__(self, *args, **kwargs):
        original = self.__msprobe_original__
        if is_compiling():  # torch.compile traces only the original (msprobe.pytorch.compiled)
            return original(*args, **kwargs)
        session = self._session
        if self._key == _BATCH_P2P:
            original = functools.partial(_call_unwrapped_p2p, original)
        busy = session._tls.busy
        if session.recording and not busy and not self.__msprobe_disabled__:
            return self._record(original, FAMILY, self._key, args, kwargs)
        if self._memo_entries and not busy:
            self._memo.clear()
        return original(*args, **kwargs)

    def _root(self) -> Any:
        fn = self.__msprobe_original__
        while isinstance(fn, DistributedWrapper):
            fn = fn.__msprobe_original__
        return fn

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, DistributedWrapper):
            return other._root() is self._root()
        return other is self._root()

    def __hash__(self) -> int:
        return hash(self._root())

    def __repr__(self) -> str:
        return f"<msprobe wrapper of {self._root()!r}>"


_BATCH_P2P = f"{FAMILY}.batch_isend_irecv"


def _call_unwrapped_p2p(original: Callable, p2p_op_list: Any, *args, **kwargs) -> Any:
    """Call ``batch_isend_irecv`` with each ``P2POp.op`` that is a :class:`DistributedWrapper`
    replaced by the function it wraps for the duration of the call: torch tells sends from
    receives by identity (``op.op is isend``), which a wrapper cannot pass."""
    swapped = []
    try:
        for p2p in p2p_op_list if isinstance(p2p_op_list, (list, tuple)) else ():
            op = getattr(p2p, "op", None)
            if isinstance(op, DistributedWrapper):
                swapped.append((p2p, op))
                p2p.op = op._root()
        return original(p2p_op_list, *args, **kwargs)
    finally:
        for p2p, op in swapped:
            p2p.op = op


class _Countdown:
    """Runs ``action`` once, when ``count`` pieces of work have completed successfully."""

    __slots__ = ("count", "action", "lock", "failed")

    def __init__(self, count: int, action: Callable[[], None]) -> None:
        self.count = count
        self.action = action
        self.lock = threading.Lock()
        self.failed = False

    def one_done(self, ok: bool = True) -> None:
        with self.lock:
            if self.count <= 0:
                return
            self.failed = self.failed or not ok
            self.count -= 1
            fire = self.count == 0 and not self.failed
        if fire:
            self.action()

    def on_future(self, fut: Any) -> None:
        try:
            fut.value()
            ok = True
        except Exception:
            ok = False
        try:
            self.one_done(ok)
        except Exception as exc:  # never raise into the backend's thread
            logger.error("msprobe: recording a completed collective failed: %s", exc)


def _forward(name: str) -> Callable:
    def method(self, *args, **kwargs):
        return getattr(self._msprobe_inner, name)(*args, **kwargs)
    method.__name__ = name
    return method


class RecordingWork(distributed_module().Work if distributed_module() is not None else object):
    """A ``torch.distributed.Work`` that forwards to the backend's work and records the
    call's output once that work has completed (seen through ``wait()`` returning or
    ``is_completed()`` reporting True). Used only where the backend's work has no future.

    Args:
        inner: the backend's ``Work``.
        done: the countdown that records the output when every work of the call is done.
    """

    def __init__(self, inner: Any, done: _Countdown) -> None:
        super().__init__()
        self._msprobe_inner = inner
        self._msprobe_done = done
        self._msprobe_seen = False

    def wait(self, *args, **kwargs):
        result = self._msprobe_inner.wait(*args, **kwargs)
        if not self._msprobe_seen:
            self._msprobe_seen = True
            try:
                self._msprobe_done.one_done(True)
            except Exception as exc:
                logger.error("msprobe: recording a completed point-to-point call failed: %s", exc)
        return result

    def get_future(self):
        return self._msprobe_inner.get_future()

    def __repr__(self) -> str:
        return f"RecordingWork({self._msprobe_inner!r})"


if distributed_module() is not None:
    for _name in dir(distributed_module().Work):
        if _name.startswith("__") or _name in ("wait", "get_future", "_pybind11_conduit_v1_"):
            continue
        if callable(getattr(distributed_module().Work, _name, None)):
            setattr(RecordingWork, _name, _forward(_name))
