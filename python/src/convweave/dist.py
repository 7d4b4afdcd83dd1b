"""One plan split across processes over torch.distributed: Comm makes the cw_comm a plan is
compiled with (cw_compile_options.comm; convweave.h, "Across processes") from a process
group, forwarding each message of the plan to a blocking point-to-point send or receive.

    dist.init_process_group("gloo", ...)
    dec = convweave.torch.wrap(vae.decoder, (z,), process_group=dist.group.WORLD)

Gloo on CPU tensors is the engine. A cuda plan calls send/recv with a CUDA stream to
enqueue on, which a Python callback cannot do without stalling it: CUDA tensors with a
process group raise convweave.Error (the C side takes an NCCL communicator instead,
convweave_cuda.h)."""
import ctypes
import datetime
import threading

from . import _lib as C
from ._core import ArgumentError, ArgumentTypeError, Error

__all__ = ["Comm", "as_comm"]

_TORCH_DTYPES = {C.CW_F32: "float32", C.CW_F16: "float16", C.CW_BF16: "bfloat16"}
_ITEMSIZE = {C.CW_F32: 4, C.CW_F16: 2, C.CW_BF16: 2}


def _dist():
    import torch.distributed as dist
    if not dist.is_available():
        raise Error("CW_ERR_UNSUPPORTED", "convweave.dist: this torch has no torch.distributed")
    return dist


class Comm:
    """This rank's cw_comm over a torch.distributed process group (None: the default
    group). rank, n_ranks: this process's rank in the group and the group's size. Each
    message is a blocking isend / irecv between group ranks, waited for at most `timeout`
    seconds: a dead or stuck peer makes the call return CW_ERR_COMM, so the plan's run (or
    compile) raises convweave.Error naming what failed, never hangs; `timeout` may be changed
    between calls (a long one for compiling, which waits for the slowest rank to get there;
    a short one for runs that start together). The callbacks run on
    the plan's comm thread (cpu backend) or the compiling thread, take the GIL themselves
    and never raise into C; the first failure's text is kept for the Error (take_error).
    Keep the Comm alive as long as plans compiled with it (Plan holds it)."""

    def __init__(self, process_group=None, timeout=60.0):
        dist = _dist()
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise ArgumentTypeError(f"convweave.dist.Comm: process_group is a {type(process_group).__name__}, not a "
                                    "torch.distributed ProcessGroup")
        self.timeout = timeout
        if not dist.is_initialized():
            raise ArgumentError("convweave.dist.Comm: torch.distributed is not initialised (call "
                                "torch.distributed.init_process_group first)")
        self.group = process_group
        rank = dist.get_rank(process_group)
        if rank < 0:
            raise ArgumentError("convweave.dist.Comm: this process is not a member of process_group")
        self.rank, self.n_ranks = rank, dist.get_world_size(process_group)
        self.backend = str(dist.get_backend(process_group))
        if "gloo" not in self.backend:
            raise Error("CW_ERR_UNSUPPORTED", f"convweave.dist.Comm: the process group's backend is {self.backend!r}: "
                        "convweave moves CPU tensors through gloo (init_process_group('gloo') or "
                        "'cpu:gloo,cuda:nccl'); NCCL from Python is not supported")
        self._global = [dist.get_global_rank(process_group, r) if process_group is not None else r
                        for r in range(self.n_ranks)]
        self._lock = threading.Lock()
        self._error = None
        self.messages = 0  # sent + received by this rank's callbacks (a count, for tests and describe)
        self.sent_bytes = self.recv_bytes = 0
        # the trampolines live as long as the struct that points at them, and the struct as self
        self._send_fn = C.cw_comm_send_fn(self._on_send)
        self._recv_fn = C.cw_comm_recv_fn(self._on_recv)
        self.struct = C.cw_comm(self.rank, self.n_ranks, self._send_fn, self._recv_fn)

    def __reduce__(self):
        raise TypeError("convweave.dist.Comm cannot be pickled: it holds a process group and C callbacks")

    def __copy__(self):  # a copy of a wrapped module shares its communicator: there is one per process group
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"<convweave.dist.Comm rank {self.rank} of {self.n_ranks} ({self.backend})>"

    @property
    def timeout(self):
        """Seconds each message (and each broadcast between segments) may take."""
        return self._timeout.total_seconds()

    @timeout.setter
    def timeout(self, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ArgumentError(f"convweave.dist.Comm: timeout={seconds!r}: expected seconds > 0")
        self._timeout = datetime.timedelta(seconds=float(seconds))

    @property
    def pointer(self):
        """The cw_comm's address, for cw_compile_options.comm."""
        return ctypes.addressof(self.struct)

    def take_error(self):
        """The text of the first callback failure since the last take (None: none), cleared."""
        with self._lock:
            e, self._error = self._error, None
        return e

    def _fail(self, what, e):
        with self._lock:
            if self._error is None:
                self._error = f"{what}: {type(e).__name__}: {e}".strip()
        return C.CW_ERR_COMM

    # ---- the callbacks: C calls them, with stream NULL on the cpu backend ----------------------
    def _view(self, d, data):
        """The strided plan memory of desc d at address data as a torch tensor (no copy)."""
        import torch
        d = d.contents
        if d.dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype code {d.dtype}")
        dims = [d.dims[i] for i in range(d.rank)]
        strides = [d.strides[i] for i in range(d.rank)]
        if all(s == 0 for s in strides):  # all-zero strides: contiguous (cw_tensor_desc)
            strides, n = [], 1
            for x in reversed(dims):
                strides.insert(0, n)
                n *= x
        dtype = getattr(torch, _TORCH_DTYPES[d.dtype])
        if any(x == 0 for x in dims):
            return torch.empty(dims, dtype=dtype), dims, dtype
        extent = 1 + sum((x - 1) * s for x, s in zip(dims, strides))
        buf = (ctypes.c_char * (extent * _ITEMSIZE[d.dtype])).from_address(data)
        flat = torch.frombuffer(buf, dtype=dtype, count=extent)
        return flat.as_strided(dims, strides), dims, dtype

    def _wait(self, work):
        if work is not None and work.wait(timeout=self._timeout) is False:
            raise TimeoutError(f"no completion within {self.timeout:g} s")

    def _transfer(self, send, d, data, peer, tag, stream):
        """One message of the view (d, data) to (send) or from peer, in pieces of at most 4
        MiB; returns a cw_status and never unwinds through C."""
        what = f"send of {_shape(d)} to" if send else f"receive of {_shape(d)} from"
        try:
            if stream:
                raise RuntimeError("a CUDA stream to enqueue on: convweave.dist moves host memory only")
            view, dims, dtype = self._view(d, data)
            import torch
            wire = int(tag) & 0x7FFFFFFF
            for piece in _pieces(view):
                if send:
                    self._wait(_dist().isend(piece.contiguous(), self._global[peer], group=self.group, tag=wire))
                else:
                    t = torch.empty(piece.shape, dtype=dtype)
                    self._wait(_dist().irecv(t, self._global[peer], group=self.group, tag=wire))
                    piece.copy_(t)
            self.messages += 1
            nbytes = view.numel() * view.element_size()
            if send:
                self.sent_bytes += nbytes
            else:
                self.recv_bytes += nbytes
            return C.CW_OK
        except BaseException as e:
            return self._fail(f"rank {self.rank}: {what} rank {peer} (tag {tag}) failed", e)

    def _on_send(self, user, d, data, peer, tag, stream):
        return self._transfer(True, d, data, peer, tag, stream)

    def _on_recv(self, user, d, data, peer, tag, stream):
        return self._transfer(False, d, data, peer, tag, stream)

    # ---- what the front does between plans ---------------------------------------------------
    def broadcast(self, tensor, src=0):
        """tensor (a contiguous CPU tensor, complete on group rank src) onto every rank, in
        place, waited for at most the timeout; failures raise Error CW_ERR_COMM."""
        if self.n_ranks == 1:
            return tensor
        try:
            work = _dist().broadcast(tensor, self._global[src], group=self.group, async_op=True)
            self._wait(work)
        except Exception as e:
            raise Error("CW_ERR_COMM", f"convweave.dist: rank {self.rank}: broadcast of {list(tensor.shape)} from "
                        f"rank {src} failed: {type(e).__name__}: {e}") from e
        return tensor


# A message travels in pieces of at most this many bytes, each packed into (or unpacked from)
# a contiguous copy of its own: a rank's transient copies stay this small, however large the
# message (an attention's keys and values gathered whole are tens of MiB at 1024x1024).
PIECE_BYTES = 4 << 20


def _pieces(view):
    """view (strided) as consecutive sub-views of at most PIECE_BYTES each (one, if small),
    cut along its leading dims by its shape alone: the sender's and the receiver's views of
    one message have the same dims, so they cut alike whatever their strides."""
    n = view.numel()
    if n == 0:
        return []
    item = view.element_size()
    if n * item <= PIECE_BYTES or view.dim() == 0:
        return [view]
    # k: the first dim whose trailing block fits a piece; pieces group indices of dim k-1
    k, block = view.dim(), item
    while k > 0 and block * view.shape[k - 1] <= PIECE_BYTES:
        k -= 1
        block *= view.shape[k]
    if k == view.dim():  # the last dim alone is larger than a piece: a piece per row of it
        return [view[idx] for idx in _indices(view.shape[:k - 1])] if k > 1 else [view]
    per = max(1, PIECE_BYTES // block)
    out = []
    for idx in _indices(view.shape[:k - 1]):
        sub = view[idx] if idx else view
        for a in range(0, sub.shape[0], per):
            out.append(sub[a:a + per])
    return out


def _indices(shape):
    """Every index tuple of shape, in row-major order ([()] for an empty shape)."""
    idx = [()]
    for n in shape:
        idx = [i + (j,) for i in idx for j in range(n)]
    return idx


def _shape(d):
    try:
        d = d.contents
        return f"[{', '.join(str(d.dims[i]) for i in range(d.rank))}]"
    except BaseException:
        return "a tensor"


def as_comm(process_group):
    """process_group -> Comm or None: None stays None (one process); a Comm is taken as is; a
    torch.distributed ProcessGroup gets a Comm with the default timeout."""
    if process_group is None or isinstance(process_group, Comm):
        return process_group
    return Comm(process_group)
