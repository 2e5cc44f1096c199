"""Stand-in for get-pip.py, the pip bootstrap that ansible-test downloads.

ansible-test fetches get-pip.py from ci-files.testing.ansible.com, which this
workplace cannot reach. tests/sanity.sh puts this file where ansible-test caches
that script; it does the same job with what is here: ensurepip from the Python
standard library, then pip installs the exact versions ansible-test asked for
from the configured package index.
"""

import subprocess
import sys

# get-pip.py options that pip install does not know.
GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
                      + [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY])
