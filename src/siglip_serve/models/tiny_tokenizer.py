"""Build a small SigLIP-shaped tokenizer directory, for tiny-siglip and for tests (no hub here).

It has the layout of a real SigLIP repository on the Hugging Face hub (e.g. timm/ViT-SO400M-14-SigLIP-384):
`tokenizer.json` + `tokenizer_config.json` (loaded by transformers' AutoTokenizer) and
`open_clip_config.json` (so `open_clip.get_tokenizer("local-dir:<dir>")` loads it too). Like SigLIP's
T5 sentencepiece vocabulary it ends every text with `</s>` (id 1) and pads with `</s>`; unlike it,
words are whole-word entries (WordLevel), unknown words map to `<unk>`.

The bundled models/configs/tiny-siglip-tokenizer/ was written by
`python -m siglip_serve.models.tiny_tokenizer models/configs/tiny-siglip-tokenizer` (words: SEED_WORDS, then the
most frequent words of README.md and docs/*.md at that time); tiny-siglip2-tokenizer/ by the same with
`tiny-siglip2` after the directory: Gemma's special tokens (<pad> 0, <eos> 1, <bos> 2, <unk> 3), each
text wrapped in <bos> ... <eos>, as SigLIP 2's tokenizer lays them out.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIALS = ("<pad>", "</s>", "<unk>")
EOS_ID = 1
# SigLIP 2's Gemma vocabulary starts <pad>, <eos>, <bos>, <unk>; its texts start with <bos>.
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")


@dataclass(frozen=True)
class Layout:
    """Special tokens and the template each text is wrapped in, as the real tokenizer does."""

    model: str
    specials: tuple[str, ...]
    template: str
    pad: str
    eos: str
    bos: str | None


SIGLIP = Layout("tiny-siglip", SPECIALS, "$A </s>", pad="</s>", eos="</s>", bos=None)
SIGLIP2 = Layout("tiny-siglip2", GEMMA_SPECIALS, "<bos> $A <eos>", pad="<pad>", eos="<eos>", bos="<bos>")
LAYOUTS = {layout.model: layout for layout in (SIGLIP, SIGLIP2)}

# Words tests and examples use as labels and prompts, so they are never <unk>.
SEED_WORDS = (
    "a", "an", "the", "photo", "picture", "of", "cat", "dog", "bird", "car", "plane", "ship", "rocket",
    "person", "astronaut", "coffee", "cup", "tree", "house", "flower", "food", "red", "green", "blue",
    "black", "white", "small", "large", "and", "with", "in", "on", "is", "this", "that", "it",
)


def tiny_model_cfg(context_length: int, model: str = "tiny-siglip") -> dict[str, Any]:
    """A tiny model's open_clip config as a local-dir repository carries it."""
    cfg = json.loads((Path(__file__).parent / "configs" / f"{model}.json").read_text())
    cfg["text_cfg"]["context_length"] = context_length
    # Any non-empty name makes open_clip use HFTokenizer; with local-dir it reads this directory.
    cfg["text_cfg"]["hf_tokenizer_name"] = "local"
    cfg["text_cfg"]["tokenizer_kwargs"] = {"clean": "canonicalize"}
    return cfg


def build_tokenizer(directory: Path, words: Sequence[str], context_length: int = 16,
                    model_cfg: dict[str, Any] | None = None, layout: Layout = SIGLIP) -> Path:
    """Write a WordLevel tokenizer of the layout's specials + `words` (deduplicated, in order) into `directory`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(layout.specials)}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    used = [token for token in (layout.bos, layout.eos) if token is not None]
    tokenizer.post_processor = processors.TemplateProcessing(single=layout.template,
                                                             special_tokens=[(t, vocab[t]) for t in used])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=layout.pad, eos_token=layout.eos,
                                   unk_token="<unk>", model_max_length=context_length,
                                   **({"bos_token": layout.bos} if layout.bos else {}))
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    # transformers 5 names the class TokenizersBackend; the older name loads in 4.x and 5.x alike.
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    config = {"model_cfg": model_cfg or tiny_model_cfg(context_length, layout.model),
              "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}
    (directory / "open_clip_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def corpus_words(paths: Iterable[Path], limit: int) -> list[str]:
    counts: Counter[str] = Counter()
    for path in paths:
        counts.update(re.findall(r"[a-z]+", path.read_text(errors="ignore").lower()))
    words = list(SEED_WORDS)
    words += [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if w not in SEED_WORDS]
    return words[:limit]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2) or (len(args) == 2 and args[1] not in LAYOUTS):
        print(f"usage: python -m siglip_serve.models.tiny_tokenizer OUTPUT_DIR [{' | '.join(LAYOUTS)}]",
              file=sys.stderr)
        return 2
    layout = LAYOUTS[args[1] if len(args) == 2 else SIGLIP.model]
    root = Path(__file__).resolve().parent.parent
    cfg = tiny_model_cfg(16, layout.model)
    vocab_size = int(cfg["text_cfg"]["vocab_size"])
    words = corpus_words([root / "README.md", *sorted((root / "docs").glob("*.md"))], vocab_size - len(layout.specials))
    print(build_tokenizer(Path(args[0]), words, 16, cfg, layout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
