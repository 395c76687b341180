"""A chat-capable tiny model for the agent example, offline: the CPU kit's random-weight
Llama (llama-3-8b at 1/16: ``config.json``, no weights) with a word-level tokenizer and a chat
template, the recipe ``tests/scepsy_opt/test_agent_e2e.py`` serves. Prints the ``vllm serve`` command.

    python examples/agent/tiny_chat_model.py [FOLDER]     # default: tiny-chat-model

Run it with scepsy's interpreter; the tokenizer is written by vLLM's environment (``scepsy
profile install-vllm``; ``SCEPSY_VLLM_PYTHON`` names another), which has ``tokenizers`` and
``transformers``. The answers are random words: the point is the calls, tokens and timing.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

TOKENIZER_SCRIPT = r'''
"""Write a word-level tokenizer with a chat template into argv[1] (vocab argv[2] ids)."""
import json
import re
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast

folder, vocab_size = Path(sys.argv[1]), int(sys.argv[2])
special = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
letters = "abcdefghijklmnopqrstuvwxyz"

def word(i):
    out = ""
    i += 26
    while i:
        i, r = divmod(i, 26)
        out = letters[r] + out
    return out

vocab = {t: i for i, t in enumerate(special)}
for i in range(len(special), vocab_size):
    vocab[word(i)] = i
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>", pad_token="<pad>",
                               additional_special_tokens=special[4:])
fast.chat_template = template
fast.save_pretrained(str(folder))
(folder / "chat_template.jinja").write_text(template)
print(json.dumps({"vocab": len(vocab)}))
'''


SERVED = ("tiny-planner", "tiny-writer")


def make(folder: Path) -> list[str]:
    """Write the model folder; the command that serves it on one CPU core."""
    from scepsy_profile.profiling.engine_env import vllm_python, write_model_dir
    from scepsy_profile.profiling.models import engine_model

    python = str(vllm_python().path)
    model = engine_model("llama-3-8b", 1 / 16)
    model_dir = write_model_dir(model, folder).resolve()
    subprocess.run([python, "-c", TOKENIZER_SCRIPT, str(model_dir), str(model.vocab)],
                   check=True, capture_output=True, timeout=300)
    # vLLM's CPU build dies at start-up without VLLM_CPU_KVCACHE_SPACE (GiB of KV cache)
    return ["env", "VLLM_CPU_KVCACHE_SPACE=1", python, "-m",
            "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", *SERVED, "--load-format", "dummy", "--enforce-eager",
            "--dtype", model.dtype, "--max-model-len", "512", "--max-num-seqs", "8",
            "--chat-template", str(model_dir / "chat_template.jinja"),
            "--host", "127.0.0.1", "--port", "8000"]


if __name__ == "__main__":
    cmd = make(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-chat-model"))
    print(shlex.join(cmd))
