"""The sentencepiece Python package, from a venv under ~/.cache/asrforge
(never the repository), for the scripts that train or read sentencepiece
models: scripts/make_spm_fixtures.py and the digits recipe's train_bpe.py."""

import os
import subprocess
import sys
import venv

SPM_VERSION = "0.2.1"
VENV = os.path.expanduser("~/.cache/asrforge/spm-venv")


def ensure_sentencepiece():
    """Returns when sentencepiece imports; otherwise installs it into the
    venv (created once) and re-runs the calling script with its python."""
    try:
        import sentencepiece  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        print(f"creating {VENV} for sentencepiece", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    subprocess.check_call([py, "-m", "pip", "install", "-q", f"sentencepiece=={SPM_VERSION}"])
    os.execv(py, [py] + sys.argv)
