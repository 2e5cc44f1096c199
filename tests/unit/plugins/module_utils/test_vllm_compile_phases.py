"""The compile phases of a vLLM start (torch.compile, CUDA graph capture) read from public logs of GPU starts
(tests/unit/fixtures/vllm_logs/SOURCES.md), the stall limit that judges them, and how the play words them."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest

from ansible_collections.gpulab.vllm.plugins.action import vllm_health as action
from ansible_collections.gpulab.vllm.plugins.module_utils import _vllm_probe
from ansible_collections.gpulab.vllm.plugins.plugin_utils import _progress

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_logs"


def public_log(name):
    return (LOGS / name).read_text()


def stages_as_it_grows(text):
    """Each stage and its detail as the log grows line by line, repeats left out."""
    lines = text.splitlines()
    seen = []
    for count in range(1, len(lines) + 1):
        load = _vllm_probe.load_progress("\n".join(lines[:count]))
        step = (load["stage"], load["detail"])
        if not seen or seen[-1] != step:
            seen.append(step)
    return seen


def test_a_first_compile_and_capture_say_what_vllm_compiles_then_captures():
    seen = stages_as_it_grows(public_log("public_lmcache_pr1740_compile_and_capture.log"))
    assert seen[:5] == [
        ("compiling", "torch.compile, cache /home/tensormesh/.cache/vllm/torch_compile_cache/979e353c2e/rank_0_0/backbone"),
        ("compiling", "torch.compile, Dynamo transform took 6.98 s"),
        ("compiling", "torch.compile, compiling the graph for dynamic shape"),
        ("compiling", "torch.compile, compiled the graph for dynamic shape in 16.87 s"),
        ("compiling", "torch.compile took 23.86 s in total"),
    ]
    assert [stage for stage, _detail in seen[5:]] == ["memory profiling"] * 2 + ["graph capture"] * 2
    assert seen[-2:] == [("graph capture", "capturing CUDA graphs (mixed prefill-decode, PIECEWISE), 67 of 67"),
                         ("graph capture", "CUDA graphs captured in 3 s, 0.77 GiB")]


def test_a_compile_from_the_cache_and_the_later_wording_of_the_total():
    load = _vllm_probe.load_progress(public_log("public_vllm_pr46389_compile_from_cache.log"))
    # 'torch.compile took' (the later releases' word) ends the phase as 'takes' did; the AOT lines after it add nothing.
    assert (load["stage"], load["detail"]) == ("compiling", "torch.compile took 14.85 s in total")
    lines = public_log("public_vllm_pr46389_compile_from_cache.log").splitlines()
    assert _vllm_probe.load_progress(lines[0])["stage"] == "starting"
    assert _vllm_probe.load_progress("\n".join(lines[:4]))["detail"] == (
        "torch.compile, loaded the graphs for compile range (1, 8192) from the cache in 5.684 s")


def test_a_capture_that_waits_at_its_first_graph_is_named_with_its_count():
    load = _vllm_probe.load_progress(public_log("public_vllm_kunlun_pr329_capture_waiting.log"))
    assert (load["stage"], load["detail"]) == ("graph capture",
                                               "capturing CUDA graphs (mixed prefill-decode, PIECEWISE), 0 of 4")
    assert _vllm_probe.load_words(load) == "compiling (capturing CUDA graphs (mixed prefill-decode, PIECEWISE), 0 of 4)"
    compiled = _vllm_probe.load_progress("\n".join(public_log("public_vllm_kunlun_pr329_capture_waiting.log").splitlines()[:2]))
    assert _vllm_probe.load_words(compiled) == "compiling (torch.compile, compiled the graph for compile range (1, 132096) in 14.64 s)"


@pytest.mark.parametrize("name", sorted(path.name for path in LOGS.glob("*.log")))
def test_the_words_of_a_compile_phase_hold_no_colon(name):
    """The stall message quotes them as 'stage S: ...': a colon inside would end S early."""
    words = [detail for stage, detail in stages_as_it_grows(public_log(name)) if stage in _vllm_probe.COMPILE_STAGES]
    assert words and all(":" not in detail for detail in words), words


def test_the_lab_start_never_compiles_and_keeps_its_words():
    """The lab's own recorded start (eager, on CPU): torch.compile is named in its 'disabling' warning, which is no
    compile phase."""
    from conftest import load_fixture

    log = load_fixture("vllm", "vllm_start_log")["log"]
    assert "disabling torch.compile" in log
    stages = {stage for stage, _detail in stages_as_it_grows(log)}
    assert not stages & set(_vllm_probe.COMPILE_STAGES)
    assert _vllm_probe.load_words({"stage": "weights", "detail": "shard 3 of 25"}) == "weights (shard 3 of 25)"
    assert _vllm_probe.load_words({"stage": "memory profiling", "detail": "x"}) == "memory profiling"


@pytest.mark.parametrize("stage, first_start, expected", [
    ("compiling", True, (1800.0, "first_start_stall_timeout")),
    ("graph capture", True, (1800.0, "first_start_stall_timeout")),
    ("compiling", False, (600.0, "stall_timeout")),
    ("graph capture", None, (600.0, "stall_timeout")),
    ("weights", True, (600.0, "stall_timeout")),
    ("memory profiling", True, (600.0, "stall_timeout")),
    ("starting", True, (600.0, "stall_timeout")),
])
def test_the_first_start_gets_the_longer_limit_only_while_vllm_compiles(stage, first_start, expected):
    limit = _vllm_probe.stall_limit(stage, first_start, "600", "1800")
    assert (limit["seconds"], limit["option"]) == expected


def test_the_first_start_limit_never_shortens_and_zero_judges_no_stall():
    assert _vllm_probe.stall_limit("compiling", True, 600, 300) == {"seconds": 600.0, "option": "stall_timeout"}
    assert _vllm_probe.stall_limit("compiling", True, 600, 0)["seconds"] == 600.0
    assert _vllm_probe.stall_limit("compiling", True, 0, 1800)["seconds"] == 0.0


def test_the_proven_images_file_lists_each_image_once():
    text = _vllm_probe.proven_images_text(["sha256:aaa", "sha256:bbb"])
    assert _vllm_probe.proven_images(text) == ["sha256:aaa", "sha256:bbb"]
    assert _vllm_probe.proven_images(text + "sha256:aaa\n\n") == ["sha256:aaa", "sha256:bbb"]
    assert _vllm_probe.proven_images("") == []


def _unhealthy(log_name, count, first_start):
    lines = public_log(log_name).splitlines()
    return {"failed": True, "failed_stage": "unreachable", "first_start": first_start, "image_id": "sha256:0f5c",
            "last_log_line": lines[count - 1], "load": _vllm_probe.load_progress("\n".join(lines[:count])),
            "msg": "vLLM at http://127.0.0.1:8000: stage unreachable: GET http://127.0.0.1:8000/health got no answer"}


ARGS = {"stall_timeout": "600", "first_start_stall_timeout": "1800"}


def test_the_progress_line_says_compiling_with_what_vllm_compiles():
    result = _unhealthy("public_lmcache_pr1740_compile_and_capture.log", 3, True)
    assert action._progress(result).startswith(
        "loading: compiling (torch.compile, compiling the graph for dynamic shape); not answering yet (unreachable: ")


def test_a_stalled_first_compile_names_the_phase_and_the_first_start_limit():
    result = _unhealthy("public_vllm_kunlun_pr329_capture_waiting.log", 8, True)
    assert action._limit(result, ARGS) == {"seconds": 1800.0, "option": "first_start_stall_timeout"}
    said = action._stalled(result, 1805, "gpulab-vllm", ARGS)
    assert said.startswith("vLLM's start stalled at stage compiling (capturing CUDA graphs (mixed prefill-decode, "
                           "PIECEWISE), 0 of 4): nothing new from the server for 1805 s (first_start_stall_timeout); ")
    assert "the limit was 1800 s, the first start's limit while vLLM compiles: image sha256:0f5c has not answered" in said
    assert said.endswith("raise first_start_stall_timeout, vllm_server_first_start_stall_timeout in the vllm_server "
                         "role if this stage is this slow for this model")


def test_a_stalled_later_compile_says_the_image_has_answered_before_and_keeps_the_stall_limit():
    result = _unhealthy("public_lmcache_pr1740_compile_and_capture.log", 3, False)
    said = action._stalled(result, 601, "gpulab-vllm", ARGS)
    assert "nothing new from the server for 601 s (stall_timeout); " in said
    assert "the limit was 600 s, the limit of every stage: image sha256:0f5c has answered a completion on this node" in said
    assert said.endswith("raise stall_timeout, vllm_server_stall_timeout in the vllm_server role if this stage is "
                         "this slow for this model")


def test_a_stall_outside_the_compile_phases_keeps_the_stall_limit_on_a_first_start():
    from conftest import load_fixture

    lines = load_fixture("vllm", "vllm_start_log")["log"].splitlines()
    upto = next(i for i, line in enumerate(lines) if "Loading safetensors checkpoint shards:   0%" in line)
    result = {"failed": True, "failed_stage": "unreachable", "first_start": True, "image_id": "sha256:0f5c",
              "last_log_line": lines[upto], "load": _vllm_probe.load_progress("\n".join(lines[:upto + 1]))}
    assert action._limit(result, ARGS)["option"] == "stall_timeout"
    assert "(stall_timeout); " in action._stalled(result, 600, "gpulab-vllm", ARGS)


class _SliceClock(object):
    """The controller's clock for the slice loop: each module call takes the slice it was given."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


@pytest.mark.parametrize("first_start, limit, option", [
    (True, 1800, "first_start_stall_timeout"),
    (False, 600, "stall_timeout"),
])
def test_the_action_stops_a_silent_compile_at_the_limit_that_applies(first_start, limit, option):
    """The action plugin's own run(), its slices on a clock that moves by each slice: a start whose log stays at one
    capture line is stopped once the limit that applies has passed, not before."""
    clock = _SliceClock()
    found = _unhealthy("public_vllm_kunlun_pr329_capture_waiting.log", 8, first_start)
    calls = []

    def execute_module(module_name, module_args, task_vars):
        calls.append(module_args["wait_timeout"])
        clock.now += module_args["wait_timeout"]
        return dict(found)

    task = mock.MagicMock(args=dict(ARGS, wait=True, wait_timeout=3600, progress_interval=30, container="gpulab-vllm"),
                          resolved_action="gpulab.vllm.vllm_health", action="gpulab.vllm.vllm_health", async_val=0)
    plugin = action.ActionModule(task, mock.MagicMock(), mock.MagicMock(), loader=None, templar=None,
                                 shared_loader_obj=None)
    with mock.patch.object(_progress, "time", clock), mock.patch.object(_progress.display, "display"), \
            mock.patch.object(action.ActionBase, "run", return_value={}), \
            mock.patch.object(plugin, "_execute_module", side_effect=execute_module):
        result = plugin.run(task_vars={"inventory_hostname": "node1"})
    assert result["stalled"] is True
    # The first slice saw the line; the limit counts from there, and the loop stops at the first slice past it.
    assert clock.now == 30 + limit and len(calls) == 1 + limit // 30
    assert "nothing new from the server for %d s (%s)" % (limit, option) in result["msg"]
