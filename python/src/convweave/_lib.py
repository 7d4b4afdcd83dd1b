"""ctypes bindings over include/convweave/convweave.h: the library's loader, the struct
mirrors, and PROTOTYPES, the one table of every C function this package calls.

ctypes checks no signature. The table is written as C prototypes, copied from the header,
so tests/test_abi.py can compile it against the header: a prototype that no longer
matches is a compile error there, not a crash here. A changed signature is one line."""
import ctypes
import os
import re
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

# ---- the one table: every C function this package uses, exactly as declared -------------
PROTOTYPES = """
int cw_version(void);
const char *cw_version_string(void);
const char *cw_status_name(cw_status s);
const char *cw_status_string(cw_status s);
cw_status cw_parse_size(const char *s, int64_t *out_bytes);
cw_status cw_context_create(cw_context **out, const cw_context_config *cfg);
void cw_context_destroy(cw_context *ctx);
const char *cw_context_get_last_error(const cw_context *ctx);
const char *cw_context_get_backend_name(const cw_context *ctx);
cw_status cw_context_synchronize(cw_context *ctx);
cw_status cw_context_get_memory_stats(cw_context *ctx, cw_memory_stats *out);
void cw_context_reset_peak_stats(cw_context *ctx);
cw_status cw_context_set_cuda_stream(cw_context *ctx, int index, void *cuda_stream);
cw_status cw_context_set_allocator(cw_context *ctx, const cw_allocator *a);
cw_status cw_context_empty_cache(cw_context *ctx);
cw_status cw_tensor_wrap(cw_tensor **out, cw_context *ctx, const cw_tensor_desc *desc, void *data);
void cw_tensor_destroy(cw_tensor *t);
cw_status cw_graph_create(cw_graph **out, cw_context *ctx);
void cw_graph_destroy(cw_graph *g);
cw_status cw_graph_input(cw_graph *g, cw_node *out, const char *name, const cw_tensor_desc *desc);
cw_status cw_graph_constant(cw_graph *g, cw_node *out, const char *name, const cw_tensor *t);
cw_status cw_graph_conv(cw_graph *g, cw_node *out, cw_node x, cw_node w, cw_node b, const cw_conv_params *p);
cw_status cw_graph_group_norm(cw_graph *g, cw_node *out, cw_node x, cw_node gamma, cw_node beta, int64_t groups, float eps);
cw_status cw_graph_silu(cw_graph *g, cw_node *out, cw_node x);
cw_status cw_graph_add(cw_graph *g, cw_node *out, cw_node a, cw_node b);
cw_status cw_graph_upsample2x(cw_graph *g, cw_node *out, cw_node x);
cw_status cw_graph_scale(cw_graph *g, cw_node *out, cw_node x, cw_node s);
cw_status cw_graph_avg_pool2(cw_graph *g, cw_node *out, cw_node x);
cw_status cw_graph_attention(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale);
cw_status cw_graph_attention_blocks(cw_graph *g, cw_node *out, cw_node q, cw_node k, cw_node v, float scale, int64_t block, cw_attention_mask mask);
cw_status cw_graph_output(cw_graph *g, cw_node node, const char *name);
cw_status cw_graph_donate(cw_graph *g, int input, int output);
cw_status cw_graph_get_node_desc(const cw_graph *g, cw_tensor_desc *out, cw_node node);
cw_status cw_graph_compile(cw_graph *g, cw_plan **out, const cw_compile_options *opt);
cw_status cw_graph_min_budget(cw_graph *g, int64_t *out_bytes, const cw_compile_options *opt);
cw_status cw_graph_memory_ladder(cw_graph *g, cw_memory_point *points, int *out_n, int max_points, const cw_compile_options *opt);
void cw_plan_destroy(cw_plan *p);
cw_status cw_plan_release(cw_plan *p);
cw_status cw_plan_run(cw_plan *p, cw_tensor *const *inputs, int n_inputs, cw_tensor *const *outputs, int n_outputs);
cw_status cw_plan_get_stats(const cw_plan *p, cw_plan_stats *out);
cw_status cw_plan_get_band(const cw_plan *p, int output, int *axis, int64_t *r0, int64_t *r1);
cw_status cw_plan_get_donor(const cw_plan *p, int output, int *input);
cw_status cw_plan_describe(const cw_plan *p, char **out, int json);
cw_status cw_plan_write_trace(const cw_plan *p, const char *path);
void cw_free(void *ptr);
cw_status cw_conv_forward(cw_context *ctx, const cw_tensor *x, const cw_tensor *w, const cw_tensor *b, cw_tensor *y, const cw_conv_params *p, const cw_compile_options *opt);
cw_status cw_conv_output_desc(cw_context *ctx, cw_tensor_desc *y, const cw_tensor_desc *x, const cw_tensor_desc *w, const cw_conv_params *p);
cw_status cw_graph_unary(cw_graph *g, cw_node *out, cw_node x, cw_unary_op op, float a, float b);
cw_status cw_graph_binary(cw_graph *g, cw_node *out, cw_node a, cw_node b, cw_binary_op op);
cw_status cw_graph_shift(cw_graph *g, cw_node *out, cw_node x, cw_node v);
cw_status cw_graph_upsample_nearest(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);
cw_status cw_graph_reduce_channels(cw_graph *g, cw_node *out, cw_node x, cw_reduce_op op);
cw_status cw_graph_concat(cw_graph *g, cw_node *out, cw_node a, cw_node b, int dim);
cw_status cw_graph_slice(cw_graph *g, cw_node *out, cw_node x, int dim, int64_t start, int64_t length);
cw_status cw_graph_pad(cw_graph *g, cw_node *out, cw_node x, const int64_t pre[3], const int64_t post[3], cw_pad_mode mode, float value);
cw_status cw_graph_depth_to_space(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);
cw_status cw_graph_space_to_depth(cw_graph *g, cw_node *out, cw_node x, const int64_t factors[3]);
"""

# ---- constants and structs of the header ---------------------------------------------------
CW_MAX_RANK = 5
CW_F32, CW_F16, CW_BF16 = 0, 1, 2
CW_BACKEND_AUTO, CW_BACKEND_CPU, CW_BACKEND_CUDA = 0, 1, 2
CW_FLAG_POISON, CW_FLAG_CHAOS, CW_FLAG_NVTX, CW_FLAG_TIMING = 1, 2, 4, 8
CW_LOG_ERROR, CW_LOG_WARN, CW_LOG_INFO, CW_LOG_DEBUG = 0, 1, 2, 3
CW_PATCHES_AUTO, CW_PATCHES_FIXED, CW_PATCHES_NONE = 0, 1, 2
CW_PATCH_AXIS_AUTO, CW_PATCH_AXIS_H, CW_PATCH_AXIS_D = 0, 1, 2
CW_NODE_NONE = -1
CW_CONTEXT_CONFIG_VERSION = 1
CW_CONV_PARAMS_VERSION = 1
CW_COMPILE_OPTIONS_VERSION = 5
CW_MEMORY_AUTO = -1
CW_ALLOCATOR_VERSION = 1
CW_COMM_VERSION = 1
# the statuses this package returns from its own callbacks (cw_status)
CW_OK, CW_ERR_COMM = 0, 10
CW_ALLOCATOR_ALIGN = 256
# names of cw_plan_stats.stage_ms's entries (CW_STAGE_*), in index order
STAGES = ("conv", "prep", "epilogue", "stats", "attention", "other")
PLAN_STAGE_COUNT = 6
PLAN_STREAM_COUNT = 8
# cw_attention_mask (cw_graph_attention_blocks)
CW_ATTENTION_BLOCK_CAUSAL, CW_ATTENTION_BLOCK_DIAGONAL = 0, 1
# cw_unary_op (cw_graph_unary)
CW_UNARY_RELU, CW_UNARY_TANH, CW_UNARY_SIGMOID, CW_UNARY_GELU, CW_UNARY_GELU_TANH, CW_UNARY_AFFINE, CW_UNARY_CLAMP = range(7)
CW_UNARY_RSQRT, CW_UNARY_SQUARE, CW_UNARY_POW = range(7, 10)
# cw_binary_op (cw_graph_binary)
CW_BINARY_MUL, CW_BINARY_SUB, CW_BINARY_DIV, CW_BINARY_MAX, CW_BINARY_MIN = range(5)
# cw_reduce_op (cw_graph_reduce_channels)
CW_REDUCE_SUM, CW_REDUCE_MEAN, CW_REDUCE_L2, CW_REDUCE_MEAN_SQUARE = range(4)
# cw_pad_mode (cw_graph_pad)
CW_PAD_CONSTANT, CW_PAD_REPLICATE = range(2)

cw_log_fn = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)
cw_alloc_fn = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_int64, c_void_p)  # (user, bytes, stream) -> ptr
cw_free_fn = ctypes.CFUNCTYPE(None, c_void_p, c_void_p, c_int64, c_void_p)  # (user, ptr, bytes, stream)


class cw_context_config(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("version", c_int), ("backend", c_int), ("device", c_int),
                ("temp_budget", c_int64), ("streams", c_int), ("flags", c_uint32), ("chaos_seed", c_uint64),
                ("threads", c_int), ("log_fn", cw_log_fn), ("log_user", c_void_p), ("log_level", c_int)]

    def __init__(self):  # CW_CONTEXT_CONFIG_INIT
        super().__init__(ctypes.sizeof(self), CW_CONTEXT_CONFIG_VERSION, CW_BACKEND_AUTO, 0, 0, 2, 0, 0, 0,
                         cw_log_fn(), None, CW_LOG_WARN)


class cw_allocator(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("version", c_int), ("alloc", cw_alloc_fn), ("free", cw_free_fn),
                ("user", c_void_p)]

    def __init__(self, alloc=None, free=None):  # CW_ALLOCATOR_INIT, then the two functions
        super().__init__(ctypes.sizeof(self), CW_ALLOCATOR_VERSION, alloc or cw_alloc_fn(), free or cw_free_fn(),
                         None)


class cw_tensor_desc(ctypes.Structure):
    _fields_ = [("dtype", c_int), ("rank", c_int), ("dims", c_int64 * CW_MAX_RANK),
                ("strides", c_int64 * CW_MAX_RANK)]


# cw_comm's send and recv: (user, desc, data, peer, tag, stream) -> cw_status
cw_comm_send_fn = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(cw_tensor_desc), c_void_p, c_int, c_int64, c_void_p)
cw_comm_recv_fn = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(cw_tensor_desc), c_void_p, c_int, c_int64, c_void_p)


class cw_comm(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("version", c_int), ("rank", c_int), ("n_ranks", c_int), ("user", c_void_p),
                ("send", cw_comm_send_fn), ("recv", cw_comm_recv_fn)]

    def __init__(self, rank, n_ranks, send, recv):  # the header has no initializer macro for it
        super().__init__(ctypes.sizeof(self), CW_COMM_VERSION, rank, n_ranks, None, send, recv)


class cw_memory_stats(ctypes.Structure):
    _fields_ = [(n, c_int64) for n in (
        "budget", "reserved_bytes_current", "reserved_bytes_peak", "allocated_bytes_current",
        "allocated_bytes_peak", "num_allocs", "num_frees", "cache_hits", "num_device_allocs",
        "num_device_frees", "cross_stream_waits", "host_syncs", "budget_failures",
        "activations_bytes_current", "activations_bytes_peak")]


class cw_conv_params(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("version", c_int), ("spatial", c_int), ("stride", c_int64 * 3),
                ("dilation", c_int64 * 3), ("pad_pre", c_int64 * 3), ("pad_post", c_int64 * 3),
                ("groups", c_int64)]

    def __init__(self):  # CW_CONV_PARAMS_INIT
        super().__init__(ctypes.sizeof(self), CW_CONV_PARAMS_VERSION, 2, (1, 1, 1), (1, 1, 1), (0, 0, 0),
                         (0, 0, 0), 1)


class cw_compile_options(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("version", c_int), ("temp_budget", c_int64), ("streams", c_int),
                ("policy", c_int), ("patches", c_int), ("fuse", c_int), ("max_patch_rows", c_int64),
                ("memory_budget", c_int64), ("patch_axis", c_int), ("comm", c_void_p), ("gather_rank", c_int),
                ("memory_auto_pct", ctypes.c_double)]

    def __init__(self):  # CW_COMPILE_OPTIONS_INIT
        super().__init__(ctypes.sizeof(self), CW_COMPILE_OPTIONS_VERSION, 0, 0, CW_PATCHES_AUTO, 0, 1, 0, 0,
                         CW_PATCH_AXIS_AUTO, None, 0, 10.0)


class cw_plan_stats(ctypes.Structure):
    _fields_ = [("wall_ms", c_double), ("stage_ms", c_double * PLAN_STAGE_COUNT),
                ("stream_busy_ms", c_double * PLAN_STREAM_COUNT), ("n_streams", c_int), ("n_tasks", c_int64),
                ("n_events", c_int64), ("n_patches", c_int64), ("temp_peak", c_int64),
                ("temp_predicted", c_int64), ("activations_peak", c_int64), ("weights_bytes", c_int64),
                ("total_peak", c_int64), ("host_syncs", c_int64), ("conv_gflop", c_double),
                ("halo_overhead_pct", c_double), ("activations_live_peak", c_int64), ("n_recomputed", c_int),
                ("recompute_gflop", c_double), ("conv_cost_ms", c_double)]


class cw_memory_point(ctypes.Structure):
    _fields_ = [("total_bytes", c_int64), ("activations_bytes", c_int64), ("temp_bytes", c_int64),
                ("n_recomputed", c_int), ("recompute_gflop", c_double), ("conv_cost_ms", c_double)]


STRUCTS = (cw_context_config, cw_allocator, cw_tensor_desc, cw_comm, cw_memory_stats, cw_conv_params, cw_compile_options,
           cw_plan_stats, cw_memory_point)

# ---- C type spelling -> ctypes type, for the prototypes above ------------------------------
_HANDLES = {"cw_context", "cw_tensor", "cw_graph", "cw_plan", "void"}
_VALUES = {"void": None, "int": c_int, "float": c_float, "int64_t": c_int64, "size_t": c_size_t,
           "cw_status": c_int, "cw_node": c_int32, "cw_dtype": c_int, "cw_log_fn": cw_log_fn,
           "cw_unary_op": c_int, "cw_binary_op": c_int, "cw_reduce_op": c_int,
           "cw_attention_mask": c_int, "cw_pad_mode": c_int}
_STRUCTS = {s.__name__: s for s in STRUCTS}
_PROTO = re.compile(r"^(?P<ret>[\w\s\*]+?)\s*\b(?P<name>cw_\w+)\s*\((?P<args>[^)]*)\)\s*;$")


def _ctype(decl):
    """'const cw_tensor_desc *desc' -> POINTER(cw_tensor_desc); handles become c_void_p."""
    tokens = [t for t in re.findall(r"\w+|\*", decl) if t != "const"]
    words = [t for t in tokens if t != "*"]
    base, depth = words[0], tokens.count("*") + decl.count("[")  # an array parameter is a pointer
    if depth == 0:
        return _VALUES[base]
    if base == "char":
        return c_char_p if depth == 1 else POINTER(c_void_p)  # char **: a string to cw_free
    if base in _HANDLES:
        return c_void_p if depth == 1 else POINTER(c_void_p)
    inner = _STRUCTS.get(base) or _VALUES[base]
    assert depth == 1, decl
    return POINTER(inner)


def parse_prototypes(text=PROTOTYPES):
    """[(name, restype, argtypes)] of every line of the table."""
    out = []
    for line in filter(None, (l.strip() for l in text.splitlines())):
        m = _PROTO.match(line)
        if not m:
            raise ValueError(f"convweave: cannot read the prototype {line!r}")
        args = m["args"].strip()
        argtypes = [] if args in ("", "void") else [_ctype(a) for a in args.split(",")]
        out.append((m["name"], _ctype(m["ret"]), argtypes))
    return out


def _find_library():
    env = os.environ.get("CONVWEAVE_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libconvweave.so")
    if os.path.exists(here):
        return here
    import ctypes.util
    found = ctypes.util.find_library("convweave")
    if found:
        return found
    raise OSError("convweave: libconvweave.so is neither bundled with the package nor named by "
                  "CONVWEAVE_LIBRARY; reinstall with 'pip install ./python'")


def load(path=None):
    path = path or _find_library()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:  # most often a dependency of the build machine missing here
        raise OSError(f"convweave: cannot load {path}: {e}. The library links the oneDNN, OpenBLAS, cJSON (and "
                      "CUDA/cuDNN) of the machine it was built on and does not bundle them: install those, or "
                      "rebuild with 'pip install ./python' here (python/README.md, Wheels)") from e
    for name, restype, argtypes in parse_prototypes():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = load()
path = lib._name
