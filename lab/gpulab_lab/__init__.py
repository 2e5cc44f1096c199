# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab in a box: several simulated GPU hosts on one Linux machine (see lab/README.md).

One module per concern: config (parameters), network (bridges, namespaces), nodes (each node's
dockerd and sshd), registry, images, inventory, lifecycle (up, down, status). lab/labctl.py is
the command line.
"""
