"""Two CUDA streams for the vertex runtime: the critical path on one, independent work on the
other, ordered with events (Cavs §3.4; on a GPU, kernels of one stream run in order, kernels of
two streams may overlap).

The per-level work of F and ∂F (gather → core steps → scatter) is a chain: each level needs the
previous one, so it stays on the **main** stream (CuPy's current stream). What nothing on that
chain needs can run beside it on a **side** stream:

* eager steps whose values only the lazy phase reads (in ∂F the gradient of a pushed head,
  ``hᵀ·δ_push``, is known before the backward level loop starts): launched on the side stream
  before the loop, they overlap it;
* lazy steps that lead only to parameter gradients (``∂L/∂W = Xᵀ·δ``, one large product per
  parameter after the loop): on the side stream, beside the main stream's gradient of the pulled
  input;
* uploads of index arrays (:meth:`StreamScheduler.upload`), copied asynchronously from pinned
  host memory into blocks of the main stream's memory pool.

Order is kept with events, both ways: entering the side stream, it first waits for everything
already queued on the main stream (so a side step sees every value computed before it); a main
step that reads a value made on the side stream first waits for the side stream;
:meth:`StreamScheduler.join` makes the main stream wait for all side work (call it before results
leave the runtime and before the values of the call are released, so CuPy's per-stream memory
pool never hands a block to one stream while the other still reads it). A scheduler is also a
context manager that joins on the way out, an exception included.

CuPy's pool gives a freed block straight back to the stream that allocated it, with no event:
the main stream may still have kernels queued that read the block's old contents. So an upload
first makes the side stream wait for the main one, and only then overwrites the block.

Which instruction goes where is decided once, by the ``streams`` pass
(``minicavs/runtime/passes.py``), and written in each instruction's ``stream`` field. On NumPy, or
when no instruction is on the side stream, :func:`scheduler` returns :data:`NO_STREAMS`, which
just calls each step: no cost on the CPU. The interpreter routes its eager and lazy
instructions through ``sched.run(ins, fn, ...)`` and calls ``sched.join()`` before results leave
it; the level loop runs on the main stream as it is.
"""

import numpy as np

MAIN, SIDE = "main", "side"


class _NoStreams:
    """The scheduler on NumPy or with streams switched off: every step runs as it comes."""

    active = False

    def run(self, step, fn, *args, **kwargs):
        fn(*args, **kwargs)

    def upload(self, xp, arrays, wait=True):
        return {k: (a if xp is np else xp.asarray(a)) for k, a in arrays.items()}

    def join(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return "NO_STREAMS"


NO_STREAMS = _NoStreams()


class CupyStreams:
    """The stream operations the scheduler needs, on CuPy: the main stream is the current one
    when the scheduler is made; the side stream is one non-blocking stream per device, reused."""

    _side_streams = {}
    _in_flight = []  # (event, pinned host buffer) of uploads: kept alive until copied

    def __init__(self, cupy):
        self.cupy = cupy
        self.streams = {MAIN: cupy.cuda.get_current_stream()}
        device = cupy.cuda.Device().id
        side = self._side_streams.get(device)
        if side is None:
            side = self._side_streams[device] = cupy.cuda.Stream(non_blocking=True)
        self.streams[SIDE] = side

    def use(self, which):
        return self.streams[which]  # a cupy Stream is a context manager that makes it current

    def wait(self, waiter, producer):
        """``waiter`` waits for everything queued on ``producer`` so far."""
        event = self.streams[producer].record()
        self.streams[waiter].wait_event(event)

    def upload(self, which, array):
        """``array`` (host) copied to the device on stream ``which``, from pinned memory, into
        a block allocated on the current stream. The caller orders the copy after that
        stream's pending work (:meth:`StreamScheduler.upload` does)."""
        cupy = self.cupy
        CupyStreams._in_flight = [(e, b) for e, b in CupyStreams._in_flight if not e.done]
        array = np.ascontiguousarray(array)
        pinned = cupy.cuda.alloc_pinned_memory(max(array.nbytes, 1))
        staged = np.frombuffer(pinned, array.dtype, array.size).reshape(array.shape)
        staged[...] = array
        out = cupy.empty(array.shape, array.dtype)
        stream = self.streams[which]
        out.set(staged, stream=stream)
        # The copy runs after this returns: the pinned buffer must outlive it.
        CupyStreams._in_flight.append((stream.record(), pinned))
        return out


class StreamScheduler:
    """Runs a program's eager and lazy instructions on the stream each names (``ins.stream``),
    with the event waits that keep every read after its write (see the module docstring).

    ``streams`` is a :class:`CupyStreams` (or a stand-in with ``use``/``wait``/``upload``, which
    is how the CPU tests check the ordering). Core steps are not routed through the scheduler:
    the interpreter runs them on the main stream, and the ``streams`` pass keeps everything they
    read there."""

    active = True

    def __init__(self, streams):
        self.streams = streams
        self._made_on_side = set()  # ids of values made on the side stream, not yet waited for
        self._side_used = False

    def run(self, ins, fn, *args, **kwargs):
        """Call ``fn(*args, **kwargs)``, the launches of ``ins``, on its stream, after the waits
        its inputs need (``ins.reads``/``ins.writes``: the symbols it reads and writes)."""
        if ins.stream == SIDE:
            self.streams.wait(SIDE, MAIN)  # the side step sees everything queued before it
            self._side_used = True
            with self.streams.use(SIDE):
                fn(*args, **kwargs)
            self._made_on_side.update(o.key for o in ins.writes)
        else:
            if any(x.key in self._made_on_side for x in ins.reads):
                self.join()
            fn(*args, **kwargs)

    def upload(self, xp, arrays, wait=True):
        """``{key: host array}`` -> ``{key: device array}``, copied on the side stream from
        pinned memory into blocks of the main stream's pool. With ``wait`` the main stream waits
        for the copies at once; without, the caller overlaps them with other main-stream work
        and calls :meth:`join` (or leaves the ``with`` block) before the main stream reads
        them. A failed upload joins before it raises: the copies already queued finish before
        their blocks can be handed out again."""
        # A block may have been freed on the main stream while kernels queued there still
        # read it: the copies wait for everything queued on the main stream so far.
        self.streams.wait(SIDE, MAIN)
        self._side_used = True
        out = {}
        try:
            for key, array in arrays.items():
                out[key] = self.streams.upload(SIDE, array)
        except BaseException:
            self.join()
            raise
        if wait:
            self.join()
        return out

    def join(self):
        """The main stream waits for all work queued on the side stream so far."""
        if self._side_used:
            self.streams.wait(MAIN, SIDE)
        self._made_on_side.clear()
        self._side_used = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.join()
        return False

    def __repr__(self):
        return "StreamScheduler()"


def scheduler(xp, program, streams=None):
    """The scheduler for one run of ``program`` on array module ``xp``: :data:`NO_STREAMS` on
    NumPy or when no instruction of ``program`` is on the side stream (the ``streams`` pass
    was off, or found nothing to overlap), else a :class:`StreamScheduler` on CuPy's streams
    (or on ``streams``, a stand-in)."""
    if streams is None and getattr(xp, "__name__", "") != "cupy":
        return NO_STREAMS
    if not any(ins.stream == SIDE for ins in program.eager + program.lazy):
        return NO_STREAMS
    return StreamScheduler(streams if streams is not None else CupyStreams(xp))
