"""The runner: convweave.torch.wrap's module. It compiles a Program per input signature
(shapes, dtypes, devices; a bounded least-recently-used cache), checks on every call that
the parameters it reads are the ones it compiled (same storage, dtype, device; the version
of those it copied), and runs the steps: convweave segments as plans, the rest in PyTorch.
Between calls it holds no activation or temporary memory unless keep_memory=True."""
import collections
import math
import threading
import warnings

import torch
from torch.utils import _pytree as pytree

from .._core import Context, Error, format_bytes, parse_bytes
from .. import _lib as C
from .export import export, placeholders, slot
from .partition import Lowering, _tensors, _walk
from . import remat as remat_mod
from .remat import rematerialize
from .values import Bcast, Const, Cw, Pad, Shuffle, Split, Torch

_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
# A cpu program planning this much (activations and temporaries) gives the heap its callers
# freed since its last run back before each run (Context.empty_cache: malloc_trim, ~1 ms):
# the run's large buffers are mmapped and never reuse those pages, which would otherwise add
# to its peak (HunyuanVideo 64^2, 17 frames, 48 MiB: 1.2 MiB). Smaller ones skip the call.
_TRIM_BYTES = 32 << 20



class Program:
    """One compiled signature: the steps, their segments' plans, and what it read."""

    def __init__(self, mod, flat, spec, context, fallback=True, compile=True, comm=None, gather=True, donate=(),
                 share=None, **opts):
        """mod exported for the inputs flat (spec: their pytree), lowered and (compile=True)
        compiled on context(device) with compile options opts (memory, budget, streams,
        patches, fuse). comm: None, or the convweave.dist.Comm every plan is compiled with
        (see _distribute for gather). donate: positions in flat of inputs the caller gives up
        (_donations). share: the recompute share of front/remat.py (None: its SHARE)."""
        self.device = next((t.device for t in flat if isinstance(t, torch.Tensor)), torch.device("cpu"))
        if comm is not None and self.device.type != "cpu":
            raise Error("CW_ERR_UNSUPPORTED", f"convweave: process_group with inputs on {self.device}: convweave.dist "
                        "moves host memory through gloo; NCCL from Python is not supported (run the module on cpu, "
                        "or use the C API's NCCL communicator, convweave_cuda.h)")
        self.comm, self.gather = comm, gather
        self.ran = False  # run(): the context's cache emptied after the first
        self._planned_bytes = None
        self.ctx = context(self.device)
        args, kwargs = pytree.tree_unflatten(flat, spec)
        ep = export(mod, args, kwargs)
        self.share = remat_mod.SHARE if share is None else share
        remat = rematerialize(ep.graph, self.share)
        self.out_spec = ep.call_spec.out_spec
        vals, self.users, read = placeholders(ep, mod)
        L = Lowering(self.ctx, self.device, fallback)
        out = None
        for node in ep.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                out = _walk(node.args[0], lambda a: vals[a.name] if isinstance(a, torch.fx.Node) else a)
                break
            if node.op == "get_attr":
                t = getattr(ep.graph_module, node.target).detach()
                vals[node.name] = Const(t, (t,))
                continue
            a, k = _walk((node.args, node.kwargs), lambda x: vals[x.name] if isinstance(x, torch.fx.Node) else x)
            vals[node.name] = L.lower(node, a, k)
        L.finish(out)
        self.outputs, self.steps = out, L.steps
        self.summary = {"nodes_convweave": L.n_cw, "nodes_folded": L.n_folded, "nodes_fallback": len(L.fallbacks),
                        "fallbacks": [{"node": f.node, "op": f.op, "module": f.module, "shape": f.shape,
                                       "bytes": f.bytes, "reason": f.reason, "where": f.where}
                                      for f in L.fallbacks],
                        "copied_bytes": L.copied, "rematerialized": remat, "remat_share": self.share}
        opts = dict(dict(memory=None, budget=0, streams=0, patches=None, fuse=True), **opts)  # 0: the context's
        self._distribute()
        pairs = self._donations(donate) if comm is None else {}
        self.donated = []
        for kind, seg in (s[:2] for s in self.steps):
            if kind == "seg" and compile:
                seg.plan = seg.g.compile(budget=opts["budget"], streams=opts["streams"], patches=opts["patches"],
                                         fuse=opts["fuse"], memory=opts["memory"], comm=comm,
                                         gather_rank=seg.gather_rank)
                seg.out_shapes = [seg.g.shape(n) for n in seg.outputs]
                seg.donors = {k: d for k in pairs.get(seg.idx, ()) if (d := seg.plan.donor(k)) is not None}
                given = [(d, pairs[seg.idx][k]) for k, d in seg.donors.items()] + [(d, None) for d in seg.discards]
                self.donated += [{"segment": seg.idx, "input": seg.origin[seg.inputs[d]].name, "output": o,
                                  "bytes": math.prod(seg.g.shape(seg.inputs[d])) * seg.dtype.itemsize}
                                 for d, o in given]
        self.read = [(*slot(mod, kind, target), t, t.data_ptr(), t.dtype, t.device) for kind, target, t in read]
        self.versions = [(t, t._version) for t in L.copy_roots.values()]
        self._last_uses()

    def _donations(self, donate):
        """Pairs each donated input (positions in flat) with an output its segment may write
        into the input's tensor (cw_graph_donate): the first of the module's outputs, in
        order, that the segment reading the input makes with the input's shape. Only inputs
        that one segment alone reads, and that are no output themselves; one no output takes
        is donated to none (cw_graph_donate(.., -1): on cpu its pages go back to the system
        after its last read). Returns {segment index: {its output position: the module's
        (flat) output position}}; which pairs the plans honour is seg.donors."""
        reads = collections.Counter(k for step in self.steps for v in self._step_reads(step) for k in self._keys(v))
        outs = _tensors(self.outputs)
        passed = {k for v in outs for k in self._keys(v)}
        made = [(j, v) for j, v in enumerate(outs) if isinstance(v, Cw) and v.node not in v.seg.origin]
        pairs = collections.defaultdict(dict)
        for i in sorted(set(donate)):
            name = self.users[i] if i < len(self.users) else None
            if name is None or reads[name] != 1 or name in passed:
                continue
            seg = next((s[1] for s in self.steps if s[0] == "seg" and ("torch", name) in s[1].imports), None)
            if seg is None:  # read by a step PyTorch runs
                continue
            node = seg.imports[("torch", name)]
            for j, v in made:
                k = seg.outputs.index(v.node) if v.seg is seg else -1
                if k >= 0 and k not in pairs[seg.idx] and seg.g.shape(v.node) == seg.g.shape(node):
                    seg.g.donate(seg.inputs.index(node), k)
                    pairs[seg.idx][k] = j
                    break
            else:  # no output takes it: its memory may go back after its last read (cpu)
                seg.g.donate(seg.inputs.index(node), -1)
                seg.discards.append(seg.inputs.index(node))
        return pairs

    def _distribute(self):
        """Where each segment's outputs are complete, with a communicator. A segment whose
        outputs a later step reads (a PyTorch fallback, or another segment) gathers them on
        rank 0 and broadcasts them, so every rank continues from the whole tensor. With
        gather=True every segment does, so every rank returns the whole result. With
        gather=False the segments that only make the module's outputs keep each rank's band
        (cw_plan_get_band), and each output must be such a segment's output: a band of one
        dim of it (self.bands, filled once compiled)."""
        segs = [s[1] for s in self.steps if s[0] == "seg"]
        read_later = {k[1] for step in self.steps for v in self._step_reads(step) for k in self._keys(v)
                      if isinstance(k, tuple) and k[0] == "seg"}
        for seg in segs:
            seg.gather_rank = 0 if self.comm is None or self.gather or seg.idx in read_later else -1
            seg.broadcast = self.comm is not None and self.comm.n_ranks > 1 and seg.gather_rank == 0
        self.banded = self.comm is not None and not self.gather
        if not self.banded:
            return
        for i, v in enumerate(_tensors(self.outputs)):
            why = None
            if not isinstance(v, Cw):
                why = f"it is computed in PyTorch ({type(v).__name__})" if isinstance(v, Torch) else \
                    f"it is a {type(v).__name__} of a convweave value, made in PyTorch"
            elif v.node in v.seg.origin:
                why = "it is an input or constant passed through, not computed by a plan"
            elif v.seg.gather_rank != -1:
                why = "a later step reads the segment that makes it, so that segment is gathered"
            if why:
                raise Error("CW_ERR_UNSUPPORTED", f"convweave: gather=False returns each rank's band of the module's "
                            f"outputs, but output {i} is no band: {why}; use gather=True")

    def _slice(self, v):
        """Output value v (a Cw of a banded segment) -> (dim, start, stop): the slice of the
        logical output that this rank's band of the node's rows is."""
        axis, r0, r1 = v.seg.plan.band(v.seg.outputs.index(v.node))
        lay = v.layout
        g = lay.group_of(axis)
        if g is None:  # the band's axis has extent 1: the whole output, or none of it
            return 0, 0, lay.shape[0] if r1 > r0 else 0
        group = lay.groups[g]
        k = group.index(axis)
        if any(lay.udims[j] != 1 for j in group[:k]):
            raise Error("CW_ERR_UNSUPPORTED", f"convweave: gather=False: output dim {g} merges the band's axis {axis} "
                        "under an outer dim, so the band is not one slice; use gather=True")
        inner = 1
        for j in group[k + 1:]:
            inner *= lay.udims[j]
        return g, r0 * inner, r1 * inner

    def _band(self, v, t):
        """This rank's slice of output v over its node's tensor t, copied so the whole buffer
        (its other rows never written) is freed."""
        dim, a, b = self._slice(v)
        full = v.layout.to_torch(t)
        return full if b - a == full.shape[dim] else full.narrow(dim, a, b - a).clone()

    def bands(self):
        """With gather=False, per output of the module (flattened): (dim, start, stop), the
        slice of the whole output along dim this rank returns; else None."""
        if not self.banded:
            return None
        return [self._slice(v) for v in _tensors(self.outputs)]

    # ---- reading values at run time ---------------------------------------------------------
    def _fetch(self, env, seg, node):
        """The tensor that fills node's dims: an output the segment wrote, or the value an
        input or constant node of the segment takes."""
        if node in seg.origin:
            o = seg.origin[node]
            return self._fetch(env, o.seg, o.node) if isinstance(o, Cw) else self._value(env, o)
        return env[("seg", seg.idx, node)]

    def _value(self, env, v):
        if isinstance(v, Const):
            return v.tensor
        if isinstance(v, Torch):
            return env[v.name] if not isinstance(v.name, tuple) else env[v.name[0]][v.name[1]]
        if isinstance(v, Cw):
            return v.layout.to_torch(self._fetch(env, v.seg, v.node))
        if isinstance(v, Bcast):
            return self._value(env, v.base).expand(v.shape)
        if isinstance(v, Split):
            return self._value(env, v.base).reshape(v.shape)
        if isinstance(v, Shuffle):
            return v.vlay.to_torch(self._value(env, v.base).reshape(v.vlay.udims))
        if isinstance(v, Pad):
            pad = [p for pre, post in zip(reversed(v.pre), reversed(v.post)) for p in (pre, post)]
            return torch.nn.functional.pad(self._value(env, v.base), pad)
        return v

    def _keys(self, v):
        """The env entries reading v touches."""
        if isinstance(v, Torch):
            return [v.name if not isinstance(v.name, tuple) else v.name[0]]
        if isinstance(v, (Pad, Bcast, Split, Shuffle)):
            return self._keys(v.base)
        if isinstance(v, Cw):
            if v.node in v.seg.origin:
                o = v.seg.origin[v.node]
                return self._keys(o if not isinstance(o, Cw) else Cw(o.seg, o.node, None, None))
            return [("seg", v.seg.idx, v.node)]
        return []

    @staticmethod
    def _step_reads(step):
        """The values a step reads: a PyTorch node's tensor arguments, a segment's inputs."""
        return _tensors(step[2:]) if step[0] == "torch" else [step[1].origin[n] for n in step[1].inputs]

    def _last_uses(self):
        last = {}
        for i, step in enumerate(self.steps):
            for v in self._step_reads(step):
                for k in self._keys(v):
                    last[k] = i
        for v in _tensors(self.outputs):
            for k in self._keys(v):
                last[k] = len(self.steps)
        self.free_after = collections.defaultdict(list)
        for k, i in last.items():
            self.free_after[i].append(k)

    def valid(self):
        """Whether the parameters are still the ones compiled against."""
        for holder, key, t, ptr, dtype, dev in self.read:
            now = holder.get(key)
            if now is not t and (now is None or now.data_ptr() != ptr or now.dtype != dtype or now.device != dev):
                return False
        return all(t._version == v for t, v in self.versions)

    def run(self, flat, keep_memory):
        if self.ran and not keep_memory and self.device.type == "cpu" and self._planned() >= _TRIM_BYTES:
            self.ctx.empty_cache()  # the heap freed since the last call goes back before this one's peak
        env = {name: t.detach() for name, t in zip(self.users, flat) if name is not None}
        if self.device.type == "cuda":
            self.ctx.use_cuda_stream(torch.cuda.current_stream(self.device).cuda_stream)
        for i, step in enumerate(self.steps):
            if step[0] == "torch":
                _, node, args, kwargs = step
                a, k = _walk((args, kwargs), lambda v: self._value(env, v))
                if node.target in _VIEWS and isinstance(a[0], torch.Tensor):
                    # a node's regrouping can be a permuted tensor where the module had a
                    # contiguous one (its clone or contiguous was no task)
                    a = (a[0].contiguous(),) + tuple(a[1:])
                env[node.name] = node.target(*a, **k)
            else:
                self._run_segment(env, step[1], keep_memory)
            for k in self.free_after.get(i, ()):
                env.pop(k, None)
        flat_out = _walk(self.outputs, lambda v: self._band(v, self._fetch(env, v.seg, v.node))
                         if self.banded and isinstance(v, Cw) else self._value(env, v))
        if not self.ran and not keep_memory:  # the first run made the plans' kernels: the heap
            self.ctx.empty_cache()                  # that left free goes back (keep_memory keeps the pools')
        self.ran = True
        return pytree.tree_unflatten(list(flat_out), self.out_spec)

    def _run_segment(self, env, seg, keep_memory):
        ins = [self._fetch(env, seg, n).contiguous() for n in seg.inputs]
        outs = [torch.empty(s, dtype=seg.dtype, device=self.device) if k not in seg.donors else None
                for k, s in enumerate(seg.out_shapes)]
        if seg.donors:  # a donated input's tensor takes its output, unless it shares storage with another input
            ptrs = collections.Counter(t.untyped_storage().data_ptr() for t in ins)
            for k, d in seg.donors.items():
                t = ins[d]
                outs[k] = t if ptrs[t.untyped_storage().data_ptr()] == 1 else \
                    torch.empty(seg.out_shapes[k], dtype=seg.dtype, device=self.device)
        try:
            seg.plan.run(ins, outs)
        except BaseException:
            if not keep_memory:
                try:
                    seg.plan.release()
                except Error:  # the run's error is the one to report
                    pass
            raise
        if not keep_memory:  # nothing held between calls
            seg.plan.release()
        if seg.broadcast:  # rank 0 holds every row: now every rank does
            for t in outs:
                self.comm.broadcast(t, 0)
        for n, t in zip(seg.outputs, outs):
            env[("seg", seg.idx, n)] = t

    def _planned(self):
        """The bytes the plans plan for (activations and temporaries), summed once."""
        if self._planned_bytes is None:
            st = [p.stats() for p in self.plans()]
            self._planned_bytes = sum(s.get("activations_peak", 0) + s.get("temp_predicted", 0) for s in st)
        return self._planned_bytes

    def plans(self):
        """The convweave segments' plans, in run order."""
        return [s[1].plan for s in self.steps if s[0] == "seg"]

    def describe(self):
        segs = [s[1] for s in self.steps if s[0] == "seg"]
        c = self.comm
        return {
            "segments": [{"nodes": s.n_nodes, "inputs": len(s.inputs), "outputs": len(s.outputs),
                          "dtype": str(s.dtype).replace("torch.", ""), "plan": s.plan.stats(),
                          "gather_rank": s.gather_rank if c else None} for s in segs],
            "rank": c.rank if c else 0, "n_ranks": c.n_ranks if c else 1, "gather": self.gather if c else True,
            "bands": self.bands(), "donated": self.donated,
            **self.summary}


class Wrapped(torch.nn.Module):
    """convweave.torch.wrap's result: forward(*args, **kwargs) gives module's result."""

    def __init__(self, module, example_inputs, *, memory=None, budget=None, streams=2, dtype=None, fallback=True,
                 patches=None, fuse=True, keep_memory=False, max_plans=4, threads=0, timing=False, process_group=None,
                 gather=True, donate=()):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: module is a {type(module).__name__}, not an "
                        "nn.Module")
        if not isinstance(max_plans, int) or isinstance(max_plans, bool) or max_plans < 1:
            raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: max_plans={max_plans!r} must be an int >= 1")
        if dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: dtype={dtype!r}: None, torch.float32, "
                        "float16 or bfloat16")
        for name, v in (("budget", budget), ("memory", memory)):
            if v is not None and not (isinstance(v, str) and v.startswith("auto") and name == "memory"):
                try:
                    parse_bytes(v)
                except ValueError as e:
                    raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: {name}={v!r}: {e}") from None
        if not isinstance(donate, slice) and not (isinstance(donate, (tuple, list, range, set, frozenset)) and all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in donate)):
            raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: donate={donate!r}: expected positions of "
                        "forward's positional arguments (ints >= 0, a range or a slice)")
        self.donate = donate
        if not isinstance(gather, bool):
            raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: gather={gather!r}: expected True or False")
        from ..dist import as_comm
        self.comm = as_comm(process_group)
        self.module = module
        self.options = {"memory": memory, "budget": budget, "streams": streams, "patches": patches, "fuse": fuse,
                        "comm": self.comm, "gather": gather}
        self.dtype, self.fallback, self.keep_memory, self.max_plans = dtype, fallback, keep_memory, max_plans
        self.threads, self.timing = threads, timing
        self._programs = collections.OrderedDict()
        self._contexts = {}
        self._lock = threading.Lock()
        self._warned = False
        self.last_program = None
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        self._program(*self._flatten(args, {}), args)  # compile now: what cannot run raises here

    def _context(self, device):
        key = (device.type, device.index or 0)
        if key not in self._contexts:
            if device.type not in ("cpu", "cuda"):
                raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: inputs on {device}: convweave runs on cpu "
                            "and cuda tensors")
            self._contexts[key] = Context(backend=device.type, device=key[1], budget=self.options["budget"],
                                          streams=self.options["streams"], threads=self.threads,
                                          flags=C.CW_FLAG_TIMING if self.timing else 0)
        return self._contexts[key]

    def _flatten(self, args, kwargs):
        if self.dtype is not None:
            args, kwargs = pytree.tree_map(lambda t: t.to(self.dtype) if isinstance(t, torch.Tensor) and
                                           t.is_floating_point() else t, (args, kwargs))
        flat, spec = pytree.tree_flatten((args, kwargs))
        for t in flat:
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                raise Error("CW_ERR_INVALID_ARG", "convweave.torch.wrap: a meta tensor has no data to run on")
        return flat, spec

    def _donated(self, args):
        """Positions in the flat inputs of the leaves of the donated positional arguments."""
        pos = range(len(args))[self.donate] if isinstance(self.donate, slice) else self.donate
        out, at = [], 0
        for i, a in enumerate(args):
            n = len(pytree.tree_leaves(a))
            if i in pos:
                out += range(at, at + n)
            at += n
        return tuple(out)

    def _program(self, flat, spec, args):
        key = (str(spec), tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else repr(t)
                                for t in flat))
        with self._lock:
            prog = self._programs.get(key)
            if prog is not None and not prog.valid():
                del self._programs[key]
                prog = None
            if prog is None:
                prog = self._compile(flat, spec, args)
                self._programs[key] = prog
                while len(self._programs) > self.max_plans:
                    self._programs.popitem(last=False)
            self._programs.move_to_end(key)
            self.last_program = prog
            return prog

    def _compile(self, flat, spec, args):
        """A Program for these inputs. Under memory= as a size that the plans miss with the
        default recompute share (CW_ERR_BUDGET), once more with remat.SHARE_CAPPED: tensors
        whose recompute costs up to that share of the convolutions are recomputed before
        their late readers rather than held (front/remat.py); its error is raised if that
        misses too."""
        def build(share=None):
            return Program(self.module, flat, spec, self._context, self.fallback, donate=self._donated(args),
                           share=share, **self.options)
        memory = self.options["memory"]
        if memory is None or (isinstance(memory, str) and memory.startswith("auto")) or \
                remat_mod.SHARE_CAPPED <= remat_mod.SHARE:
            return build()
        try:
            return build()
        except Error as e:
            if e.status != "CW_ERR_BUDGET":
                raise
        return build(remat_mod.SHARE_CAPPED)

    @torch.compiler.disable
    def forward(self, *args, **kwargs):
        flat, spec = self._flatten(args, kwargs)
        if torch.is_grad_enabled() and (any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat) or
                                        any(p.requires_grad for p in self.module.parameters())):
            if not self._warned:
                warnings.warn("convweave.torch.wrap: grad mode is on and parameters or inputs require grad: the "
                              "module's own forward runs, so autograd stays whole (use torch.no_grad() or "
                              "torch.inference_mode() for convweave)", stacklevel=2)
                self._warned = True
            return self.module(*args, **kwargs)
        prog = self._program(flat, spec, args)
        with torch.no_grad():
            return prog.run(flat, self.keep_memory)

    def empty_cache(self):
        """Gives back what the wrapped module's contexts cache between calls and the freed heap
        around them (Context.empty_cache: cached pool segments, oneDNN kernels no cached plan
        uses, glibc's malloc_trim). The cached plans stay; keep_memory plans keep their arenas."""
        with self._lock:
            contexts = list(self._contexts.values())
        for c in contexts:
            c.empty_cache()

    def describe(self):
        """The last compiled signature: segments and their plans' statistics, nodes run by
        convweave, folded and fallen back (each with op, shape, bytes, reason and source),
        the bytes of constants convweave copied, and with a process group this process's
        rank, n_ranks and (gather=False) the slice of each output it returns."""
        return self.last_program.describe() if self.last_program else None

    def plans(self):
        """The plans of the last signature's convweave segments, in run order."""
        return self.last_program.plans() if self.last_program else []

    def bands(self):
        """gather=False: per output of the last signature (flattened), (dim, start, stop), the
        slice of the whole output along dim that this rank's call returns; None otherwise."""
        return self.last_program.bands() if self.last_program else None

    def __repr__(self):
        d = self.describe()
        b = self.options["budget"]
        return (f"convweave.Wrapped({type(self.module).__name__}, budget={b if b is None else format_bytes(parse_bytes(b))}, "
                f"{len(self._programs)} signature(s), last: {len(d['segments'])} segment(s), "
                f"{d['nodes_fallback']} node(s) in PyTorch)" if d else "convweave.Wrapped(uncompiled)")
