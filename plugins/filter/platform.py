# Copyright: gpulab.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the image's platform: can a node's Docker daemon run the image, judged from the node read
(gpulab.vllm.node_facts: the daemon's platform, the node's copy of the image, the registry's answer) before
anything is pulled, or from the pulled image's inspection right after the pull."""

from __future__ import annotations

# What BuildKit names the entries of an image index that are no image (attestations): they run nowhere.
_UNKNOWN = ("", "unknown")


def _label(platform: dict) -> str:
    """linux/arm64/v8, as docker writes a platform."""
    return "/".join(part for part in (platform.get("os"), platform.get("architecture"), platform.get("variant")) if part)


def _images(platforms) -> list:
    return [p for p in platforms or [] if isinstance(p, dict)
            and (p.get("os") or "") not in _UNKNOWN and (p.get("architecture") or "") not in _UNKNOWN]


def runs_on(platform: dict, node: dict) -> bool:
    """Whether an image built for platform runs on a node whose Docker daemon pulls for node.

    The OS and the architecture must be the node's. The variant is not compared: the daemon's platform carries
    none (an arm64 image is v8, an amd64 one runs on any x86-64), and for 32-bit arm the daemon picks among the
    variants of an index by the CPU, which the Engine API does not say."""
    return (platform.get("os"), platform.get("architecture")) == (node.get("os"), node.get("architecture"))


def _fix(node_label: str, architecture: str) -> str:
    return f"use a multi-arch tag (one whose image index lists {node_label}) or the image's {architecture} build"


def platform_problem(node: dict, ref: str, host: str, pulled: dict | None = None) -> str:
    """Empty when the node can run ref as far as its read tells, else one line that says which node, its
    platform, the image's platforms and how to fix it.

    node is the node's read (gpulab_node). Without pulled, the registry's answer decides when the registry
    was asked and listed platforms (what a pull would fetch); else the node's copy of the image, when it has
    one; else a registry error, in the registry's words, refuses the node (it could not pull either). With
    pulled (the inspection of the image a pull just put on the node), that image decides."""
    node = node or {}
    want = node.get("platform") or {}
    if not want.get("architecture"):
        return ""
    node_label = _label(want)
    fix = _fix(node_label, want["architecture"])
    if pulled:
        got = {"os": pulled.get("Os"), "architecture": pulled.get("Architecture"), "variant": pulled.get("Variant")}
        if not got["architecture"] or runs_on(got, want):
            return ""
        return f"{host} ({node_label}) cannot run {ref}: the image pulled is for {_label(got)}; {fix}"
    image = (node.get("images") or {}).get(ref) or {}
    registry = image.get("registry") or {}
    listed = _images(registry.get("platforms"))
    if listed:
        if any(runs_on(platform, want) for platform in listed):
            return ""
        return (f"{host} ({node_label}) cannot run {ref}: the registry has it for {', '.join(_label(p) for p in listed)} "
                f"only; {fix}")
    if image.get("present"):
        if not image.get("architecture") or runs_on(image, want):
            return ""
        return (f"{host} ({node_label}) cannot run {ref}: the node's copy is for {_label(image)}; remove it "
                f"(docker image rm {ref}) and {fix}")
    if registry.get("error"):
        return (f"{host} cannot pull {ref}: {registry['error']}; check that the registry has this tag (or digest), "
                f"that the node can reach the registry, and its credentials")
    return ""


class FilterModule:
    def filters(self):
        return {"platform_problem": platform_problem}
