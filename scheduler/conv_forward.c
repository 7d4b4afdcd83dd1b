/* The one-call convolution: a one-node plan (input x, constants w and b, output y),
 * compiled under the options' budget and run once. x, w, b and y share one dtype
 * (cw__conv_validate); the backend refuses one it cannot run. */
#include "scheduler/planner.h"
#include "scheduler/sched.h"

cw_status cw_conv_forward(cw_context *ctx, const cw_tensor *x, const cw_tensor *w, const cw_tensor *b, cw_tensor *y,
                          const cw_conv_params *p, const cw_compile_options *opt) {
    if (!ctx) return CW_ERR_INVALID_ARG;
    if (!x || !w || !y || !p)
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_conv_forward: %s is NULL", !x ? "x" : !w ? "w" : !y ? "y" : "p");
    CW_TRY(cw__conv_validate(ctx, &x->desc, &w->desc, b ? &b->desc : NULL, &y->desc, p, NULL));
    if (cw__views_overlap(&x->desc, x->data, &y->desc, y->data))
        return cw__error(ctx, CW_ERR_INVALID_ARG, "cw_conv_forward: y overlaps x (in-place convolution is not supported)");
    cw_graph *g = NULL;
    cw_plan *plan = NULL;
    cw_node nx, nw, nb = CW_NODE_NONE, ny;
    CW_TRY(cw_graph_create(&g, ctx));
    cw_status st = CW_OK;
    if ((st = cw_graph_input(g, &nx, "x", &x->desc)) != CW_OK) goto done;
    if ((st = cw_graph_constant(g, &nw, "w", w)) != CW_OK) goto done;
    if (b && (st = cw_graph_constant(g, &nb, "b", b)) != CW_OK) goto done;
    if ((st = cw_graph_conv(g, &ny, nx, nw, nb, p)) != CW_OK) goto done;
    if ((st = cw_graph_output(g, ny, "y")) != CW_OK) goto done;
    if ((st = cw_graph_compile(g, &plan, opt)) != CW_OK) goto done;
    cw_tensor *in[1] = {(cw_tensor *)x};
    st = cw_plan_run(plan, in, 1, &y, 1);
done:
    cw_plan_destroy(plan);
    cw_graph_destroy(g);
    return st;
}
