"""Recompute before store, on the exported graph: a tensor made from the module's inputs and
parameters alone, cheaply, and read again long after its other readers, is computed a second
time just before that late reader instead of being held in between.

AsymmetricAutoencoderKL's condition encoder is the case: its first conv (3 -> 192 channels
at the image's size, from the masked image) is read by the next conv at once and by the
decoder's last mix at the very end, 192 MiB held across the whole decode at 512², for 2.7
GFLOP that recompute in well under a second. A tensor qualifies when:

- it is at least MIN_BYTES, and a convolution runs between its last two readers (something
  worth the room runs while it would be held);
- every node it is made from (its cone: the nodes back to placeholders and attributes) is an
  op convweave lowers, at most MAX_CONE of them, so that recomputing keeps nothing else alive
  (the module's inputs and parameters are held by the caller anyway);
- its cone costs at most `share` of the graph's convolution FLOPs: SHARE by default,
  SHARE_CAPPED where a memory cap (wrap's memory= as a size) is missed at SHARE -- the climb
  of the C planner's memory ladder (recompute before approximation) continued on the exported
  graph. AsymmetricAutoencoderKL's second condition map (384 channels at the image's size,
  350 GFLOP from the first, ~3.5 % of its 512² decode) is taken only then; the copy's
  product with the mix's (1 - mask) is the copy's conv epilogue (scheduler/fusion.c), so it
  is never whole either.

The copies go right before the late reader; each copy is exact (the same ops on the same
values; a different patching may round differently, within the determinism contract)."""
import math

import torch

from .ops import TABLE
from .partition import _CONVS

MIN_BYTES = 1 << 20
MAX_CONE = 8
SHARE = 0.02
SHARE_CAPPED = 0.05


def _val(node):
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def _flops(node):
    """A convolution's multiply-adds times 2 (0 for any other node): output elements times
    the weight's input channels per group and taps."""
    if node.target not in _CONVS:
        return 0
    out, w = _val(node), _val(node.args[1]) if isinstance(node.args[1], torch.fx.Node) else None
    if out is None or w is None:
        return 0
    return 2 * out.numel() * math.prod(w.shape[1:])


def _cone(node):
    """node and the call_function nodes it is made from, back to placeholders and get_attr
    nodes (in no particular order); None where one is not an op of the table or there are
    more than MAX_CONE."""
    seen, stack = {}, [node]
    while stack:
        n = stack.pop()
        if n in seen or n.op in ("placeholder", "get_attr"):
            continue
        if n.op != "call_function" or n.target not in TABLE or len(seen) >= MAX_CONE:
            return None
        seen[n] = True
        stack.extend(a for a in n.all_input_nodes)
    return list(seen)


def rematerialize(graph, share):
    """Rewrites graph in place (see the module's docstring; share: SHARE or SHARE_CAPPED, as
    the Program chose); returns what it copied: per tensor its node's name, bytes and the GFLOP
    its recompute costs."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    nodes = list(graph.nodes)
    total = sum(_flops(n) for n in nodes)
    done = []
    for n in nodes:
        v = _val(n)
        if n.op != "call_function" or v is None or v.numel() * v.element_size() < MIN_BYTES or len(n.users) < 2:
            continue
        users = sorted(n.users, key=order.__getitem__)
        prev, last = users[-2], users[-1]
        if not any(m.target in _CONVS for m in nodes[order[prev] + 1:order[last]]):
            continue
        cone = _cone(n)
        cost = sum(_flops(c) for c in cone) if cone else 0
        if cone is None or cost > share * total:
            continue
        env = {}
        with graph.inserting_before(last):
            for c in sorted(cone, key=order.__getitem__):
                env[c] = graph.node_copy(c, lambda a: env.get(a, a))
        last.replace_input_with(n, env[n])
        done.append({"node": n.name, "bytes": v.numel() * v.element_size(), "gflop": cost * 1e-9})
    return done
