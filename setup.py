"""Ships ``multihost-install.pth`` into site-packages (everything else is in pyproject.toml).

With ``MULTIHOST_INSTALL=1`` in its environment, a plain ``python`` then runs
``multihost.install()`` at start-up (for launchers whose command line cannot
change); unset, the line only reads ``os.environ`` (``os`` is imported already).
The file goes to the root of the wheel, i.e. of site-packages, for regular
and editable (``pip install -e .``) installs alike.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = 'multihost-install.pth'
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH)


class build_py_with_pth(build_py):
    """`build_py`, plus the start-up hook at the root of the build (the wheel's purelib)."""

    def run(self):
        super().run()
        self.copy_file(SOURCE, self.build_lib)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):
        mapping = dict(super().get_output_mapping())
        mapping[os.path.join(self.build_lib, PTH)] = PTH
        return mapping


class editable_wheel_with_pth(editable_wheel):
    """``pip install -e .``: the editable wheel holds the start-up hook at its root too.

    (An editable wheel installs a finder, not `build_py`'s outputs; what is in
    the unpacked wheel's directory is installed as is.)
    """

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(SOURCE, os.path.join(unpacked_wheel, PTH))
        return result


setup(cmdclass={'build_py': build_py_with_pth, 'editable_wheel': editable_wheel_with_pth})
