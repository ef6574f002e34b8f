"""Map the product's fixed top-level layout (agent/, collectors/, rules/, controller/, lab/) under
the ``skewd`` namespace, so the installed distribution never claims generic top-level names such
as ``rules`` or ``agent`` in a user's site-packages (a vLLM venv, for instance).

Data directories (rule packs, their tests, exporter mappings, fault-lab scenarios) have no
``__init__.py``; they are listed as packages of their own so setuptools ships their files
instead of warning that it "would ignore" them (its namespace-package rule), and each lists its
files in ``DATA``. ``tests/packaging/test_wheel.py`` builds the wheel and runs the CLI from it.
"""
from setuptools import find_packages, setup

LAYOUT = ("agent", "collectors", "rules", "controller", "lab")

#: data-only directories → the files they ship (glob patterns relative to the directory)
DATA = {
    "skewd.rules.packs": ["*.yaml"],
    "skewd.rules.tests": ["*.yaml"],
    "skewd.collectors.exporter.mappings": ["*.yaml"],
    "skewd.lab.sim.scenarios": ["*.yaml"],
}

packages = ["skewd"] + [f"skewd.{p}" for p in find_packages(include=[f"{d}*" for d in LAYOUT])]
packages += [f"skewd.{p}" for p in find_packages(where="skewd")]
packages += sorted(DATA)
package_dir = {"skewd": "skewd", **{f"skewd.{d}": d for d in LAYOUT}}

setup(
    packages=packages,
    package_dir=package_dir,
    package_data=DATA,
    include_package_data=False,
)
