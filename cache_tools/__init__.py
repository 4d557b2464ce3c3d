"""The `kernelgen` command line: prewarm, cache maintenance, doctor.

    kernelgen prewarm ...      build ahead the configs the selectors can pick (see prewarm.py)
    kernelgen cache SUBCMD     ls, info, show, explain, verify, gc, purge, export, import
    kernelgen doctor           is NVRTC / the CUDA headers / the cache usable here?

Exit codes: 0 ok; 1 something failed or is missing (a build, a --check, a bad entry);
2 usage error (unknown family or arch, bad flag value).
"""

from __future__ import annotations


class UsageError(Exception):
    """A bad command line or input file: reported as `kernelgen: error: ...`, exit code 2."""
