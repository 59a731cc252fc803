"""The binding's mirror of the C headers (sumo/_abi.py) and the check that compares it with the
library at import: the headers themselves are the reference for the constants, and a mirror
made wrong on purpose must be refused, naming what differs. Local: no collective."""
import ctypes
import glob
import os
import re
import shutil
import subprocess

import pytest

from sumo import _abi, _lib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def header_constants():
    """Every SUMO_ enumerator with an explicit value, and the predefined ops, as the public
    headers write them (not the CUDA plugin's, not the *_COUNT bounds)."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "include", "sumo*.h")):
        if path.endswith("sumo_cuda.h"):
            continue
        with open(path) as f:
            text = f.read()
        for name, value in re.findall(r"\b(SUMO_[A-Z0-9_]+) = (\d+)\b", text):
            found[name] = int(value)
        for name, value in re.findall(r"#define (SUMO_OP_[A-Z]+) \(\(sumo_op\)(\d+)\)", text):
            found[name] = int(value)
    return found


def test_library_knows_every_header_constant():
    headers = header_constants()
    assert len(headers) > 60  # the parse found the headers' enums
    value = ctypes.c_int64()
    for name, expected in headers.items():
        code = _lib.lib.sumo_enum_value(name.encode(), ctypes.byref(value))
        assert code == _abi.SUMO_SUCCESS, name
        assert value.value == expected, name


def header_structs():
    """Every struct a public header defines (typedef struct name {), with that header's file
    name; the CUDA plugin's aside."""
    found = {}
    for path in glob.glob(os.path.join(ROOT, "include", "sumo*.h")):
        if path.endswith("sumo_cuda.h"):
            continue
        with open(path) as f:
            for name in re.findall(r"typedef struct (sumo_\w+) \{", f.read()):
                found[name] = os.path.basename(path)
    return found


# Headers whose structs the binding mirrors every one of: a struct added to one of them must be
# added to sumo/_abi.py too (the others are mirrored where the binding calls them).
MIRRORED_WHOLE = ("sumo_aggregation.h", "sumo_bootstrap.h", "sumo_diloco.h", "sumo_elastic.h",
                  "sumo_shm.h", "sumo_tcp.h")


def test_mirror_agrees_with_headers():
    constants, structs = _abi._mirrored()
    headers = header_constants()
    assert constants == {k: headers.get(k) for k in constants}
    assert structs
    _abi.check(_lib.lib)  # what import did


def test_wrong_constant_refused(monkeypatch):
    monkeypatch.setattr(_abi, "SUMO_ERR_TIMEOUT", 5)
    with pytest.raises(ImportError, match="SUMO_ERR_TIMEOUT is 4 there, 5 here"):
        _abi.check(_lib.lib)
    monkeypatch.undo()
    monkeypatch.setattr(_abi, "SUMO_NOT_A_CONSTANT", 3, raising=False)
    with pytest.raises(ImportError, match="SUMO_NOT_A_CONSTANT is not a constant it knows"):
        _abi.check(_lib.lib)


def _struct(name, fields):
    """A Structure as the mirror would define it (check() takes the module's own)."""
    return type(name, (ctypes.Structure,), {"_fields_": fields, "__module__": _abi.__name__})


def test_wrong_size_and_unknown_struct_refused(monkeypatch):
    # sumo_acga_options without its last field: the library's size is the mirror's (checked
    # at import), this one's is a double short.
    size = ctypes.sizeof(_abi.sumo_acga_options)
    fields = _abi.sumo_acga_options._fields_[:-1]
    monkeypatch.setattr(_abi, "sumo_acga_options", _struct("sumo_acga_options", fields))
    with pytest.raises(ImportError, match="sumo_acga_options is %d bytes there, %d here"
                       % (size, size - ctypes.sizeof(ctypes.c_double))):
        _abi.check(_lib.lib)
    monkeypatch.undo()
    extra = _struct("sumo_no_such_options", [("struct_size", ctypes.c_size_t)])
    monkeypatch.setattr(_abi, "sumo_no_such_options", extra, raising=False)
    with pytest.raises(ImportError, match="sumo_no_such_options is not a struct it knows"):
        _abi.check(_lib.lib)


def test_headers_mirrored_whole_are():
    _, structs = _abi._mirrored()
    mirrored = {s.__name__ for s in structs}
    found = header_structs()
    for header in MIRRORED_WHOLE:
        names = sorted(n for n, h in found.items() if h == header)
        assert names, header  # the parse found the header's structs
        assert [n for n in names if n not in mirrored] == [], header


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to read the headers with")
def test_struct_layouts_agree_with_headers_field_by_field(tmp_path):
    # The library reports sizes alone: the headers, compiled, give the size and every field's
    # offset of each struct the binding mirrors.
    _, structs = _abi._mirrored()
    where = header_structs()
    headers = sorted({where[s.__name__] for s in structs})
    body = ["#define SUMO_EXPERIMENTAL_API", "#include <stddef.h>", "#include <stdio.h>"]
    body += ['#include "%s"' % h for h in headers]
    body.append("int main(void)\n{")
    expected = {}
    for s in structs:
        body.append('    printf("%s %%zu\\n", sizeof(%s));' % (s.__name__, s.__name__))
        expected[s.__name__] = ctypes.sizeof(s)
        for field, _ in s._fields_:
            key = "%s.%s" % (s.__name__, field)
            body.append('    printf("%s %%zu\\n", offsetof(%s, %s));' % (key, s.__name__, field))
            expected[key] = getattr(s, field).offset
    body.append("    return 0;\n}")
    src, exe = tmp_path / "layouts.c", tmp_path / "layouts"
    src.write_text("\n".join(body) + "\n")
    subprocess.run(["cc", "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o",
                    str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    # (the header's, the mirror's) for each size or offset that differs
    assert {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v} == {}
