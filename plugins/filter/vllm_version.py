# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the least vLLM a deployment needs: the minimum as given (image_min_vllm_version, checked in the image
role's preflight before anything is pulled) and the vLLM the image's contract probe found (roles/image/files/
probe_image.py, judged right after the probe or from the record of an earlier one).

Versions are compared as PEP 440 orders them, on the controller and with the standard library alone: a development
build before its pre-release, a pre-release (a, b, rc) before its release (0.17.0rc1 is older than 0.17), a
post-release after it, and trailing zeros and a local label (0.17.1+cu130, NGC's 0.17.1+a03ca76a.nv26.03.46967107)
change nothing. A version PEP 440 cannot read (0.17.1-custom) is judged by its leading release numbers.
"""

from __future__ import annotations

import re

_PEP440 = re.compile(
    r"""^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_bare>\d+)|[-_.]?(?:post|rev|r)[-_.]?(?P<post_n>\d+)?(?P<post>))?
    (?:[-_.]?(?P<dev>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?
    \s*$""", re.IGNORECASE | re.VERBOSE)
_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")
# Where a pre-release's letters stand: alpha, then beta, then release candidate (c is rc).
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
# Before every pre-release, and after every one (no pre-release at all).
_BEFORE_PRE, _NO_PRE = (-1, 0), (3, 0)


def _release(text: str) -> tuple:
    numbers = [int(part) for part in text.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def parse_version(text):
    """A key that orders versions as PEP 440 does, or None when text holds no version ('unknown', '', None)."""
    if not isinstance(text, str):
        return None
    match = _PEP440.match(text)
    if match is None:
        leading = _RELEASE.match(text)
        return (_release(leading.group(1)), _NO_PRE, -1, (1, 0)) if leading else None
    post = match.group("post_bare") or match.group("post_n")
    has_post = post is not None or match.group("post") is not None
    if match.group("pre"):
        pre = (_PRE_RANK[match.group("pre").lower()], int(match.group("pre_n") or 0))
    elif match.group("dev") and not has_post:
        # 0.17.dev1 comes before 0.17a1.
        pre = _BEFORE_PRE
    else:
        pre = _NO_PRE
    dev = (0, int(match.group("dev_n") or 0)) if match.group("dev") else (1, 0)
    return (_release(match.group("release")), pre, int(post or 0) if has_post else -1, dev)


def vllm_minimum_problems(minimum, host: str, setting: str = "image_min_vllm_version") -> list:
    """The minimum as the inventory or a preset gives it: empty (no minimum) or a version written as a string."""
    if minimum is None or minimum == "":
        return []
    if isinstance(minimum, (int, float)) and not isinstance(minimum, bool):
        return [f"{setting} on {host} is the number {minimum}, which YAML may have shortened (0.10 reads as 0.1); "
                f"write the version in quotes so that it is compared as written"]
    if not isinstance(minimum, str) or parse_version(minimum) is None:
        return [f"{setting} on {host} is {minimum!r}, not a version such as \"0.17\" or \"0.17.1\"; correct it, "
                f"or leave it empty for no minimum"]
    return []


def vllm_version_problem(found, minimum, host: str, image: str, setting: str = "image_min_vllm_version") -> str:
    """Empty when the image's vLLM (found, as the probe read it) is minimum or later, or when there is no minimum
    or no vLLM (whether vLLM must be there is image_require_vllm's rule); else one line: what, where, the fix."""
    wanted = parse_version(minimum) if isinstance(minimum, str) else None
    if wanted is None or found is None:
        return ""
    have = parse_version(found)
    if have is None:
        return (f"{host}: {image} reports its vLLM version as {found!r}, which cannot be compared with {minimum}, the "
                f"least this deployment needs; use an image whose vLLM package declares its version, or set {setting} "
                f"to \"\" to deploy it unchecked")
    if have < wanted:
        return (f"{host}: {image} has vLLM {found}, older than {minimum}, the least this deployment needs; use an image "
                f"whose vLLM is {minimum} or later, or lower {setting} only for a build known to serve the model")
    return ""


class FilterModule:
    def filters(self):
        return {"vllm_minimum_problems": vllm_minimum_problems, "vllm_version_problem": vllm_version_problem}
