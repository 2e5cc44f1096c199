# gpulab.vllm: lab, demo, tests and benchmarks. Run as root on a Debian 12 machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# PYTHON runs the lab's own scripts (lab-down and lab-status work without .venv).
PYTHON ?= python3
# .venv's Python: ansible-core 2.20 and later need 3.12 or newer on the controller
# (tests/find_python.sh: the newest ~/.pyenv/versions/3.12.*, else a python3.12 on the PATH that runs).
VENV_PYTHON_VERSION := 3.12
VENV_PYTHON ?= $(shell tests/find_python.sh $(VENV_PYTHON_VERSION) 2>/dev/null)
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# Lab parameters (see lab/README.md)
NODES ?= 2
FABRIC_SUBNET ?= 10.220.0.0/24
MGMT_SUBNET ?= 10.210.0.0/24
# Empty: one ConnectX-style name per node, all different (see lab/README.md).
FABRIC_IF ?=
GPUS_PER_NODE ?= 1
UNIFIED_MEMORY_NODES ?= node2
LAB_IMAGES ?= ray vllm
export NODES FABRIC_SUBNET MGMT_SUBNET FABRIC_IF GPUS_PER_NODE UNIFIED_MEMORY_NODES LAB_IMAGES

# pigz: Docker decompresses the layers it pulls with unpigz, on every core, when it finds it.
DEBIAN_PACKAGES := docker.io iptables iputils-ping debootstrap docker-registry openssh-server iproute2 python3-requests shellcheck pigz

.PHONY: help deps venv lab-up lab-down lab-status demo test check bench collection clean

help:
	@echo "make demo        set everything up and deploy the tiny model across the local lab"
	@echo "make test        every stage: lint, sanity, unit, collection, matrix, the lab's tests and molecule scenarios"
	@echo "make check       the quick loop: lint, sanity and unit tests (no lab, no Docker)"
	@echo "make lab-up      bring up the lab (NODES, FABRIC_SUBNET, MGMT_SUBNET, FABRIC_IF, GPUS_PER_NODE, UNIFIED_MEMORY_NODES)"
	@echo "make lab-down    remove the lab"
	@echo "make bench       benchmarks, results in bench/results/"

deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	@lab/ensure-docker.sh

# The stamp names the Python: a .venv made by another one (or by hand) is made again, never upgraded in place.
$(BIN)/.installed-python$(VENV_PYTHON_VERSION): requirements.txt
	@py="$(VENV_PYTHON)"; \
	if [ -z "$$py" ]; then echo "venv: no Python $(VENV_PYTHON_VERSION) (looked for ~/.pyenv/versions/$(VENV_PYTHON_VERSION).*/bin/python$(VENV_PYTHON_VERSION) and python$(VENV_PYTHON_VERSION) on the PATH); install it or set VENV_PYTHON" >&2; exit 1; fi; \
	if [ -e $(VENV) ] && [ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$(VENV_PYTHON_VERSION)" ]; then \
	  echo "venv: $(VENV) was not made by Python $(VENV_PYTHON_VERSION); making it again with $$py"; rm -rf $(VENV); fi; \
	test -x $(BIN)/python || "$$py" -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	@rm -f $(BIN)/.installed*
	@touch $@

# Playbooks run from this checkout resolve gpulab.vllm.* through this link.
build/collections/ansible_collections/gpulab/vllm:
	@mkdir -p build/collections/ansible_collections/gpulab
	@ln -sfn ../../../.. $@

venv: $(BIN)/.installed-python$(VENV_PYTHON_VERSION) build/collections/ansible_collections/gpulab/vllm

lab-up: deps venv
	$(BIN)/python lab/labctl.py up

lab-down:
	@$(PYTHON) lab/labctl.py down

lab-status:
	@$(PYTHON) lab/labctl.py status

demo: lab-up
	$(BIN)/ansible-playbook -i inventories/local_lab playbooks/deploy_qwen35.yml

test: deps venv
	$(BIN)/python tests/run_stages.py

check: venv
	$(BIN)/python tests/run_stages.py lint sanity unit

bench: lab-up
	$(BIN)/python bench/run.py $(BENCH_ARGS)

collection: venv
	$(BIN)/ansible-galaxy collection build --force --output-path build/dist .

clean: lab-down
	rm -rf build $(VENV)
