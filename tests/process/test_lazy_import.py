"""`import xbench`, the CLI and plugin discovery must not import a framework."""

import subprocess
import sys

HEAVY = ("jax", "jaxlib", "flax", "optax", "tensorflow", "keras", "torch")


def test_core_imports_no_framework():
    code = (
        "import sys, xbench, xbench.cli.main, xbench.run.compare, xbench.report.pages, xbench.results.diff\n"
        "import xbench.report.export\n"
        "import xbench.run.verification, xbench.run.registry as r\n"
        "list(r.discover().values())\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_core_source_names_no_framework():
    """The core never names a framework; backends live in backends/."""
    from pathlib import Path

    import xbench

    core = Path(xbench.__file__).parent
    for path in core.rglob("*.py"):
        text = path.read_text()
        for name in ("import jax", "import tensorflow", "import torch", "from jax", "from tensorflow"):
            assert name not in text, f"{path} contains {name!r}"
