"""Tiny random multimodal models (CLIP, open_clip, CLAP, ColPali), saved like the real thing."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tests.builders.text import CORPUS

if TYPE_CHECKING:
    from PIL import Image


def clip_tokenizer(max_length: int = 32) -> PreTrainedTokenizerFast:
    """A byte-level BPE with CLIP's start and end tokens around every text."""
    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|startoftext|>", "<|endoftext|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        end_of_word_suffix="</w>",
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        model_max_length=max_length,
    )


def tiny_clip(root: Path, *, seed: int = 0) -> Path:
    """CLIPModel (hidden 32, 2 layers) with a 32 px image processor and ViT patch 8."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(seed)
    tokenizer = clip_tokenizer()
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    CLIPModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root)
    return root


OPEN_CLIP_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def tiny_open_clip(root: Path, *, seed: int = 0) -> Path:
    """An open_clip ViT in the hub layout: open_clip_config.json + open_clip_model.safetensors."""
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = open_clip.CLIP(**OPEN_CLIP_CONFIG)
    root.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "open_clip_model.safetensors"))
    preprocess = {"mean": [0.48, 0.46, 0.41], "std": [0.27, 0.26, 0.28], "interpolation": "bicubic"}
    config = {"model_cfg": OPEN_CLIP_CONFIG, "preprocess_cfg": preprocess}
    (root / "open_clip_config.json").write_text(json.dumps(config))
    return root


def tiny_clap(root: Path, *, seed: int = 0) -> Path:
    """ClapModel with a 16-bin, 1-second ClapFeatureExtractor at 48 kHz."""
    from transformers import ClapAudioConfig, ClapConfig, ClapFeatureExtractor, ClapModel, ClapTextConfig

    from tests.builders.text import bpe_tokenizer

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(max_length=32)
    text = ClapTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=40,
        pad_token_id=tokenizer.pad_token_id,
        projection_dim=16,
    )
    audio = ClapAudioConfig(
        num_mel_bins=16,
        spec_size=64,
        window_size=4,
        depths=[1, 1],
        num_attention_heads=[1, 2],
        patch_embeds_hidden_size=16,
        hidden_size=32,
        projection_dim=16,
    )
    config = ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=16)
    ClapModel(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    ClapFeatureExtractor(feature_size=16, max_length_s=1, truncation="rand_trunc").save_pretrained(root)
    return root


def image_bytes(width: int, height: int, *, fmt: str = "PNG", seed: int = 0) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def wav_bytes(seconds: float, *, rate: int = 16000, channels: int = 1, seed: int = 0) -> bytes:
    import soundfile

    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, (int(seconds * rate), channels)).astype(np.float32)
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def gemma_tokenizer() -> object:
    """A character-level Gemma tokenizer (byte fallback for anything else)."""
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    chars = sorted(set("".join(CORPUS).replace(" ", "")) | set("abcdefghijklmnopqrstuvwxyz?:.\n"))
    vocab = {token: i for i, token in enumerate([*specials, "▁", *chars, *(f"<0x{b:02X}>" for b in range(256))])}
    return GemmaTokenizer(vocab=vocab, merges=[])


def tiny_colpali(root: Path, *, seed: int = 0) -> Path:
    """ColPaliForRetrieval on a 2-layer Gemma and a 32 px SigLIP tower (16 image tokens)."""
    from transformers import (
        ColPaliConfig,
        ColPaliForRetrieval,
        ColPaliProcessor,
        GemmaConfig,
        PaliGemmaConfig,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    torch.manual_seed(seed)
    images = SiglipImageProcessor(size={"height": 32, "width": 32})
    images.image_seq_length = 16  # type: ignore[attr-defined]  # read by ColPaliProcessor
    processor = ColPaliProcessor(image_processor=images, tokenizer=gemma_tokenizer())
    tokenizer = processor.tokenizer
    text = GemmaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    vlm = PaliGemmaConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_index=processor.image_token_id,
        projection_dim=32,
        hidden_size=32,
    )
    model = ColPaliForRetrieval(ColPaliConfig(vlm_config=vlm.to_dict(), embedding_dim=16)).eval()
    model.save_pretrained(root)
    processor.save_pretrained(root)
    return root


def tiny_siglip(root: Path, *, seed: int = 0) -> Path:
    """SiglipModel (hidden 32) whose texts are padded to 16 tokens, with a 32 px image processor."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    from tests.builders.text import bpe_tokenizer

    torch.manual_seed(seed)
    tokenizer = bpe_tokenizer(max_length=16)
    common = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    text = {
        **common,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 16,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision = {**common, "image_size": 32, "patch_size": 8}
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root)
    return root


def qwen_tokenizer() -> object:
    """A byte-level Qwen2 tokenizer with no merges and Qwen2-VL's special tokens."""
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,  # type: ignore[arg-type]  # no unknown token: byte-level covers every input
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
    )
    specials = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def tiny_colqwen2(root: Path, *, seed: int = 0, backbone: str = "qwen2_vl") -> Path:
    """ColQwen2ForRetrieval on a 2-layer Qwen2-VL (or, `backbone="qwen2_5_vl"`, Qwen2.5-VL: ColQwen2.5's
    layout); pages up to 56x112 px, so their token counts vary."""
    from transformers import (
        ColQwen2Config,
        ColQwen2ForRetrieval,
        ColQwen2Processor,
        Qwen2_5_VLConfig,
        Qwen2VLConfig,
        Qwen2VLImageProcessor,
    )

    torch.manual_seed(seed)
    tokenizer: Any = qwen_tokenizer()
    images = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 112, patch_size=14, merge_size=2)
    processor = ColQwen2Processor(image_processor=images, tokenizer=tokenizer)
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_parameters": rope,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision: dict[str, Any] = {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}
    vision["patch_size"] = 14
    if backbone == "qwen2_5_vl":  # window attention in all but the last block, an MLP merger
        vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 14}
        vision |= {"out_hidden_size": 32, "window_size": 56, "fullatt_block_indexes": [1]}
    tokens = {
        "image_token_id": "<|image_pad|>",
        "video_token_id": "<|video_pad|>",
        "vision_start_token_id": "<|vision_start|>",
        "vision_end_token_id": "<|vision_end|>",
    }
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in tokens.items()}
    config = Qwen2_5_VLConfig if backbone == "qwen2_5_vl" else Qwen2VLConfig
    vlm = config(text_config=text, vision_config=vision, **ids)
    ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm.to_dict(), embedding_dim=16)).eval().save_pretrained(root)
    processor.save_pretrained(root)
    return root


def one_colour_png(side: int) -> bytes:
    """A huge, single-colour PNG: tiny compressed, `side`² pixels once decoded."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def lying_wav(declared_frames: int, actual_frames: int) -> bytes:
    """A 16-bit mono WAV whose header claims `declared_frames` but holds `actual_frames`."""
    body = np.zeros(actual_frames, dtype="<i2").tobytes()
    size = declared_frames * 2
    header = b"RIFF" + struct.pack("<I", 36 + size) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    return header + fmt + b"data" + struct.pack("<I", size) + body


def strip_png(width: int, height: int) -> bytes:
    """A single-colour strip: a few hundred bytes of PNG, `width` x `height` pixels."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def smooth_image(width: int, height: int) -> Image.Image:
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    channels = [np.sin(x / 17.0) * 120 + 128, np.cos(y / 11.0) * 120 + 128, np.sin((x + y) / 29.0) * 120 + 128]
    return Image.fromarray(np.stack(channels, -1).astype(np.uint8))


def siglip2_tokenizer() -> Any:
    """SigLIP 2's text side: a Gemma tokenizer padding on the right, texts cut to 64 tokens."""
    tokenizer: Any = gemma_tokenizer()
    tokenizer.model_max_length = 64
    # The published tokenizer.json pads on the right to 64; transformers reads its side from there.
    pad = tokenizer.pad_token_id
    tokenizer.backend_tokenizer.enable_padding(direction="right", length=64, pad_id=pad, pad_token="<pad>")
    tokenizer.padding_side = "right"
    return tokenizer


SIGLIP2_TEXT = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


def siglip2_token_ids(tokenizer: Any) -> dict[str, int]:
    ids = tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id
    return dict(zip(("pad_token_id", "bos_token_id", "eos_token_id"), ids, strict=True))


def tiny_siglip2(root: Path, *, seed: int = 0) -> Path:
    """SigLIP 2 at a fixed resolution: a SiglipModel with a Gemma tokenizer (pad to 64), 32 px images."""
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor

    torch.manual_seed(seed)
    tokenizer = siglip2_tokenizer()
    common = {"num_hidden_layers": 2, "num_attention_heads": 2}
    text = {**common, **SIGLIP2_TEXT, "vocab_size": len(tokenizer), **siglip2_token_ids(tokenizer)}
    vision = {**common, "hidden_size": 32, "intermediate_size": 64, "image_size": 32, "patch_size": 8}
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval().save_pretrained(root)
    images = SiglipImageProcessor(size={"height": 32, "width": 32})
    SiglipProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(root)
    return root


def tiny_siglip2_naflex(root: Path, *, seed: int = 0, max_num_patches: int = 24) -> Path:
    """SigLIP 2 NaFlex: a Siglip2Model (8 px patches, a 4x4 position grid) and Siglip2ImageProcessor,
    which resizes an image to at most `max_num_patches` patches at its own aspect ratio."""
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model, Siglip2Processor

    torch.manual_seed(seed)
    tokenizer = siglip2_tokenizer()
    common = {"num_hidden_layers": 2, "num_attention_heads": 2}
    text = {**common, **SIGLIP2_TEXT, "vocab_size": len(tokenizer), **siglip2_token_ids(tokenizer)}
    vision = {**common, "hidden_size": 32, "intermediate_size": 64, "num_patches": 16, "patch_size": 8}
    Siglip2Model(Siglip2Config(text_config=text, vision_config=vision)).eval().save_pretrained(root)
    images = Siglip2ImageProcessor(patch_size=8, max_num_patches=max_num_patches)
    Siglip2Processor(image_processor=images, tokenizer=tokenizer).save_pretrained(root)
    return root


def tiny_colmodernvbert(root: Path, *, seed: int = 0) -> Path:
    """ColModernVBertForRetrieval on a 2-layer ModernBERT and a 64 px SigLIP tower, 4 tokens per image
    after the pixel shuffle; pages up to 128 px on their longest side, split into 64 px tiles and a
    global image (Idefics3's image processor), so their token counts vary with their shape."""
    from transformers import (
        ColModernVBertConfig,
        ColModernVBertForRetrieval,
        ColModernVBertProcessor,
        Idefics3ImageProcessor,
        ModernBertConfig,
        ModernVBertConfig,
        SiglipVisionConfig,
    )

    torch.manual_seed(seed)
    tokenizer: Any = qwen_tokenizer()
    tiles = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    marks = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|begin_of_text|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*marks, *tiles]})
    images = Idefics3ImageProcessor(
        size={"longest_edge": 128}, max_image_size={"longest_edge": 64}, do_image_splitting=True
    )
    processor = ColModernVBertProcessor(image_processor=images, tokenizer=tokenizer, image_seq_len=4)
    special = {key: tokenizer.pad_token_id for key in ("bos_token_id", "cls_token_id", "sep_token_id")}
    text = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        **special,
    )
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8
    )
    vlm = ModernVBertConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pixel_shuffle_factor=4,
    )
    model = ColModernVBertForRetrieval(ColModernVBertConfig(vlm_config=vlm.to_dict(), embedding_dim=16)).eval()
    model.save_pretrained(root)
    processor.save_pretrained(root)
    return root
