"""A small tokenizer and a tiny checkpoint whose zero-shot answer is forced by construction.

`forced_checkpoint` builds tiny-siglip-checkpoint (tiny-siglip's architecture, which accepts a
checkpoint) so that:
- the image tower ignores its input: the attention pool's projection has zero weights and bias `v`,
  its MLP adds nothing, so every image embeds to normalize(v);
- the text tower pools the mean of its token embeddings: queries and keys are zero (uniform attention),
  values and the output projection are identities, the MLP adds nothing, position embeddings and every
  token but the label words are zero. A prompt holding label word k then embeds along LayerNorm(e_k);
- v = LayerNorm(e_winner), so the winner's cosine is 1 and every other label's is about -0.016.
With logit_scale = log(10) and logit_bias = -5, the winner scores sigmoid(5) ~ 0.993 for ANY image and
the others sigmoid(-5.16) ~ 0.0057.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from models.tiny_tokenizer import SPECIALS, build_tokenizer, tiny_model_cfg

CHECKPOINT_MODEL = "tiny-siglip-checkpoint"
LABEL_WORDS = ("cat", "dog", "car", "tree", "boat")
PROMPT_WORDS = ("a", "photo", "of", "the")
FORCED_SCALE = math.log(10.0)
FORCED_BIAS = -5.0


def small_tokenizer(directory: Path, context_length: int = 16) -> Path:
    cfg = tiny_model_cfg(context_length)
    return build_tokenizer(directory, [*PROMPT_WORDS, *LABEL_WORDS, "rocket", "coffee"], context_length, cfg)


def word_id(word: str) -> int:
    return len(SPECIALS) + [*PROMPT_WORDS, *LABEL_WORDS].index(word)


def forced_checkpoint(path: Path, winner: str) -> Path:
    import open_clip

    from models.loading import _register_tiny

    _register_tiny()
    torch.manual_seed(1)
    model = open_clip.create_model(CHECKPOINT_MODEL, pretrained=None)
    width = model.text.width
    with torch.no_grad():
        text = model.text
        text.positional_embedding.zero_()
        text.token_embedding.weight.zero_()
        for i, word in enumerate(LABEL_WORDS):
            text.token_embedding.weight[word_id(word), i] = 10.0
        for block in text.transformer.resblocks:
            attn = block.attn
            attn.in_proj_weight.zero_()
            attn.in_proj_bias.zero_()
            attn.in_proj_weight[2 * width:] = torch.eye(width)  # V = identity; Q = K = 0: uniform attention
            attn.out_proj.weight.copy_(torch.eye(width))
            attn.out_proj.bias.zero_()
            for norm in (block.ln_1, block.ln_2):
                norm.weight.fill_(1.0)
                norm.bias.zero_()
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
        text.ln_final.weight.fill_(1.0)
        text.ln_final.bias.zero_()
        text.text_projection.weight.copy_(torch.eye(width))
        text.text_projection.bias.zero_()
        # ln_1 of the residual stream feeds V; with identities the pooled row is x_last + mean(LN(x_j)).
        # Computing the winner's text embedding with the model itself keeps v exact.
        ids = torch.full((1, text.context_length), 1, dtype=torch.long)
        ids[0, 0] = word_id(winner)
        target = torch.nn.functional.normalize(text(ids), dim=-1)[0]
        pool = model.visual.trunk.attn_pool
        pool.proj.weight.zero_()
        pool.proj.bias.copy_(target)
        pool.mlp.fc2.weight.zero_()
        pool.mlp.fc2.bias.zero_()
        model.logit_scale.fill_(FORCED_SCALE)
        model.logit_bias.fill_(FORCED_BIAS)
    torch.save(model.state_dict(), path)
    return path
