"""Map the product's fixed top-level layout (agent/, collectors/, rules/, controller/) under the
``skewd`` namespace, so the installed distribution never claims generic top-level names such as
``rules`` or ``agent`` in a user's site-packages (a vLLM venv, for instance)."""
from setuptools import find_packages, setup

LAYOUT = ("agent", "collectors", "rules", "controller", "lab")

packages = ["skewd"] + [f"skewd.{p}" for p in find_packages(include=[f"{d}*" for d in LAYOUT])]
packages += [f"skewd.{p}" for p in find_packages(where="skewd")]
package_dir = {"skewd": "skewd", **{f"skewd.{d}": d for d in LAYOUT}}

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"skewd.rules": ["packs/*.yaml", "tests/*.yaml"],
                  "skewd.collectors": ["*/*.yaml", "*/*.csv", "exporter/mappings/*.yaml"],
                  "skewd.lab": ["sim/scenarios/*.yaml"]},
    include_package_data=True,
)
