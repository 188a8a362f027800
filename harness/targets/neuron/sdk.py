"""The host's Neuron SDK as a stack venv sees it: link it in as it is, and say what is missing.

Standard library only: it runs as an install step of stacks/neuron.toml, before the harness
is installed in that venv::

    python -m harness.targets.neuron.sdk link     # run by the stack venv's python
    python -m harness.targets.neuron.sdk check    # what this python (or $HIL_PYTHON) can import

The SDK (torch-neuronx, neuronx-distributed-inference, neuronx-cc, libneuronxla) comes only
from AWS's Neuron package repository, as installed on the lab's Neuron hosts (the Neuron DLAMI's
venvs, or a Neuron container's system Python); PyPI's packages of those names are placeholders.
``link`` writes a .pth file into the stack venv listing the SDK interpreter's site-packages, so
the venv uses the SDK's packages without reinstalling any of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# import name -> distribution name
SDK_MODULES = {
    "torch_neuronx": "torch-neuronx",
    "neuronx_distributed_inference": "neuronx-distributed-inference",
    "neuronxcc": "neuronx-cc",
    "libneuronxla": "libneuronxla",
}
SDK_PYTHON_ENV = "HIL_PYTHON"  # the same variable that picks the stack venv's interpreter
PTH_NAME = "_hil_neuron_sdk.pth"
WHERE = (
    "these come only from AWS's Neuron package repository (PyPI's torch-neuronx,"
    " neuronx-distributed-inference and vllm-neuron are placeholders); on a Neuron host run"
    " HIL_PYTHON=<the python of the host's Neuron SDK environment, e.g. a Neuron DLAMI's"
    " /opt/aws_neuronx_venv_*/bin/python> ./setup.sh --stack neuron"
)

_PROBE = (
    "import importlib.util, importlib.metadata as md, json, sys, sysconfig\n"
    "mods = json.loads(sys.argv[1])\n"
    "out = {'python': sys.executable, 'version': '%d.%d' % sys.version_info[:2],\n"
    "       'site': sorted({sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']}),\n"
    "       'found': {}, 'missing': []}\n"
    "for mod, dist in mods.items():\n"
    "    if importlib.util.find_spec(mod) is None:\n"
    "        out['missing'].append(f'{dist} ({mod})')\n"
    "        continue\n"
    "    try:\n"
    "        out['found'][dist] = md.version(dist)\n"
    "    except md.PackageNotFoundError:\n"
    "        out['found'][dist] = '?'\n"
    "print(json.dumps(out))\n"
)


def probe(python: str) -> dict:
    """What ``python`` has of the SDK: found {dist: version}, missing [names], its site dirs."""
    try:
        run = subprocess.run([python, "-c", _PROBE, json.dumps(SDK_MODULES)],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"python": python, "error": f"cannot run {python}: {e}", "found": {},
                "missing": list(SDK_MODULES.values()), "site": []}
    if run.returncode != 0:
        return {"python": python, "error": run.stderr.strip().splitlines()[-1:] or ["failed"],
                "found": {}, "missing": list(SDK_MODULES.values()), "site": []}
    return json.loads(run.stdout)


def describe(python: str | None = None) -> str:
    """One line: the SDK packages ``python`` (default $HIL_PYTHON, else this one) has or lacks."""
    python = python or os.environ.get(SDK_PYTHON_ENV) or sys.executable
    p = probe(python)
    if "error" in p:
        return f"Neuron SDK: {p['error']}; {WHERE}"
    if not p["missing"]:
        found = ", ".join(f"{d} {v}" for d, v in p["found"].items())
        return f"Neuron SDK: {found} (python {p['python']})"
    return f"Neuron SDK: missing {', '.join(p['missing'])} in python {p['python']}; {WHERE}"


def link() -> int:
    """Install step: make the SDK interpreter's packages visible in this venv, then check them."""
    sdk_python = os.environ.get(SDK_PYTHON_ENV)
    if not sdk_python:
        print(f"harness.targets.neuron.sdk: {SDK_PYTHON_ENV} is not set; {WHERE}", file=sys.stderr)
        return 1
    p = probe(sdk_python)
    if "error" in p or p["missing"]:
        print(f"harness.targets.neuron.sdk: {describe(sdk_python)}", file=sys.stderr)
        return 1
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if p["version"] != here:
        print(f"harness.targets.neuron.sdk: the SDK's python is {p['version']}, this venv's is {here};"
              f" create the venv with the SDK's python ({SDK_PYTHON_ENV})", file=sys.stderr)
        return 1
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    own = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    pth.write_text("".join(f"{d}\n" for d in p["site"] if d not in own))
    mine = probe(sys.executable)
    if mine.get("missing"):
        print(f"harness.targets.neuron.sdk: linked {pth}, but this venv still lacks"
              f" {', '.join(mine['missing'])}", file=sys.stderr)
        return 1
    print(f"    linked {', '.join(p['site'])} via {pth.name}:"
          f" {', '.join(f'{d} {v}' for d, v in mine['found'].items())}")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["link"]:
        return link()
    if argv[1:] == ["check"]:
        line = describe()
        print(line)
        return 0 if "missing" not in line and "cannot run" not in line else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
