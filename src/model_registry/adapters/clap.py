"""CLAP through transformers: text and audio towers in one space.

Audio is decoded with soundfile, down-mixed to mono and resampled with soxr to the feature
extractor's rate, in `prepare`. An audio clip costs its mel frames.

The feature extractor crops audio longer than its window at a random offset (`rand_trunc`, and
`fusion` mixes random crops); a server must give the same vector for the same file, so clips are
cut to their first window here, before the extractor sees them; only that window is decoded
and resampled (plus the resampler's margin), never the rest of a long clip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model_registry.adapters.towers import TwoTowerAdapter, features
from model_registry.detection.layout import Layout
from model_registry.media.decoding import decode_audio, processing
from model_registry.types import Capability, Kind, Media, Modality, Prepared


class ClapAdapter(TwoTowerAdapter):
    kind = Kind.AUDIO_TEXT
    capabilities = frozenset({Capability.EMBED_TEXT, Capability.EMBED_AUDIO})
    modality = Modality.AUDIO
    position_offset = 2  # the text tower is RoBERTa: positions start after the padding index

    def __init__(self, layout: Layout, trust_remote_code: bool = False) -> None:
        super().__init__(layout, trust_remote_code)
        self.extractor: Any = None
        self.window = 0
        self.frames = 1

    def load_parts(self, directory: str) -> None:
        from transformers import ClapFeatureExtractor

        self.extractor = ClapFeatureExtractor.from_pretrained(directory)
        self.window = int(self.extractor.nb_max_samples)
        self.frames = self.window // int(self.extractor.hop_length) + 1

    def unload(self) -> None:
        self.extractor = None
        super().unload()

    def prepare_media(self, media: Media, index: int) -> tuple[Any, int]:
        rate = int(self.extractor.sampling_rate)
        samples = decode_audio(media.data, index, rate, self.limits, window=self.window)
        with processing(index, "audio"):
            encoded = self.extractor(samples, sampling_rate=rate, return_tensors="np")
        inputs = {key: np.ascontiguousarray(encoded[key][0]) for key in ("input_features", "is_longer")}
        return inputs, self.frames

    def collate_media(self, items: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        mels = torch.from_numpy(np.stack([p.data["input_features"] for p in items])).to(self.dtype)
        longer = torch.from_numpy(np.stack([p.data["is_longer"] for p in items]))
        return {"input_features": mels, "is_longer": longer}

    def media_features(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return features(self.model.get_audio_features(**tensors))
