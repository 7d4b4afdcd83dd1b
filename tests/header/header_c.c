/* The public header compiles on its own as C11. */
#include "convweave/convweave.h"
int cw_header_c_dummy(void) { return CW_OK; }
