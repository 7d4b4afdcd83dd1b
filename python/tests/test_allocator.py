"""User allocators (Context.set_allocator): a Python allocator supplies the context's memory.
On cpu, HostAllocator gives the same bits as the backend's own memory, gets every segment
back, runs on the calling thread, and a refusal or an exception raises convweave.Error with
the library's message. On cuda (skipped without a device), use_torch_allocator's memory shows
in torch.cuda.memory_allocated() and the results stay the same."""
import threading

import pytest
import torch

import convweave
import convweave.diffusers as cd
import convweave.torch as ct
from conftest import has_cuda, rel_err
from convweave._core import conv_params

BUDGET = "256KiB"


def build(ctx, device="cpu", seed=0):
    """x -> conv 3x3 -> GroupNorm -> SiLU -> conv 3x3, + a 1x1 shortcut: (graph, x, output shape)."""
    g = torch.Generator().manual_seed(seed)
    t = lambda *s, scale=0.1: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    graph = convweave.Graph(ctx)
    x = graph.input("x", (1, 8, 24, 20))
    same, one = conv_params(2, (1, 1), (1, 1), (1, 1), (1, 1), 1), conv_params(2, (1, 1), (1, 1), (0, 0), (0, 0), 1)
    h = graph.conv(x, graph.constant("w1", t(16, 8, 3, 3)), graph.constant("b1", t(16)), same)
    h = graph.group_norm(h, graph.constant("gamma", t(16) + 1), graph.constant("beta", t(16)), 4, 1e-5)
    h = graph.conv(graph.silu(h), graph.constant("w2", t(16, 16, 3, 3)), None, same)
    y = graph.add(graph.conv(x, graph.constant("ws", t(16, 8, 1, 1)), None, one), h)
    graph.output(y, "y")
    return graph, t(1, 8, 24, 20, scale=1.0), (1, 16, 24, 20)


def run(ctx, device="cpu"):
    """(output, plan, graph): the plan and graph still open."""
    graph, x, shape = build(ctx, device)
    plan = graph.compile(streams=3)
    y = torch.empty(shape, device=device)
    plan.run([x], [y])
    return y, plan, graph


def reference(budget, device="cpu"):
    ctx = convweave.Context(device, budget=budget, streams=3)
    y, plan, graph = run(ctx, device)
    ctx.close()
    return y


@pytest.mark.parametrize("budget", [None, BUDGET])
def test_host_allocator_same_bits_and_every_segment_back(budget):
    ref = reference(budget)
    a = convweave.HostAllocator()
    ctx = convweave.Context("cpu", budget=budget, streams=3, allocator=a)
    y, plan, graph = run(ctx)
    assert torch.equal(y, ref)
    assert a.allocs > 0 and a.live > 0 and a.streams  # the plan holds its arenas
    assert ctx.memory_stats()["num_device_allocs"] <= a.allocs  # temporaries; activations are a's too
    y2 = torch.empty_like(y)
    plan.run([build(ctx)[1]], [y2])
    assert torch.equal(y2, ref)
    plan.close(), graph.close()
    ctx.empty_cache()
    assert a.live == 0 and a.allocs == a.frees and a.bytes == 0
    ctx.close()
    assert a.allocs == a.frees


def test_budget_stays_convweave_s():
    a = convweave.HostAllocator()
    ctx = convweave.Context("cpu", budget=BUDGET, streams=3, allocator=a)
    y, plan, graph = run(ctx)
    stats = plan.stats()
    assert stats["reserved_bytes.all.peak"] <= convweave.parse_bytes(BUDGET)
    # what a ever held: the temporaries (under the budget) and the activation arena
    assert a.peak_bytes <= convweave.parse_bytes(BUDGET) + max(stats["activations_peak"], 2 << 20)
    ctx.close()
    assert a.live == 0


def test_refusing_allocator_raises_then_recovers():
    ref = reference(BUDGET)
    a = convweave.HostAllocator(limit=0)
    ctx = convweave.Context("cpu", budget=BUDGET, streams=3)
    ctx.set_allocator(a)
    graph, x, shape = build(ctx)
    with pytest.raises(convweave.Error, match=r"^CW_ERR_OUT_OF_MEMORY: user allocator \(cw_context_set_allocator\) "
                                              r"returned NULL for a segment of \d+ bytes") as e:
        graph.compile(streams=3)
    assert e.value.__cause__ is None and a.allocs == 0
    a.limit = None
    plan = graph.compile(streams=3)
    y = torch.empty(shape)
    plan.run([x], [y])
    assert torch.equal(y, ref)
    ctx.close()
    assert a.live == 0 and a.allocs == a.frees


def test_raising_allocator_is_the_error_s_cause():
    class Failing(convweave.HostAllocator):
        def alloc(self, nbytes, stream):
            raise MemoryError(f"test: no {nbytes} bytes")

    ctx = convweave.Context("cpu", budget=BUDGET, allocator=Failing())
    graph, x, shape = build(ctx)
    with pytest.raises(convweave.Error, match=r"user allocator .* returned NULL .*the allocator raised MemoryError: "
                                              r"test: no \d+ bytes") as e:
        graph.compile()
    assert isinstance(e.value.__cause__, MemoryError)
    ctx.close()


def test_switch_refused_while_a_plan_holds_memory():
    ref = reference(BUDGET)
    a, b = convweave.HostAllocator(), convweave.HostAllocator()
    ctx = convweave.Context("cpu", budget=BUDGET, streams=3, allocator=a)
    y, plan, graph = run(ctx)
    with pytest.raises(convweave.Error, match=r"^CW_ERR_INVALID_ARG: cw_context_set_allocator: the context still "
                                              r"holds \d+ segment"):
        ctx.set_allocator(b)
    assert b.allocs == 0 and a.live > 0
    plan.close(), graph.close()
    assert ctx.set_allocator(b) is b
    assert a.live == 0 and a.allocs == a.frees  # every segment went back to a
    y, plan, graph = run(ctx)
    assert torch.equal(y, ref) and b.allocs > 0
    plan.close(), graph.close()
    ctx.set_allocator(None)  # the backend's own again
    assert b.live == 0
    n = b.allocs
    y, plan, graph = run(ctx)
    assert torch.equal(y, ref) and b.allocs == n
    ctx.close()


def test_allocator_runs_on_the_calling_thread():
    class Recording(convweave.HostAllocator):
        threads = set()

        def alloc(self, nbytes, stream):
            self.threads.add(threading.get_ident())
            return super().alloc(nbytes, stream)

        def free(self, ptr, nbytes, stream):
            self.threads.add(threading.get_ident())
            super().free(ptr, nbytes, stream)

    a = Recording()
    ctx = convweave.Context("cpu", budget=BUDGET, streams=3, allocator=a)
    y, plan, graph = run(ctx)
    plan.close(), graph.close()
    ctx.empty_cache()
    assert a.threads == {threading.get_ident()}
    out = {}

    def work():
        out["y"], plan, graph = run(ctx)
        plan.close(), graph.close()
        ctx.empty_cache()
        out["ident"] = threading.get_ident()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert torch.equal(out["y"], y)
    assert a.threads == {threading.get_ident(), out["ident"]}  # the worker's own calls, none elsewhere
    ctx.close()


def test_allocator_argument_errors():
    ctx = convweave.Context("cpu")
    with pytest.raises(TypeError, match="alloc.*free"):
        ctx.set_allocator(object())
    with pytest.raises(convweave.Error, match="^CW_ERR_UNSUPPORTED: .*PyTorch's caching allocator is CUDA's"):
        ct.use_torch_allocator(ctx)
    ctx.close()


def test_enable_torch_allocator_needs_a_cuda_vae(make_vae):
    vae = make_vae("tiny", 0)
    with pytest.raises(convweave.Error, match="^CW_ERR_UNSUPPORTED: .*torch_allocator=True .* on cpu"):
        cd.enable(vae, torch_allocator=True)
    assert not cd.is_enabled(vae)


# ---- cuda: PyTorch's caching allocator ---------------------------------------------------------
cuda = pytest.mark.skipif(not has_cuda(), reason="no CUDA device")


def cuda_context_or_skip(**kw):
    try:
        return convweave.Context("cuda", device=torch.cuda.current_device(), **kw)
    except convweave.Error as e:
        pytest.skip(f"libconvweave without a usable cuda backend: {e}")


@cuda
def test_use_torch_allocator_counts_in_memory_allocated():
    torch.backends.cudnn.allow_tf32 = False
    plain = cuda_context_or_skip(budget="4MiB", streams=3)
    plain.use_cuda_stream(torch.cuda.current_stream().cuda_stream)
    ref = run(plain, "cuda")[0]
    plain.close()
    ctx = cuda_context_or_skip(budget="4MiB", streams=3)
    ta = ct.use_torch_allocator(ctx)
    ctx.use_cuda_stream(torch.cuda.current_stream().cuda_stream)
    graph, x, shape = build(ctx, "cuda")
    y = torch.empty(shape, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    plan = graph.compile(streams=3)  # takes the temporaries' and the activations' arenas from torch
    held = sum(ta.live.values())
    grown = torch.cuda.memory_allocated() - base
    assert held > 0 and held <= grown < held + 512 * len(ta.live)  # torch rounds blocks to 512 B
    plan.run([x], [y])
    torch.cuda.synchronize()
    assert torch.equal(y, ref)
    assert torch.cuda.memory_allocated() - base == grown  # the run took nothing more
    plan.close(), graph.close()
    ctx.empty_cache()
    assert not ta.live and torch.cuda.memory_allocated() == base
    ctx.close()


@cuda
def test_vae_decode_with_torch_allocator(make_vae):
    cuda_context_or_skip().close()
    vae = make_vae("tiny", 0).cuda()
    z = torch.randn(1, 4, 8, 8, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = vae.decode(z).sample
        state = cd.enable(vae, budget="16MiB", torch_allocator=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        out = vae.decode(z).sample
        torch.cuda.synchronize()
    ta = state.ctx._hook.allocator
    assert isinstance(ta, ct.TorchAllocator) and ta.live
    assert torch.cuda.memory_allocated() - base >= sum(ta.live.values())  # + out itself
    assert out.is_cuda and rel_err(out, ref) <= 1e-5
    cd.disable(vae)
