/* The model: builds the graph of one half of the autoencoder on a context, compiles it, runs
 * it (f32 in and out, whatever the model's dtype) and locates a first non-finite block. */
#include "vae_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building and running ---------------------------------------------------------------------- */

cw_status vae_build(vae_model **out, cw_context *ctx, const vae_config *cfg, vae_weights *w, int part,
                    int64_t batch, int64_t in_h, int64_t in_w, cw_dtype dt, int stages, char *err, size_t errlen) {
    *out = NULL;
    if (vae_config_validate(cfg, err, errlen)) return CW_ERR_INVALID_ARG;
    if (part != VAE_DECODER && part != VAE_ENCODER) {
        st_errf(err, errlen, "vae_build: part %d is neither the encoder nor the decoder", part);
        return CW_ERR_INVALID_ARG;
    }
    if (batch < 1 || in_h < 1 || in_w < 1) {
        st_errf(err, errlen, "input %" PRId64 " x %" PRId64 "x%" PRId64 " must be positive", batch, in_h, in_w);
        return CW_ERR_INVALID_ARG;
    }
    int64_t up = vae_upscale(cfg);
    if (part == VAE_ENCODER && (in_h % up || in_w % up)) {
        st_errf(err, errlen, "image %" PRId64 "x%" PRId64 ": height and width must be multiples of %" PRId64, in_h,
                in_w, up);
        return CW_ERR_INVALID_ARG;
    }
    /* fail on a bad key before allocating anything */
    if (vae_weights_check(w, cfg, part, err, errlen)) return CW_ERR_FORMAT;
    vae_model *m = calloc(1, sizeof(*m));
    if (!m) {
        st_errf(err, errlen, "out of memory");
        return CW_ERR_OUT_OF_MEMORY;
    }
    m->ctx = ctx;
    m->dtype = dt;
    m->part = part;
    bld b = {0};
    b.m = m;
    b.w = w;
    b.cfg = cfg;
    b.err = err;
    b.errlen = errlen;
    b.stages = stages;
    cw_status st = cw_graph_create(&m->graph, ctx);
    if (st != CW_OK) {
        vae__fail_ctx(&b, st, "cw_graph_create");
        goto fail;
    }
    b.g = m->graph;
    int64_t dims[4] = {batch, part == VAE_DECODER ? cfg->latent_channels : cfg->in_channels, in_h, in_w};
    st = cw_tensor_desc_make(&m->in_desc, dt, 4, dims);
    if (st == CW_OK) st = cw_graph_input(m->graph, &m->input, part == VAE_DECODER ? "latent" : "image", &m->in_desc);
    if (st != CW_OK) {
        vae__fail_ctx(&b, st, "input");
        goto fail;
    }
    m->output = part == VAE_DECODER ? vae__decoder(&b, m->input) : vae__encoder(&b, m->input);
    if (b.st != CW_OK) goto fail;
    st = cw_graph_output(m->graph, m->output, part == VAE_DECODER ? "sample" : "moments");
    if (st == CW_OK) st = cw_graph_get_node_desc(m->graph, &m->out_desc, m->output);
    for (int i = 0; st == CW_OK && i < m->n_stages; i++)
        if (m->stage[i] != m->output) st = cw_graph_output(m->graph, m->stage[i], m->stage_name[i]);
    if (st != CW_OK) {
        vae__fail_ctx(&b, st, "output");
        goto fail;
    }
    free(b.buf);
    *out = m;
    return CW_OK;
fail:
    free(b.buf);
    vae_model_destroy(m);
    return b.st != CW_OK ? b.st : CW_ERR_INTERNAL;
}

void vae_model_destroy(vae_model *m) {
    if (!m) return;
    cw_graph_destroy(m->graph);
    for (int i = 0; i < m->n_consts; i++) cw_tensor_destroy(m->consts[i]);
    free(m->consts);
    free(m);
}

cw_status vae_compile(vae_model *m, const cw_compile_options *opt, cw_plan **plan, char *err, size_t errlen) {
    *plan = NULL;
    cw_status st = cw_graph_compile(m->graph, plan, opt);
    if (st != CW_OK) st_errf(err, errlen, "compile: %s", cw_context_get_last_error(m->ctx));
    return st;
}

/* Runs plan with ny outputs: ys[i] (host f32) receive outputs whose descs are yd[i]. */
static cw_status run_outputs(vae_model *m, cw_plan *plan, const float *in, int ny, const cw_tensor_desc *yd,
                             float *const *ys, char *err, size_t errlen) {
    cw_tensor *x = NULL, *y[65] = {0};
    int64_t nin = cw_tensor_desc_numel(&m->in_desc), nmax = nin;
    size_t es = cw_dtype_size(m->dtype);
    uint16_t *tmp = NULL;
    const char *what = "input tensor";
    cw_status st = cw_tensor_create(&x, m->ctx, &m->in_desc);
    what = "output tensor";
    for (int i = 0; st == CW_OK && i < ny; i++) {
        st = cw_tensor_create(&y[i], m->ctx, &yd[i]);
        if (cw_tensor_desc_numel(&yd[i]) > nmax) nmax = cw_tensor_desc_numel(&yd[i]);
    }
    if (st != CW_OK) goto done;
    what = "upload";
    if (m->dtype == CW_F32) {
        st = cw_tensor_upload(x, in, (size_t)nin * es);
    } else {
        tmp = malloc((size_t)nmax * sizeof(uint16_t));
        if (!tmp) {
            st = CW_ERR_OUT_OF_MEMORY;
            goto done;
        }
        st = cw_dtype_convert(tmp, m->dtype, in, CW_F32, nin); /* rounds to nearest, ties to even */
        if (st == CW_OK) st = cw_tensor_upload(x, tmp, (size_t)nin * es);
    }
    if (st != CW_OK) goto done;
    what = "run";
    st = cw_plan_run(plan, &x, 1, y, ny);
    if (st != CW_OK) goto done;
    what = "download";
    for (int i = 0; st == CW_OK && i < ny; i++) {
        int64_t n = cw_tensor_desc_numel(&yd[i]);
        if (m->dtype == CW_F32) {
            st = cw_tensor_download(y[i], ys[i], (size_t)n * es);
        } else {
            st = cw_tensor_download(y[i], tmp, (size_t)n * es);
            if (st == CW_OK) st = cw_dtype_convert(ys[i], CW_F32, tmp, m->dtype, n);
        }
    }
done:
    if (st != CW_OK) st_errf(err, errlen, "%s: %s: %s", what, cw_status_name(st), cw_context_get_last_error(m->ctx));
    free(tmp);
    cw_tensor_destroy(x);
    for (int i = 0; i < ny; i++) cw_tensor_destroy(y[i]);
    return st;
}

cw_status vae_run(vae_model *m, cw_plan *plan, const float *in, float *out, char *err, size_t errlen) {
    if (m->n_stages) {
        st_errf(err, errlen, "vae_run: a model built with stages has %d more outputs (vae_first_nonfinite_stage)",
                m->n_stages);
        return CW_ERR_INVALID_ARG;
    }
    return run_outputs(m, plan, in, 1, &m->out_desc, &out, err, errlen);
}

int vae_first_nonfinite_stage(vae_model *m, const float *in, char *msg, size_t msglen) {
    int ny = 1, rc = -1, at[64]; /* at[i]: the plan output of stage i (the main output is 0) */
    cw_tensor_desc yd[65];
    float *ys[65] = {0};
    cw_plan *plan = NULL;
    yd[0] = m->out_desc;
    for (int i = 0; i < m->n_stages; i++) {
        at[i] = m->stage[i] == m->output ? 0 : ny++;
        if (at[i] && cw_graph_get_node_desc(m->graph, &yd[at[i]], m->stage[i]) != CW_OK) goto out;
    }
    for (int i = 0; i < ny; i++)
        if (!(ys[i] = malloc((size_t)cw_tensor_desc_numel(&yd[i]) * sizeof(float)))) {
            st_errf(msg, msglen, "out of memory for the diagnosis");
            goto out;
        }
    cw_compile_options o = CW_COMPILE_OPTIONS_INIT;
    o.policy = CW_PATCHES_NONE;
    o.streams = 1;
    o.temp_budget = -1;
    if (vae_compile(m, &o, &plan, msg, msglen) != CW_OK) goto out;
    if (run_outputs(m, plan, in, ny, yd, ys, msg, msglen) != CW_OK) goto out;
    rc = 1;
    for (int i = 0; i < m->n_stages; i++) {
        int k = at[i];
        int64_t bad = vae_find_nonfinite(ys[k], cw_tensor_desc_numel(&yd[k]));
        if (bad < 0) continue;
        char where[128];
        vae_index_str(where, sizeof(where), ys[k], bad, yd[k].rank, yd[k].dims);
        st_errf(msg, msglen, "first in the output of %s (%s)", m->stage_name[i], where);
        rc = 0;
        break;
    }
out:
    cw_plan_destroy(plan);
    for (int i = 0; i < ny; i++) free(ys[i]);
    return rc;
}
