"""The partitioner: walks an exported ATen graph once, in order, lowering each node through
the op table into the open convweave segment (one cw graph, compiled into one plan), folding
nodes that read only constants, and running in PyTorch the nodes the table does not take
(torch-tensorrt's model). A PyTorch node that reads the open segment closes it: the segment
runs just before that node. The result is a Program: steps in order, what each reads."""
import collections
import operator

import torch

from .._core import Error, Graph
from .layout import Layout, Unsupported
from .ops import TABLE
from .values import Bcast, Const, Cw, Pad, Shuffle, Split, Torch, is_tensor

_CONVS = {torch.ops.aten.conv2d.default, torch.ops.aten.conv3d.default, torch.ops.aten.conv2d.padding,
          torch.ops.aten.conv3d.padding, torch.ops.aten.convolution.default}


class Segment:
    """One cw graph. origin: input and activation-constant nodes -> the value they take;
    outputs: nodes read after the segment ran, in cw_graph_output order."""

    def __init__(self, idx, ctx):
        self.idx, self.g = idx, Graph(ctx)
        self.origin, self.imports, self.inputs, self.outputs = {}, {}, [], []
        self.consts, self.donors = {}, {}  # donors: output position -> donated input position (cw_graph_donate)
        self.discards = []  # inputs donated to no output
        self.dtype, self.plan, self.n_nodes = None, None, 0


class Call(collections.namedtuple("Call", "name target")):
    """A node PyTorch runs, without the exported graph it came from (not kept)."""


class Fallback:
    """A node PyTorch runs: what it was, why, and what it holds."""
    __slots__ = ("node", "op", "shape", "bytes", "reason", "where", "module")

    def __init__(self, node, reason):
        val = node.meta.get("val")
        self.node, self.op, self.reason = node.name, str(node.target), reason
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        path, cls = stack[-1] if stack else ("", "")
        self.module = f"{path} ({str(cls).rpartition('.')[2]})" if path else "the module itself"
        self.shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        self.bytes = val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0
        trace = (node.meta.get("stack_trace") or "").strip().splitlines()
        self.where = " ".join(trace[-2:]).strip() if trace else "(no source location)"


def _walk(v, fn):
    """fn over every value in nested args (lists, tuples, dicts)."""
    if isinstance(v, (list, tuple)):
        return type(v)(_walk(a, fn) for a in v)
    if isinstance(v, dict):
        return {k: _walk(a, fn) for k, a in v.items()}
    return fn(v)


def _base(v):
    """The value a Pad, Bcast, Split or Shuffle reads (itself for any other)."""
    while isinstance(v, (Pad, Bcast, Split, Shuffle)):
        v = v.base
    return v


def _tensors(v):
    out = []
    _walk(v, lambda a: out.append(a) if is_tensor(a) else None)
    return out


class Lowering:
    """The lowering's state and the helpers op entries call: act() (a value as a node of the
    open segment), new(), const(), const_f32(), layout_of(), pad_folds()."""

    def __init__(self, ctx, device, fallback=True):
        self.ctx, self.device, self.fallback = ctx, device, fallback
        self.segments, self.steps, self.fallbacks = [], [], []
        self.seg = None
        self.copied = 0          # bytes of constants convweave made (f32 copies, folds)
        self.copy_roots = {}     # id -> module tensor a copy was made from
        self.n_cw = self.n_folded = 0

    # ---- helpers for the op table ------------------------------------------------------
    @property
    def g(self):
        return self.current().g

    def current(self):
        if self.seg is None:
            self.seg = Segment(len(self.segments), self.ctx)
            self.segments.append(self.seg)
        return self.seg

    def layout_of(self, v):
        return v.layout if isinstance(v, Cw) else Layout.identity(tuple(v.shape))

    def _dtype(self, seg, dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Unsupported(f"dtype {dtype}")
        if seg.dtype is None:
            seg.dtype = dtype
        elif seg.dtype != dtype:
            raise Unsupported(f"a {dtype} value in a {seg.dtype} segment")

    def act(self, v):
        """(node, layout) of v as an activation of the open segment: its own node, or an
        input (another segment's node, a PyTorch tensor) or constant node made once."""
        seg = self.current()
        if isinstance(v, Cw) and v.seg is seg:
            return v.node, v.layout
        shape = tuple(v.shape) if not isinstance(v, Cw) else v.seg.g.shape(v.node)
        if isinstance(v, (Pad, Bcast, Split, Shuffle)) or len(shape) not in (4, 5):
            raise Unsupported(f"a rank-{len(shape)} activation (convweave's are 4-D or 5-D)")
        self._dtype(seg, v.dtype)
        key = ("cw", v.seg.idx, v.node) if isinstance(v, Cw) else \
            ("torch", v.name) if isinstance(v, Torch) else ("const", id(v.tensor))
        node = seg.imports.get(key)
        if node is None:
            name = f"in{len(seg.inputs)}"
            if isinstance(v, Const):
                node = seg.g.constant(name, v.tensor)
            else:
                node = seg.g.input(name, shape, str(v.dtype).replace("torch.", ""))
                seg.inputs.append(node)
            seg.imports[key], seg.origin[node] = node, v
        return node, (v.layout if isinstance(v, Cw) else Layout.identity(shape))

    def new(self, node, layout):
        seg = self.current()
        seg.n_nodes += 1
        return Cw(seg, node, layout, seg.dtype)

    def const(self, c, name):
        """A weight or bias in the segment's dtype, read in place."""
        seg = self.current()
        if c.dtype != seg.dtype:
            raise Unsupported(f"{name} is {c.dtype}, the activations {seg.dtype}")
        t = c.tensor
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seg.consts:
            seg.consts[key] = seg.g.constant(name, t)
        return seg.consts[key]

    def const_f32(self, t, name, roots=()):
        """A float32 vector (GroupNorm's gamma and beta, a scale): a module's float32 vector is
        read in place; one convweave made or converted is counted in describe()."""
        if t.dtype != torch.float32 or not t.is_contiguous() or not roots:
            t = t.to(torch.float32).contiguous()
            self._copied(t, roots)
        return self.current().g.constant(name, t)

    def _copied(self, t, roots):
        self.copied += t.numel() * t.element_size()
        for r in roots:
            self.copy_roots[id(r)] = r

    def pad_folds(self, node):
        return bool(node.users) and all(u.target in _CONVS and u.args[0] is node for u in node.users)

    # ---- the walk ----------------------------------------------------------------------
    def lower(self, node, args, kwargs):
        tensors = _tensors((args, kwargs))
        if all(isinstance(t, Const) for t in tensors) and "rand" not in str(node.target) and \
                node.target is not operator.getitem:
            return self._fold(node, args, kwargs, tensors)
        entry = TABLE.get(node.target)
        reason = "no convweave op for it"
        if entry is not None:
            try:
                v = entry(self, node, *args, **kwargs)
                self.n_cw += 1
                return v
            except Unsupported as e:
                reason = str(e)
            except Error as e:  # the graph builder refused the shapes
                reason = e.message
        fb = Fallback(node, reason)
        if not self.fallback:
            raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: {fb.module}: node {fb.node} ({fb.op}): {reason} "
                        f"(fallback=False; at {fb.where})")
        self.fallbacks.append(fb)
        return self._torch_step(node, args, kwargs)

    def _fold(self, node, args, kwargs, tensors):
        raw = _walk((args, kwargs), lambda a: a.tensor if isinstance(a, Const) else a)
        with torch.no_grad():
            out = node.target(*raw[0], **raw[1])
        roots = tuple({id(r): r for t in tensors for r in t.roots}.values())
        self.n_folded += 1

        def wrap(t):
            if not isinstance(t, torch.Tensor):
                return t
            shared = any(t.untyped_storage().data_ptr() == r.untyped_storage().data_ptr() for r in roots)
            if not shared:
                self._copied(t, roots)
            return Const(t, roots, 0 if shared else t.numel() * t.element_size())
        return _walk(out, wrap) if isinstance(out, (list, tuple)) else wrap(out)

    def _torch_step(self, node, args, kwargs):
        if self.seg is not None and any(isinstance(_base(t), Cw) and _base(t).seg is self.seg
                                        for t in _tensors((args, kwargs))):
            self.close()
        self.steps.append(("torch", Call(node.name, node.target), args, kwargs))
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            return tuple(Torch((node.name, i), t) if isinstance(t, torch.Tensor) else None
                         for i, t in enumerate(val))
        return Torch(node.name, val) if isinstance(val, torch.Tensor) else None

    def close(self):
        if self.seg is not None:
            self.steps.append(("seg", self.seg))
            self.seg = None

    def need(self, v):
        """Marks what reading v after its segment ran takes: a node made an output."""
        v = _base(v)
        if not isinstance(v, Cw):
            return
        seg = v.seg
        if v.node in seg.origin:
            return self.need(seg.origin[v.node])
        if v.node not in seg.outputs:
            seg.g.output(v.node, f"out{len(seg.outputs)}")
            seg.outputs.append(v.node)

    def finish(self, outputs):
        """Closes the walk: marks every node read outside its segment as an output and drops
        segments nothing reads."""
        self.close()
        for t in _tensors(outputs):
            self.need(t)
        for kind, *rest in reversed(self.steps):  # a segment's outputs are read only after it
            if kind == "torch":
                for t in _tensors(tuple(rest[1:])):
                    self.need(t)
            elif rest[0].outputs:
                for node in rest[0].inputs:
                    self.need(rest[0].origin[node])
        self.steps = [s for s in self.steps if s[0] == "torch" or s[1].outputs]
