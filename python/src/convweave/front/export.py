"""torch.export for the lowering: the module's ATen graph for one set of input shapes, and
what each of its placeholders is (a parameter or buffer read in place, a user input)."""
import torch

from .._core import Error
from .values import Const, Torch


def export(module, args, kwargs):
    """The module's decomposed ATen graph for these inputs (static shapes). Errors name the
    module and what torch.export said."""
    name = type(module).__name__
    if module.training:
        raise Error("CW_ERR_INVALID_ARG", f"convweave.torch.wrap: {name} is in training mode (dropout, batch "
                    "statistics): call .eval() first")
    try:
        ep = torch.export.export(module, tuple(args), dict(kwargs), strict=False)
        ep = ep.run_decompositions({})
    except Exception as e:  # torch.export raises many types; each becomes one Error
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: torch.export failed on {name}: "
                    f"{type(e).__name__}: {first}") from e
    for node in ep.graph.nodes:  # static shapes only: a symbol is a data-dependent size
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else (val,)
        if any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and
               not all(isinstance(d, int) for d in v.shape)) for v in vals):
            raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: {name}: node {node.name} ({node.target}) has "
                        "a data-dependent shape; convweave plans fixed shapes")
    for spec in ep.graph_signature.output_specs:
        if spec.kind.name != "USER_OUTPUT":
            raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: {name}'s forward mutates "
                        f"{spec.target or spec.arg.name} ({spec.kind.name}); convweave runs pure forwards")
    return ep


def placeholders(ep, module):
    """{placeholder name: Const (a parameter, buffer or lifted constant, the module's own
    tensor) or Torch (a user input)}, the user inputs' names in call order (None for a
    non-tensor input, which export fixed), and the module's tensors read: (kind, target,
    tensor) for every parameter and buffer."""
    vals, users, read = {}, [], []
    metas = {n.name: n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        kind, arg = spec.kind.name, spec.arg
        if kind == "USER_INPUT":
            tensor = isinstance(metas.get(getattr(arg, "name", None)), torch.Tensor)
            users.append(arg.name if tensor else None)
            if tensor:
                vals[arg.name] = Torch(arg.name, metas[arg.name])
            continue
        if kind == "PARAMETER":
            t = module.get_parameter(spec.target)
        elif kind == "BUFFER":
            t = module.get_buffer(spec.target)
        elif kind == "CONSTANT_TENSOR":
            t = ep.constants[spec.target]
        else:
            raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.wrap: input {arg.name} of kind {kind}")
        if kind != "CONSTANT_TENSOR":
            read.append((kind, spec.target, t))
        t = t.detach()
        vals[arg.name] = Const(t, (t,))
    return vals, users, read


def slot(module, kind, target):
    """(the dict holding the tensor at target, its key): reading it again later is one dict
    lookup, and sees a replaced parameter or buffer."""
    path, _, name = target.rpartition(".")
    owner = module.get_submodule(path) if path else module
    return (owner._parameters if kind == "PARAMETER" else owner._buffers), name
