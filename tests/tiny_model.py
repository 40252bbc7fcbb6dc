"""A tiny random-weight Llama with SmolLM2's tokenizer: vLLM loads it in seconds, for tests of the real engine's plumbing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def make_tiny_llama(out: Path, chat_template: str | None = None) -> Path:
    """Save the model into `out` (two layers, 128 wide, bfloat16); `chat_template` replaces the tokenizer's."""
    from mentor.pipeline.models import ensure_embedded_model

    tokenizer_src = ensure_embedded_model()
    code = textwrap.dedent(f"""
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
        tok = AutoTokenizer.from_pretrained({str(tokenizer_src)!r})
        template = {chat_template!r}
        if template is not None:
            tok.chat_template = template
        cfg = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained({str(out)!r})
        tok.save_pretrained({str(out)!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    return out


def make_trainable_llama(out: Path) -> Path:
    """A 2-layer random Llama in float32 with the embedded SmolLM2's tokenizer and chat template: real shapes,
    seconds per training step (TRL's and verl's trainers on CPU). Built in this process."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from mentor.pipeline.models import ensure_embedded_model

    tok = AutoTokenizer.from_pretrained(str(ensure_embedded_model()))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
