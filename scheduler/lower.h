/* The lowering's working state and the building blocks its files share: lower.c walks the
 * graph and hands each unit to lower_conv.c, lower_attention.c or lower_elementwise.c,
 * fusion.c decides what fuses, gn_lower.c emits GroupNorm
 * statistics, emit.c appends buffers, tasks, actions and dependencies to the plan. */
#ifndef CW_LOWER_H
#define CW_LOWER_H

#include "scheduler/sched.h"

/* A task that writes rows [r0, r1) along tensor dim ax (H, or D of a 5-D tensor: the
 * writer's patch axis) of a node's result. */
typedef struct cw__wr {
    int task;
    int ax;
    int64_t r0, r1;
} cw__wr;

/* What the lowering knows about one graph node. Indices are -1 where they do not apply. */
typedef struct cw__lnode {
    int buf;            /* buffer of its result; -1 while fused or not lowered */
    int moved;          /* 1: its buffer now holds a later node's result, written in place (a
                           residual add; a lone elementwise op): that node frees it, not this one */
    int fused;          /* 1: absorbed into its consumers' prep */
    int live;           /* 1: an output depends on it */
    int epi;            /* ADD, or its scale link (epi_mul): the conv fused into it as an epilogue */
    int epi_into;       /* CONV: the ADD it writes into */
    int epi_mul;        /* CONV with an epilogue: the binary mul between it and the ADD (its result
                           times a tensor read by rows, cw__fusion_epi_scale), -1: none */
    int add_of;         /* CONV used once, by an ADD of two different operands, not an output: that
                           ADD (whether or not it is its epilogue), -1 */
    int reads;          /* lowering units still to read it */
    int gn_refs;        /* GN: units still to use its scale/shift */
    int gn_part;        /* GN: buffer of the partial statistics */
    int gn_nparts;      /* GN: how many partials (bands) */
    int gn_ss;          /* GN: buffer of scale/shift */
    int gn_fin;         /* GN: its finalize task */
    int gn_stats_first; /* GN: its first stats task */
    int rec;            /* CONV: 1 = recomputed: its result is never stored whole; a first
                           pass takes its GroupNorm statistics band by band (rec_stats), and
                           every conv reading it recomputes each band it reads (lower_conv.c) --
                           recursively, where that band's own input is recomputed too */
    int rec_stats;      /* rec: a GroupNorm reads it, so its first pass runs */
    int rec_epi;        /* rec: a shortcut conv S (one row in, one row out along H) whose only
                           reader is the residual add of a conv B recomputing A, S and A reading
                           the same dying x: each band of S is computed in B's epilogue, and the
                           add's result takes x's storage (fusion.c, lower_conv.c); where x is
                           recomputed itself, S's band is computed from the band of x that B's
                           recompute of A computes, and the add's result has a buffer of its own */
    int rec_of;         /* CONV: the recomputed conv whose bands it reads, -1 */
    int rec_rd[4], rec_k; /* rec: its unit's reads, released after its last reader's unit */
    cw__conv_algo rec_algo; /* rec: the algorithm of its first pass (the second uses it too) */
    cw__wr *wr;         /* tasks writing its rows */
    int n_wr, cap_wr;
} cw__lnode;

typedef struct cw__lower {
    cw_plan *p;
    cw_graph *g;
    int64_t budget;     /* for sizing; < 0 unlimited */
    int heavy, light;   /* heavy stream count, light stream index */
    int threads;        /* per task: the backend's threads / heavy streams (0: n/a) */
    int rr;             /* round-robin heavy stream */
    int fuse, none;
    const unsigned char *rec_allow; /* per node: a conv that may be recomputed (NULL: none) */
    int rec_whole;      /* cw__plan_build's rec_whole */
    cw__lnode *nd;      /* per graph node */
} cw__lower;

/* ---- emit.c: the plan's building blocks ---- */
cw_status cw__oom(cw__lower *L);
cw_status cw__new_buf(cw__lower *L, cw__bkind kind, int ext, const cw_tensor_desc *d, int64_t bytes, int *out);
/* Appends an action to the host-ordered list. */
cw_status cw__act(cw__lower *L, cw__akind kind, int id, int stream);
/* A temporary of `bytes`, allocated now in host order; d may be NULL. */
cw_status cw__temp(cw__lower *L, int64_t bytes, const cw_tensor_desc *d, int *out);
/* Frees buffer buf now in host order (buf < 0: nothing), and its tail if still held. */
cw_status cw__release(cw__lower *L, int buf);
/* Frees the tail of ACT buffer buf now (cw__buf.tail; none: nothing): its head stays. */
cw_status cw__release_tail(cw__lower *L, int buf);
/* A task, enqueued now in host order on plan stream `stream`. */
cw_status cw__new_task(cw__lower *L, cw__tkind kind, int stage, int stream, int node, cw__task **out, int *id);
/* task runs after dep (dep < 0: nothing). */
cw_status cw__dep(cw__lower *L, int task, int dep);
/* The last task so far touching buffer b on each stream, into *out (cw__free it), *n of
 * them: a write into b's storage in place waits for them (write after read). */
cw_status cw__touching(cw__lower *L, int b, int **out, int *n);
/* task runs after every writer of node n's rows [r0, r1) along H. */
cw_status cw__dep_rows(cw__lower *L, int task, int n, int64_t r0, int64_t r1);
/* The same along tensor dim ax: a writer of a band along the other axis overlaps any
 * non-empty range (each band spans the whole extent of the other axis). */
cw_status cw__dep_band(cw__lower *L, int task, int n, int ax, int64_t r0, int64_t r1);
/* Records that task writes node n's rows [r0, r1) along H (cw__writer_band: along ax). */
cw_status cw__writer(cw__lower *L, int n, int task, int64_t r0, int64_t r1);
cw_status cw__writer_band(cw__lower *L, int n, int task, int ax, int64_t r0, int64_t r1);
/* Index of H in an activation's dims (rank 4/5); 0 for the 1-D constants. */
int cw__hdim(const cw_tensor_desc *d);
/* Node n's rows: its extent along H (cw__hdim). */
static inline int64_t cw__node_rows(const cw_graph *g, int n) {
    return g->nodes[n].desc.dims[cw__hdim(&g->nodes[n].desc)];
}
/* View of rows [r0, r1) (along H) of buffer b whose dims are d; cw__whole: all rows.
 * cw__band: rows along tensor dim ax (H, or D of a 5-D tensor). */
cw__vref cw__rows(int b, const cw_tensor_desc *d, int64_t r0, int64_t r1);
cw__vref cw__band(int b, const cw_tensor_desc *d, int ax, int64_t r0, int64_t r1);
cw__vref cw__whole(int b, const cw_tensor_desc *d);
/* The next heavy stream, round robin. */
int cw__next_heavy(cw__lower *L);

/* ---- fusion.c: what fuses into what ---- */
/* Fills nd[].fused (GroupNorm/SiLU/upsample chains absorbed into a conv's prep) and
 * nd[].epi / epi_into / epi_mul (a conv used only by a residual add, directly or through a
 * mul by a tensor read row by row, writes through it). */
void cw__fusion_analyse(cw__lower *L);
/* Conv c's epilogue: the ADD's other operand (the residual), and the tensor its result is
 * multiplied by first (its scale link's other operand); -1 where there is none. */
int cw__fusion_epi_other(const cw__lower *L, int c);
int cw__fusion_epi_scale(const cw__lower *L, int c);
/* A conv's x when it is a fused replicate pad (the chain's last link), else -1. */
int cw__fusion_pad(const cw__lower *L, int x);
/* Follows a conv's x through fused nodes: src (materialised), gn node (-1), silu, up (a
 * fused pad is passed through: cw__fusion_pad). */
void cw__fusion_chain(const cw__lower *L, int x, int *src, int *gn, int *silu, int *up);
/* The chain's unary link (cw__prep_params.unary, ua, ub): 0 without one. */
void cw__fusion_unary(const cw__lower *L, int x, int *unary, float *a, float *b);
/* The chain's upsampling along D (cw__prep_params.up_d, off_d): 1 and 0 without one. */
void cw__fusion_dmap(const cw__lower *L, int x, int64_t *up_d, int64_t *off_d);
/* The materialised nodes lowering unit i reads, into out (at most 3); out[3] = the GN whose
 * scale/shift it uses, or -1. Returns how many, or -1 when i is no unit of its own. */
int cw__fusion_unit_reads(const cw__lower *L, int i, int out[4]);
/* Marks the allowed convs (L->rec_allow) read only by convs, directly or through fused
 * GroupNorm/SiLU links (a ResNet block's inner activation; an upsampler's output read by the
 * next block's conv1 and shortcut): each such conv A is recomputed inside every reader's
 * lowering (nd[].rec, rec_of), nested where A reads a recomputed conv itself. Where a
 * reader's residual is A's own input x, only when x dies there (the reader's result then
 * takes x's storage, lower.c) and A has no other reader. */
void cw__fusion_recompute(cw__lower *L);
/* The node whose storage the residual add of conv unit b overwrites in place when its
 * operand is an epilogue shortcut (nd[].rec_epi): the shortcut's input x; else the operand. */
int cw__fusion_inplace_target(const cw__lower *L, int other);

/* Headroom for the small temporaries (GroupNorm partials and scale/shift) and allocator
 * rounding when sizing patches: 1/8 of the budget; the dry run is the real check. */
#define CW__SMALL_RESERVE(b) ((b) / 8)

/* ---- the units: each lowers graph node i (and what fuses into it) into tasks ---- */
cw_status cw__lower_conv(cw__lower *L, int i);        /* lower_conv.c */
cw_status cw__lower_attention(cw__lower *L, int i);   /* lower_attention.c */
cw_status cw__lower_elementwise(cw__lower *L, int i); /* lower_elementwise.c */

/* ---- gn_lower.c: exact GroupNorm statistics ---- */
/* Before a producer of node n emits `parts` bands: partial buffers for its GN consumers. */
cw_status cw__gn_begin(cw__lower *L, int n, int parts);
/* Stats of band `part` (rows [r0, r1) along tensor dim ax, written by `task`) of node n,
 * for each GN reading n. Exact for bands along either axis: the partials are merged in
 * band order (gn_lower.c). */
cw_status cw__gn_band_stats(cw__lower *L, int n, int task, int ax, int64_t r0, int64_t r1, int part);
/* The same, for a band of n held in a buffer of its own (view x: the band's rows). */
cw_status cw__gn_band_stats_at(cw__lower *L, int n, int task, const cw__vref *x, int64_t r0, int64_t r1, int part);
/* Makes GN node k's scale/shift available (finalize after all bands' stats). */
cw_status cw__gn_ready(cw__lower *L, int k);

#endif
