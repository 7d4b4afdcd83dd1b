/* The public headers compile on their own as C11. */
#include "convweave/convweave.h"
#include "convweave/convweave_cuda.h" /* needs no CUDA or NCCL include path */
int cw_header_c_dummy(void) { return CW_OK; }
