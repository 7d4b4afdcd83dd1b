// The public header compiles on its own as C++.
#include "convweave/convweave.h"
int cw_header_cxx_dummy() { cw_context_config c = CW_CONTEXT_CONFIG_INIT; return c.version; }
