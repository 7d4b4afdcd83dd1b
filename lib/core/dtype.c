/* The element types' public helpers: cw_dtype_size, and cw_dtype_convert (host conversion,
 * one loop per pair over the bit-exact helpers of half.h). Depends on nothing but the public
 * header, so the file parsers' fuzz targets link this file alone. */
#include <string.h>

#include "convweave/convweave.h"
#include "core/half.h"

size_t cw_dtype_size(cw_dtype dt) {
    switch (dt) {
    case CW_F32: return 4;
    case CW_F16: return 2;
    case CW_BF16: return 2;
    default: return 0;
    }
}

cw_status cw_dtype_convert(void *dst, cw_dtype dst_dtype, const void *src, cw_dtype src_dtype, int64_t n) {
    if (cw_dtype_size(dst_dtype) == 0 || cw_dtype_size(src_dtype) == 0 || n < 0) return CW_ERR_INVALID_ARG;
    if (n == 0) return CW_OK;
    if (!dst || !src) return CW_ERR_INVALID_ARG;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, (size_t)n * cw_dtype_size(dst_dtype));
        return CW_OK;
    }
    const float *sf = src;
    const uint16_t *sh = src;
    float *df = dst;
    uint16_t *dh = dst;
    if (src_dtype == CW_F32) {
        if (dst_dtype == CW_F16)
            for (int64_t i = 0; i < n; i++) dh[i] = cw__f32_to_f16(sf[i]);
        else
            for (int64_t i = 0; i < n; i++) dh[i] = cw__f32_to_bf16(sf[i]);
    } else if (dst_dtype == CW_F32) {
        if (src_dtype == CW_F16)
            for (int64_t i = 0; i < n; i++) df[i] = cw__f16_to_f32(sh[i]);
        else
            for (int64_t i = 0; i < n; i++) df[i] = cw__bf16_to_f32(sh[i]);
    } else if (src_dtype == CW_F16) { /* -> bf16: the f32 in between is exact, one rounding */
        for (int64_t i = 0; i < n; i++) dh[i] = cw__f32_to_bf16(cw__f16_to_f32(sh[i]));
    } else {
        for (int64_t i = 0; i < n; i++) dh[i] = cw__f32_to_f16(cw__bf16_to_f32(sh[i]));
    }
    return CW_OK;
}
