"""The bindings agree with include/convweave/convweave.h: every prototype of the table
compiles against the header (a conflicting redeclaration is a C error), and every struct
mirror has the header's size and field offsets. ctypes checks neither."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from convweave import _lib as C

INCLUDE = os.path.join(ROOT, "include")
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _compile_and_run(tmp_path, source):
    src = tmp_path / "abi.c"
    exe = tmp_path / "abi"
    src.write_text(source)
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-I", INCLUDE, str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"the prototype table disagrees with convweave.h:\n{r.stderr}"
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not CC, reason="no C compiler")
def test_prototypes_match_header_and_structs_match_layout(tmp_path):
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "convweave/convweave.h"',
             '#include "convweave/convweave_cuda.h"', "/* the table, redeclared: */"]
    lines += [l.strip() for l in C.PROTOTYPES.strip().splitlines()]
    lines.append("int main(void) {")
    for s in C.STRUCTS:
        name = s.__name__
        lines.append(f'    printf("{name} %zu\\n", sizeof({name}));')
        for f, _ in s._fields_:
            lines.append(f'    printf("{name}.{f} %zu %zu\\n", offsetof({name}, {f}), sizeof((({name} *)0)->{f}));')
    lines += ["    return 0;", "}"]
    out = _compile_and_run(tmp_path, "\n".join(lines) + "\n")
    got = dict(l.split(" ", 1) for l in out.strip().splitlines())
    for s in C.STRUCTS:
        assert int(got[s.__name__]) == ctypes.sizeof(s), s.__name__
        for f, t in s._fields_:
            off, size = map(int, got[f"{s.__name__}.{f}"].split())
            assert (off, size) == (getattr(s, f).offset, ctypes.sizeof(t)), f"{s.__name__}.{f}"


def test_every_prototype_is_bound():
    names = [n for n, _, _ in C.parse_prototypes()]
    assert len(names) == len(set(names)) > 30
    for n, restype, argtypes in C.parse_prototypes():
        fn = getattr(C.lib, n)
        assert fn.restype is restype and list(fn.argtypes) == argtypes, n


def test_prototype_parser():
    (name, ret, args), = C.parse_prototypes(
        "cw_status cw_plan_run(cw_plan *p, cw_tensor *const *inputs, int n, const cw_tensor_desc *d, char **s);")
    assert name == "cw_plan_run" and ret is ctypes.c_int
    assert args == [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.POINTER(C.cw_tensor_desc), ctypes.POINTER(ctypes.c_void_p)]
    with pytest.raises(ValueError, match="cannot read the prototype"):
        C.parse_prototypes("not a prototype")


def test_version_and_status_strings():
    import convweave
    assert convweave.version() == "0.1.0"
    assert C.lib.cw_version() == 100
    assert convweave.status_string(3) == "temporary-memory budget too small"
    assert convweave._core.status_name(3) == "CW_ERR_BUDGET"
