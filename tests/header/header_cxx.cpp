// The public headers compile on their own as C++.
#include "convweave/convweave.h"
#include "convweave/convweave_cuda.h"
int cw_header_cxx_dummy() { cw_context_config c = CW_CONTEXT_CONFIG_INIT; return c.version; }
