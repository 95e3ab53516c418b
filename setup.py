"""The optional C extensions (everything else is in pyproject.toml).

Each is optional: without a C compiler the package installs without it and the
Python code it speeds up runs instead (each module says which it uses).

* ``dlcp.proto._kernels``: the data path's row copies, header byte swaps and
  magnitude sampling (``dlcp/proto/kernels.py`` falls back to numpy);
* ``dlcp.io._udpio``: the endpoint's UDP receive loop (``dlcp/io/udp.py``) and its
  native receive path, which verifies authenticated datagrams' tags when
  libcrypto is there;
* ``dlcp.io._engine``: the native send engine, pacing and sending in a thread of
  its own without the GIL (``dlcp/io/engine.py``); it tags authenticated
  datagrams as it sends them when OpenSSL's libcrypto is there;
* ``dlcp.proto._gmac``: AES-GMAC tagging and verifying of whole runs of records
  (``dlcp/proto/auth.py``), only with libcrypto.

Whether libcrypto is there is probed by compiling and linking a small program
against ``openssl/evp.h`` and ``-lcrypto``; without it the build says so, skips
``_gmac`` and builds ``_engine`` without tagging (``auto`` then picks the Python
engine for an authenticating job, which tags with ``cryptography``'s AES-GCM) and
``_udpio`` without verifying (an authenticating job's runs are then verified in
Python).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from setuptools import Extension, setup
from setuptools._distutils.ccompiler import new_compiler
from setuptools._distutils.errors import CCompilerError, DistutilsError
from setuptools._distutils.sysconfig import customize_compiler

_PROBE = """
#include <openssl/evp.h>
int main(void) { EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new(); EVP_CIPHER_CTX_free(c);
                 return EVP_aes_256_gcm() == 0; }
"""


def have_libcrypto() -> bool:
    """Whether a program using libcrypto's EVP interface compiles and links here."""
    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as f:
            f.write(_PROBE)
        try:
            objects = compiler.compile([source], output_dir=tmp)
            compiler.link_executable(objects, os.path.join(tmp, "probe"), libraries=["crypto"])
        except (CCompilerError, DistutilsError, OSError):
            return False
    return True


WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers", "-Wno-cast-function-type"]
crypto = have_libcrypto()
if not crypto:
    print(
        "dlcp: OpenSSL's libcrypto (openssl/evp.h, -lcrypto) was not found: building without "
        "dlcp.proto._gmac and without tagging in dlcp.io._engine; authentication runs on "
        "cryptography's AES-GCM in Python",
        file=sys.stderr,
    )
with_crypto: dict[str, list[Any]] = (
    {"define_macros": [("DLCP_LIBCRYPTO", "1")], "libraries": ["crypto"]} if crypto else {}
)

extensions = [
    Extension("dlcp.proto._kernels", ["dlcp/proto/_kernels.c"],
              depends=["dlcp/proto/_kernels_core.h"], extra_compile_args=["-O2"], optional=True),
    Extension("dlcp.io._udpio", ["dlcp/io/_udpio.c"],
              depends=["dlcp/io/_sendmmsg.h", "dlcp/io/_prefilter.h", "dlcp/io/_recv_runs.h",
                       "dlcp/io/_take_runs.h", "dlcp/io/_linger.h", "dlcp/io/_control_watch.h",
                       "dlcp/io/_control_frames.h", "dlcp/io/_pacer_api.h",
                       "dlcp/proto/_kernels_core.h", "dlcp/proto/gmac.h"],
              extra_compile_args=["-O2"], optional=True, **with_crypto),
    Extension("dlcp.io._engine", ["dlcp/io/_engine.c"],
              depends=["dlcp/io/_sendmmsg.h", "dlcp/io/_round_geometry.h", "dlcp/io/_pacer_api.h",
                       "dlcp/io/_control_writes.h", "dlcp/io/_host_queue.h", "dlcp/proto/gmac.h"],
              extra_compile_args=["-O2", *WARNINGS], extra_link_args=["-lpthread"],
              optional=True, **with_crypto),
]  # fmt: skip
if crypto:
    extensions.append(
        Extension("dlcp.proto._gmac", ["dlcp/proto/_gmac.c"], depends=["dlcp/proto/gmac.h"],
                  extra_compile_args=["-O2", *WARNINGS], optional=True, **with_crypto)
    )  # fmt: skip

setup(ext_modules=extensions)
