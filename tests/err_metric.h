/* The tests' one error metric. A maximum over element errors that lets a later finite
 * difference overwrite a NaN passes a broken output; these keep it: a NaN difference makes
 * the maximum +inf, which no later difference lowers and no tolerance accepts. Every test
 * that computes a maximum error uses them (testutil.h includes this file). */
#ifndef CW_TEST_ERR_METRIC_H
#define CW_TEST_ERR_METRIC_H

#include <math.h>
#include <stdint.h>

/* The running maximum of m and the error d (m starts at 0); NaN becomes +inf. */
static inline double cw_err_max(double m, double d) { return d <= m ? m : isnan(d) ? INFINITY : d; }

/* max|a - b| over n elements; +inf where any difference is NaN. */
static inline double cw_err_abs(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = cw_err_max(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* max|a - r| / max|r| over n elements (max|r| = 0: max|a - r|); +inf where any difference
 * is NaN. */
static inline double cw_err_rel(const float *a, const float *r, int64_t n) {
    double m = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        m = cw_err_max(m, fabs((double)a[i] - (double)r[i]));
        s = fmax(s, fabs((double)r[i]));
    }
    return s > 0 ? m / s : m;
}

/* The same against a double reference. */
static inline double cw_err_rel_d(const float *a, const double *r, int64_t n) {
    double m = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        m = cw_err_max(m, fabs((double)a[i] - r[i]));
        s = fmax(s, fabs(r[i]));
    }
    return s > 0 ? m / s : m;
}

#endif
