"""Make a tiny random Llama model and a byte-level BPE tokenizer for the lab.

The lab cannot download weights, so it serves a model with the shape of a Llama
(two layers, head dimension 64, two heads so tensor parallelism of 2 splits it)
and random weights, and a chat template. Deterministic: the same seed gives the same files.
"""

import sys

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Two machines joined by a fast link serve one model.",
    "Ray starts a head node and workers join it over the fabric.",
    "vLLM answers completions through an OpenAI compatible server.",
    "Hello, my name is gpulab and I deploy language models.",
    "Tensor parallelism splits every layer across the GPUs.",
]
VOCAB_SIZE = 512
# A plain chat template (role, colon, content; one turn a line), so that chat clients work against the lab:
# without one, vLLM refuses every /v1/chat/completions request with 400.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def main(out_dir: str) -> None:
    torch.manual_seed(1234)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        SENTENCES * 50,
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


if __name__ == "__main__":
    main(sys.argv[1])
