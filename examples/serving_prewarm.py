"""Serving start-up: build every kernel a model can need before traffic arrives, then run with
the JIT switched off so a missing kernel is a loud error, never a compile on the hot path.

    python examples/serving_prewarm.py --arch sm_90a      # works without a GPU

In a container build, run `kernelgen prewarm --profile model.json` and bake the cache directory
into the image (mount it read-only and list it in KERNELGEN_CACHE_RO); in the server's CI, run
`kernelgen prewarm --profile model.json --check` to fail the build when something is missing.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    profile = {"archs": [args.arch], "families": {"kbit": {"bits": [4], "dtypes": ["float16", "bfloat16"]}}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(profile, f)
    cli = [sys.executable, "-m", "cache_tools"]
    subprocess.run([*cli, "prewarm", "--profile", f.name], check=True)
    subprocess.run([*cli, "prewarm", "--profile", f.name, "--check"], check=True)
    os.environ["KERNELGEN_DISABLE_JIT"] = "1"  # from here on: cache hits only
    print("prewarm complete; the server can start with KERNELGEN_DISABLE_JIT=1")


if __name__ == "__main__":
    main()
